"""Waiting out a locked sqlite file: retries with bounded exponential backoff and jitter.

The ledger and the default MLflow store are sqlite files that every `stoker submit`,
`sweep` and `status` on the machine writes. sqlite lets one writer in at a time; the
others wait in its busy handler, but a wait can still end in "database is locked"
(its own timeout spent on a loaded machine, or a lock that sqlite will not wait for
because waiting could deadlock). Such a call is run again after 0.05 s, 0.1 s,
0.2 s, ... (at most MAX_DELAY_S, each with random jitter so that the losers do not
collide again) until BUDGET_S has passed; then the error names the file and the fix.

Only lock contention is retried. Every other error (a read-only folder, a file that is
not a database, "table already exists" from two schema creations at once) fails at once:
waiting would not fix it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from stoker.errors import StokerError

T = TypeVar("T")

# Seconds a call may spend waiting for a locked file in all, its attempts together.
BUDGET_S = 60.0
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 2.0

# How sqlite3, SQLAlchemy and MLflow (which wraps both, also over HTTP) word contention.
_LOCKED = (
    "database is locked",
    "database table is locked",
    "database schema is locked",
    "database is busy",
    "sqlite_busy",
    "sqlite_locked",
)


class DatabaseLockedError(StokerError):
    """The file stayed locked for the whole budget."""


def is_locked_error(exc: BaseException) -> bool:
    """True when `exc`, or an exception it was raised from, is sqlite's lock contention
    (and not a DatabaseLockedError: its budget is spent, an outer retry must not start over)."""
    if isinstance(exc, DatabaseLockedError):
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current).lower()
        if any(marker in text for marker in _LOCKED):
            return True
        current = current.__cause__ or current.__context__
    return False


def retry_while_locked(
    call: Callable[[], T],
    *,
    db: Path | str,
    doing: str,
    fix: str,
    budget_s: float = BUDGET_S,
) -> T:
    """`call()`, run again while it fails with lock contention on `db`, for `budget_s` in all.

    `db` is the file (or a server's URI), `doing` says what was attempted ("record job 123
    in the job ledger") and `fix` what the user can do; all three go into the
    DatabaseLockedError raised once the budget is spent. Any other exception propagates
    at once.
    """
    deadline = time.monotonic() + budget_s
    delay = FIRST_DELAY_S
    attempts = 0
    while True:
        attempts += 1
        try:
            return call()
        except Exception as exc:
            if not is_locked_error(exc):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise DatabaseLockedError(
                    f"could not {doing}: {db} stayed locked by other processes for "
                    f"{budget_s:g} s ({attempts} attempts; last error: {_first_line(exc)})",
                    fix=fix,
                ) from exc
            # Equal jitter: at least half the delay, so the wait still grows.
            time.sleep(min(left, delay / 2 + random.uniform(0, delay / 2)))
            delay = min(MAX_DELAY_S, delay * 2)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0] if len(lines[0]) <= 200 else lines[0][:200] + "..."
