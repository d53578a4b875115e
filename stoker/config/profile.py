"""The site profile: cluster-wide settings an operator or user writes once.

`$STOKER_PROFILE`, else `~/.config/stoker/profile.yaml` when it exists. Its flat
keys map onto experiment keys and sit below the experiment file in precedence.
"""

from __future__ import annotations

import os
from pathlib import Path

from stoker.config.keys import KeyPath
from stoker.errors import StokerError
from stoker.home import default_profile_path

PROFILE_KEYS: dict[str, KeyPath] = {
    "partition": ("job", "partition"),
    "account": ("job", "account"),
    "qos": ("job", "qos"),
    "exclude": ("job", "exclude"),
    "container": ("job", "container"),
    "setup": ("job", "setup"),
    "template": ("job", "template"),
    "env": ("job", "env"),
    "mounts": ("job", "mounts"),
    "tracking_uri": ("tracking", "uri"),
}


def find_profile(explicit: Path | None = None) -> Path | None:
    """The profile in force: an explicit path, `$STOKER_PROFILE`, or the default if present."""
    if explicit is not None:
        return explicit
    from_env = os.environ.get("STOKER_PROFILE")
    if from_env:
        path = Path(from_env).expanduser()
        if not path.is_file():
            raise StokerError(
                f"STOKER_PROFILE={from_env} names no file",
                fix="unset STOKER_PROFILE, or write a profile there with `stoker init --profile`",
            )
        return path
    default = default_profile_path()
    return default if default.is_file() else None
