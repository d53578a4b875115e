"""`stoker run` on a terminal: rank 0's progress lines share one live line."""

from __future__ import annotations

import io

from stoker.cli.live_echo import LiveEcho


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


LINES = [
    "[0] train.precision=auto: fp32",
    "[0] step 10/30 loss 0.9000",
    "[0] step 20/30 loss 0.8000",
    "[0] saved step-20",
    "[0] step 30/30 loss 0.7000",
]


def test_progress_lines_replace_each_other_on_a_terminal() -> None:
    screen = Terminal()
    echo = LiveEcho(screen)
    for line in LINES:
        echo(line)
    echo.close()
    text = screen.getvalue()
    assert text == (
        "[0] train.precision=auto: fp32\n"
        "\r\x1b[K[0] step 10/30 loss 0.9000"
        "\r\x1b[K[0] step 20/30 loss 0.8000"
        "\r\x1b[K[0] saved step-20\n[0] step 20/30 loss 0.8000"  # the live line comes back
        "\r\x1b[K[0] step 30/30 loss 0.7000"
        "\n"
    )
    # What a terminal shows at the end: each line once, the progress line last.
    shown = [part.rsplit("\r\x1b[K", 1)[-1] for part in text.split("\n") if part]
    assert shown == [LINES[0], LINES[3], LINES[4]]


def test_every_line_as_it_came_off_a_terminal() -> None:
    log = io.StringIO()
    echo = LiveEcho(log)
    for line in LINES:
        echo(line)
    echo.close()
    assert log.getvalue() == "".join(line + "\n" for line in LINES)
