"""How `stoker run` prints the rank-0 lines it follows: on a terminal, the progress
lines (`[0] step 40/300 loss ...`) replace each other on one live line at the bottom,
and every other line scrolls above it; off a terminal (a pipe, a log file) every line
is printed as it came."""

from __future__ import annotations

import re
from typing import TextIO

# The runtime's progress line (stoker/runtime/observe/progress.py), with the follower's prefix.
_PROGRESS = re.compile(r"^\[\d+\] step \d+/\d+ ")
_CLEAR = "\r\x1b[K"  # back to the line's start, erase to its end


class LiveEcho:
    """A callable taking one followed line at a time; `close()` when following ends."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self._progress: str | None = None  # the progress line on screen, not yet ended

    def __call__(self, line: str) -> None:
        if self.live and _PROGRESS.match(line):
            self.stream.write(_CLEAR + line)
            self._progress = line
        elif self._progress is not None:
            # The other line takes the live line's place; the live line comes back below.
            self.stream.write(f"{_CLEAR}{line}\n{self._progress}")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the live line, so that what follows starts on a line of its own."""
        if self._progress is not None:
            self.stream.write("\n")
            self.stream.flush()
            self._progress = None
