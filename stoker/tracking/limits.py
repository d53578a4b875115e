"""MLflow's limits on names, values and calls (mlflow/utils/validation.py), checked by stoker.

`stoker submit` checks names before anything is created, so a bad key never leaves a
half-made run behind; the job's RunLogger checks them when logged, so a bad name is a
bug seen at the first step, not hours later. Values over MLflow's lengths are cut,
with a visible marker, rather than refused.
"""

from __future__ import annotations

import posixpath
import re

from stoker.config.schema import MAX_REGISTERED_MODEL_NAME, registered_model_name_ok
from stoker.errors import StokerError

ParamValue = str | int | float
"""What a param may be given as; MLflow stores its `str()`."""

MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY_LENGTH = 250
MAX_EXPERIMENT_NAME = 500
MAX_MODEL_NAME = 500

# One log_batch call: 1000 metrics, 100 params, 100 tags, 1000 entities in all, and a
# request body under 1 MB.
METRICS_PER_BATCH = 1000
PARAMS_PER_BATCH = 100
TAGS_PER_BATCH = 100
ENTITIES_PER_BATCH = 1000
MAX_BATCH_CHARS = 900_000

_VALID_KEY = re.compile(r"[/\w.\- :]+")
_TRUNCATED = "...[truncated]"
# What MLflow refuses in a logged model's name; a quote would also break the search
# filter that keeps models exactly once (stoker/tracking/logged_models.py).
_BAD_MODEL_NAME_CHARS = ("/", ":", ".", "%", '"', "'")


def check_key(kind: str, key: str) -> None:
    """Raise StokerError unless MLflow takes `key` as the name of a `kind` ("metric",
    "param", "tag")."""
    bad = (
        len(key) > MAX_KEY_LENGTH
        or not _VALID_KEY.fullmatch(key)
        or posixpath.normpath(key) != key
        or key.startswith(("/", ".."))
    )
    if bad:
        raise StokerError(
            f"MLflow {kind} name {key!r} is not allowed",
            fix=f"use at most {MAX_KEY_LENGTH} letters, digits, '_', '-', '.', ' ', ':' and "
            "'/' (no leading '/', no '..', no '//')",
        )


def cut(value: str, limit: int) -> str:
    """`value`, or its first characters and "...[truncated]" in `limit` characters."""
    return value if len(value) <= limit else value[: limit - len(_TRUNCATED)] + _TRUNCATED


def check_model_name(name: str) -> None:
    """Raise StokerError unless MLflow takes `name` for a logged model."""
    if not name or len(name) > MAX_MODEL_NAME or any(c in name for c in _BAD_MODEL_NAME_CHARS):
        raise StokerError(
            f"{name!r} is not a name MLflow takes for a logged model",
            fix=f"use 1 to {MAX_MODEL_NAME} characters without any of "
            f"{' '.join(_BAD_MODEL_NAME_CHARS)}",
        )


def check_registered_model_name(name: str) -> None:
    """Raise StokerError unless MLflow's model registry takes `name` (no '/' or ':', not
    blank, not a path that normalizes to another, e.g. '.' or '..')."""
    if not registered_model_name_ok(name):
        raise StokerError(
            f"{name!r} is not a name MLflow's model registry takes",
            fix=f"use 1 to {MAX_REGISTERED_MODEL_NAME} characters without '/' or ':', "
            "e.g. av-dit-small",
        )
