"""A text encoder of a user's own, for the conditioning tests: `model.args.text_encoder:
tests.runtime.text_encoders:letters` (a factory returning captions -> [B, 26] vectors)."""

from __future__ import annotations

from collections.abc import Callable

import torch


def letters() -> Callable[[list[str]], torch.Tensor]:
    """Each caption's letter counts, a-z: crude, deterministic, no weights."""

    def encode(captions: list[str]) -> torch.Tensor:
        out = torch.zeros(len(captions), 26)
        for row, caption in enumerate(captions):
            for char in caption.lower():
                if "a" <= char <= "z":
                    out[row, ord(char) - ord("a")] += 1
        return out

    return encode
