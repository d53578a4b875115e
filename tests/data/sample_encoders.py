"""Encoders the `stoker data encode` tests name by import path (`--encoder`): the
encoding processes (local workers, SLURM array tasks) import this module by name, as
they would a user's package."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from stoker.data.encode.tiny_encoder import TinyAVEncoder

FAILS_ON = "clip-000003"
SLOW_KEYS = "STOKER_TEST_ENCODE_SLOW_KEYS"
"""Environment: `KEY,KEY=SECONDS`: a batch holding one of the keys sleeps that long (read
per call, so that only the job submitted with it set is slow; not part of the identity)."""


class _Tiny(TinyAVEncoder):
    """stoker's own encoder, with a twist per test."""

    def __init__(self, delay_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delay_s = delay_s

    def forward(self, batch: Any) -> dict[str, torch.Tensor]:
        time.sleep(self.delay_s)
        keys, _, seconds = os.environ.get(SLOW_KEYS, "").partition("=")
        if set(keys.split(",")) & set(batch["key"]):
            print(f"sample_encoders: sleeping {seconds} s on {batch['key']}", flush=True)
            time.sleep(float(seconds))
        return super().forward(batch)


def slow(delay_s: float = 0.0) -> _Tiny:
    """The tiny encoder, `delay_s` slower per batch (a long encode, for the SLURM kill)."""
    return _Tiny(delay_s)


class _FailsOnOne(TinyAVEncoder):
    def forward(self, batch: Any) -> dict[str, torch.Tensor]:
        if FAILS_ON in batch["key"]:
            raise ValueError(f"cannot encode {FAILS_ON}")
        return super().forward(batch)


def fails_on_one() -> _FailsOnOne:
    return _FailsOnOne()


def always_fails() -> Any:
    def encode(batch: Any) -> Any:
        raise RuntimeError("this encoder has a bug")

    return encode


def changes_shape() -> Any:
    """Latents one frame shorter on every call after the first."""
    calls = [0]

    def encode(batch: Any) -> dict[str, torch.Tensor]:
        calls[0] += 1
        video = batch["video"].float()[:, : (8 if calls[0] == 1 else 7), :1, :4, :4]
        return {"video": video.contiguous()}

    return encode


def one_row() -> Any:
    """Breaks the contract: one row whatever the batch."""

    def encode(batch: Any) -> dict[str, torch.Tensor]:
        return {"video": torch.zeros(1, 4)}

    return encode


def not_callable() -> int:
    return 3
