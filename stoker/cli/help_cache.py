"""`stoker --help` and every sub-command's `--help` from a cache of their rendered text.

Rendering a help imports typer and its click (~50 ms of a 2-core VM's ~100 ms for the
whole command, against ~30 ms for `python -c pass`): a login node's user pays it each
time they look something up. The text depends only on the words asked for, stoker's
code, typer's version and the terminal's width, so the first rendering of each is kept
under `$STOKER_HOME/cache/help/<fingerprint>/` and printed from there the next time,
with no third-party import at all.

The fingerprint covers every file of the stoker package (path, size, modification
time) and the installed typer: a change to either, an upgrade or an edit of an
editable install, starts a new folder, and folders beyond the four newest are removed.
Only a help printed with exit status 0 is kept; a typo, an option or a file among the
words goes the usual way. A cache that cannot be written (a read-only home) changes nothing
but the speed. This module imports nothing outside the standard library's core.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Sequence

from stoker.cli.command_table import COMMANDS

HELP_OPTIONS = ("--help", "-h")
KEPT_VERSIONS = 4  # fingerprints' folders kept: this install's and the 3 newest others
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def help_width() -> int:
    """The width click formats help for: the terminal's columns, as
    `shutil.get_terminal_size()` reads them ($COLUMNS first), capped at 80, less 2."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
        if columns <= 0:
            columns = 80
    return max(min(columns, 80) - 2, 50)


def requested_help(argv: Sequence[str]) -> tuple[str, ...] | None:
    """The command words of `stoker WORDS... --help` (none for the root's help), when
    they name a command of stoker/cli/command_table.py, or one of a group the table
    does not list (`config`); else None: that help is rendered, not kept."""
    if not argv or argv[-1] not in HELP_OPTIONS:
        return None
    words = tuple(argv[:-1])
    table: dict[str, tuple[str, str]] | None = COMMANDS["stoker"]
    for place, word in enumerate(words):
        if not _command_like(word):
            return None
        if table is not None:
            if word not in table:
                return None
            is_group = table[word][0].endswith(":app")
            table = COMMANDS.get(word) if is_group else None
            if not is_group and place != len(words) - 1:
                return None  # a command's argument: its help, but not kept
    return words


def _command_like(word: str) -> bool:
    """A lower-case name such as `submit` or `ckpt`: no option, path or value."""
    return (
        0 < len(word) <= 32
        and word.isascii()
        and word[0].isalpha()
        and word.islower()
        and all(c.isalnum() or c in "-_" for c in word)
    )


def fingerprint(package: str = PACKAGE) -> str:
    """What the help text depends on, besides the words and the width: every file of
    `package` (path, size, modification time) and the typer installed beside it."""
    entries: list[str] = []
    _walk(package, entries)
    entries.append(_typer_release())
    text = "\n".join(entries).encode()
    return f"{len(entries)}-{zlib.crc32(text):08x}-{zlib.adler32(text):08x}"


def _walk(folder: str, entries: list[str]) -> None:
    with os.scandir(folder) as found:
        for entry in found:
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    _walk(entry.path, entries)
            else:
                stat = entry.stat()
                entries.append(f"{entry.path} {stat.st_size} {stat.st_mtime_ns}")


def _typer_release() -> str:
    """typer's dist-info folder (its name holds the version) and its __init__'s time."""
    for place in sys.path:
        init = os.path.join(place or ".", "typer", "__init__.py")
        try:
            changed = os.stat(init).st_mtime_ns
        except OSError:
            continue
        releases = sorted(n for n in os.listdir(place or ".") if n.startswith("typer-"))
        return f"typer {changed} {' '.join(releases)}"
    return "typer not found"


def cache_folder() -> str:
    """`$STOKER_HOME/cache/help` (stoker/home.py's `$STOKER_HOME`, else ~/.stoker)."""
    home = os.environ.get("STOKER_HOME") or os.path.join(os.path.expanduser("~"), ".stoker")
    return os.path.join(os.path.abspath(os.path.expanduser(home)), "cache", "help")


class HelpCache:
    """The cached help of one request: `words` at this terminal width, this code."""

    def __init__(self, words: tuple[str, ...], folder: str | None = None) -> None:
        self.words = words
        self.root = folder or cache_folder()
        self.version = fingerprint()
        name = "-".join(("stoker", *words))
        self.path = os.path.join(self.root, self.version, f"{name}.w{help_width()}.txt")

    def text(self) -> str | None:
        """The help as it was printed last time, or None when it was not kept yet."""
        try:
            with open(self.path, encoding="utf-8") as cached:
                return cached.read()
        except (OSError, UnicodeDecodeError):
            return None

    def keep(self, text: str) -> None:
        """Keep `text` (written whole, then renamed into place), and drop all but the
        KEPT_VERSIONS newest fingerprints' folders: a shared $STOKER_HOME may serve
        login nodes with different installs, which must not evict each other."""
        folder = os.path.dirname(self.path)
        partial = f"{self.path}.{os.getpid()}.partial"
        try:
            os.makedirs(folder, exist_ok=True)
            with open(partial, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(partial, self.path)
            others = [os.path.join(self.root, n) for n in os.listdir(self.root)]
            others.sort(key=os.path.getmtime, reverse=True)
        except OSError:
            return  # not writable here: the next help renders again
        stale = [p for p in others if p != folder][KEPT_VERSIONS - 1 :]
        if stale:
            import shutil

            for path in stale:
                shutil.rmtree(path, ignore_errors=True)
