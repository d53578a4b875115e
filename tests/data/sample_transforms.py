"""Transforms the loader tests name by import path (`data.transform`): the loader's
worker processes import this module by name, as they would a user's package."""

from __future__ import annotations

import os
from typing import Any

import torch

FAILS_ON = "clip-000003"


def halve_audio_and_tag(sample: dict[str, Any]) -> dict[str, Any]:
    """Changes a decoded tensor and adds keys: the process it ran in, and a number."""
    sample["audio"] = sample["audio"] * 0.5
    sample["ran_in_pid"] = torch.tensor(os.getpid())
    sample["clip"] = int(sample["key"].split("-")[1])
    return sample


def fail_on_one(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["key"] == FAILS_ON:
        raise ValueError(f"cannot crop {sample['key']}")
    return sample


def always_fail(sample: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("this transform has a bug")


def return_nothing(sample: dict[str, Any]) -> None:
    sample["audio"] = sample["audio"] * 2  # forgot the return


def tag_odd_clips_only(sample: dict[str, Any]) -> dict[str, Any]:
    if int(sample["key"].split("-")[1]) % 2:
        sample["odd"] = True
    return sample


NOT_A_FUNCTION = 3


MARK = "STOKER_TEST_ENVIRONMENT_MARK"


def tag_environment(sample: dict[str, Any]) -> dict[str, Any]:
    """Adds what the worker's environment says in MARK (empty when it is not set)."""
    sample["environment_mark"] = os.environ.get(MARK, "")
    return sample


def count_decode_threads(sample: dict[str, Any]) -> dict[str, Any]:
    """How many of the loader's decode threads run in the process the transform runs in."""
    import threading

    names = [t.name for t in threading.enumerate() if t.name.startswith("decode")]
    sample["decode_threads"] = len(names)
    return sample
