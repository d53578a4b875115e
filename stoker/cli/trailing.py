"""The command after `--` (`stoker submit [opts] -- python train.py --lr 3e-4`).

click folds what follows `--` into the positional arguments, where it could not
be told from `k=v` overrides; `main()` cuts it off before click parses the rest.
"""

from __future__ import annotations

# Commands that take a trailing command.
TAKES_COMMAND = frozenset({"submit", "sweep", "run"})

_command: list[str] | None = None


def split_argv(argv: list[str]) -> list[str]:
    """Remove `-- CMD ...` from `argv` for the commands that take one; keep it for them."""
    global _command
    _command = None
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] not in TAKES_COMMAND or "--" not in argv:
        return argv
    cut = argv.index("--")
    _command = argv[cut + 1 :]
    return argv[:cut]


def trailing_command() -> list[str]:
    """The command after `--`, or [] when none was given."""
    return list(_command or [])
