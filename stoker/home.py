"""Where stoker keeps its state on this machine (ledger, runs, embedded MLflow store)."""

from __future__ import annotations

import os
from pathlib import Path


def stoker_home() -> Path:
    """`$STOKER_HOME`, else `~/.stoker`. Not created here: writers create what they need."""
    value = os.environ.get("STOKER_HOME")
    if value:
        return Path(value).expanduser().resolve()
    return Path.home() / ".stoker"


def default_profile_path() -> Path:
    """The site profile read when `$STOKER_PROFILE` is not set."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "stoker" / "profile.yaml"
