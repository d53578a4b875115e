"""The experiment config: schema, resolution from its sources, the frozen file a job reads.

| module | what it is |
|---|---|
| `schema` | the pydantic sections and `ExperimentConfig`, one docstring per field |
| `resolve` | `resolve_config`: sources in precedence order, validation, errors with their source |
| `unsafe_values` | values no config may hold: secrets, NUL, text that is not UTF-8 |
| `frozen` | `freeze_config`, `write_frozen`, `load_frozen`; `state_hash` for checkpoints |
| `keys` | walking the schema by dotted key: lookup, did-you-mean, types in words |
| `paths` | relative local paths made absolute against the folder of their source |
| `overrides` | `key=value` arguments, typed as YAML reads them |
| `profile` | the site profile: its keys and where it is found |
| `yaml_source` | YAML with the line of every key; YAML 1.1 fixes |
| `render` | texts generated from the schema: `init`'s templates, docs/config.md |

The names below are re-exported lazily: `stoker.config.profile` is imported by login-node
code that must not pay for pydantic and yaml, and importing a submodule runs this file
first. `from stoker.config import ExperimentConfig` imports the submodule that defines
the name on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stoker.config.frozen import freeze_config, load_frozen, state_hash, write_frozen
    from stoker.config.resolve import (
        ConfigError,
        ConfigRow,
        Problem,
        ResolvedConfig,
        Source,
        resolve_config,
    )
    from stoker.config.schema import (
        CheckpointConfig,
        DataConfig,
        ExperimentConfig,
        JobConfig,
        ModelConfig,
        OptimConfig,
        TrackingConfig,
        TrainConfig,
    )

# Each re-exported name and the submodule that defines it.
_HOME = {
    "CheckpointConfig": "schema",
    "DataConfig": "schema",
    "ExperimentConfig": "schema",
    "JobConfig": "schema",
    "ModelConfig": "schema",
    "OptimConfig": "schema",
    "TrackingConfig": "schema",
    "TrainConfig": "schema",
    "ConfigError": "resolve",
    "ConfigRow": "resolve",
    "Problem": "resolve",
    "ResolvedConfig": "resolve",
    "Source": "resolve",
    "resolve_config": "resolve",
    "freeze_config": "frozen",
    "load_frozen": "frozen",
    "state_hash": "frozen",
    "write_frozen": "frozen",
}

__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "ConfigRow",
    "DataConfig",
    "ExperimentConfig",
    "JobConfig",
    "ModelConfig",
    "OptimConfig",
    "Problem",
    "ResolvedConfig",
    "Source",
    "TrackingConfig",
    "TrainConfig",
    "freeze_config",
    "load_frozen",
    "resolve_config",
    "state_hash",
    "write_frozen",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
