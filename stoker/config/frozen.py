"""The frozen config: the one file a job reads, and the hash of what a checkpoint depends on.

`write_frozen` writes the resolved experiment atomically; `load_frozen` reads it with no
profile and no overrides, so a job sees exactly what was shown at submission.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

from stoker.atomic_write import write_text_atomic
from stoker.config.resolve import ResolvedConfig, resolve_config
from stoker.config.schema import ExperimentConfig
from stoker.config.yaml_source import dump_yaml
from stoker.redact import printable_line
from stoker.version import __version__


def freeze_config(resolved: ResolvedConfig) -> str:
    """The YAML a job reads: every value resolved, no profile or overrides left to apply."""
    return frozen_text(resolved.config, str(resolved.experiment or "the built-in defaults"))


def frozen_text(config: ExperimentConfig, origin: str) -> str:
    """`config` as a frozen config's YAML, its header saying it came from `origin`."""
    # The origin on one comment line: a newline in it would start a line of YAML.
    header = (
        f"# Frozen by stoker {__version__} at {dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ}"
        f" from {printable_line(origin)}.\n"
        "# This file is the job's only input; edit the experiment file, not this one.\n"
    )
    body = dump_yaml(
        config.model_dump(mode="json", by_alias=True), sort_keys=False, allow_unicode=True
    )
    return header + body


def write_frozen(resolved: ResolvedConfig, path: Path) -> Path:
    """Write the frozen config atomically: a job never reads a half-written file."""
    return write_text_atomic(path, freeze_config(resolved))


def load_frozen(path: Path) -> ExperimentConfig:
    """Read a frozen config as a job does: no profile, no overrides, strict validation."""
    return resolve_config(path, use_profile=False, anchor_paths=False).config


# The sections that decide what a checkpoint holds; job resources, tracking and
# checkpoint placement can change between a save and a resume.
_STATE_SECTIONS = ("model", "data", "train", "optim")


def state_hash(cfg: ExperimentConfig) -> str:
    """A short hash (16 hex digits) of the config sections a checkpoint's state depends on
    (recorded in COMMIT.json, to tell which config wrote a checkpoint)."""
    data = cfg.model_dump(mode="json", by_alias=True, include=set(_STATE_SECTIONS))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
