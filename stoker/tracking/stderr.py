"""What the job's MLflow writer tells the user: one line on stderr, never an exception.

Nothing the writer meets (a store down, a refused batch, an unwritable spool) may
stop training, so it is said here once and the job goes on.
"""

from __future__ import annotations

import sys


def warn(message: str) -> None:
    """`stoker: warning: <message>` on stderr, flushed."""
    print(f"stoker: warning: {message}", file=sys.stderr, flush=True)


def say(message: str) -> None:
    """`stoker: <message>` on stderr, flushed (news that is not a problem)."""
    print(f"stoker: {message}", file=sys.stderr, flush=True)


def first_line(exc: BaseException) -> str:
    """The first line of `exc`'s message, at most 300 characters; its type if empty."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0] if len(lines[0]) <= 300 else lines[0][:300] + "..."
