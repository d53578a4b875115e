"""The `stoker` console entry point. A help it has printed before (the same words, code
and terminal width) and `--version` are printed without importing typer or any command
(stoker/cli/help_cache.py); everything else runs the typer app of stoker/cli/app.py."""

from __future__ import annotations

import sys


def main() -> None:
    """`stoker ...` as the console script, `python -m stoker` and tests/clirun.py run it."""
    argv = sys.argv[1:]
    if argv in (["--version"], ["-V"]):
        from stoker.version import __version__

        sys.stdout.write(f"stoker {__version__}\n")
        return
    from stoker.cli.help_cache import HelpCache, requested_help

    words = requested_help(argv)
    kept = HelpCache(words) if words is not None else None
    text = kept.text() if kept is not None else None
    if text is not None:
        sys.stdout.write(text)
        return
    from stoker.cli.app import run

    run(argv, kept)
