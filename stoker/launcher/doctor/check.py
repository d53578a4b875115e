"""What every `stoker doctor` check shares: the finding it reports (`Finding`, at a
`CheckLevel`), the check's type, and the timeout of every external command.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

CheckLevel = Literal["ok", "warn", "fail"]

COMMAND_TIMEOUT = 10.0


@dataclass(frozen=True)
class Finding:
    """One line of the report. `fix` is None when there is nothing to do."""

    check: str
    status: CheckLevel
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"check": self.check, "status": self.status, "detail": self.detail, "fix": self.fix}


Check = tuple[str, Callable[[], list[Finding]]]


def joined_lines(text: str) -> str:
    """Multi-line messages (a config error lists its problems) as one report line."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def not_checked(check: str, reason: str, see: str) -> Finding:
    """The finding of a check that could not run because the `see` check failed."""
    return Finding(check, "warn", f"not checked: {reason}", f"see the `{see}` line above")
