"""Errors a user can fix: the CLI prints them without a traceback and exits non-zero."""

from __future__ import annotations


class StokerError(Exception):
    """A user-facing error: what is wrong, where it came from, and the fix."""

    exit_code = 2

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        if self.fix:
            return f"{self.message}\n  fix: {self.fix}"
        return self.message
