"""What the av_dit is conditioned on besides the timestep: a caption or a class label
per clip, embedded to one vector [dim] that is added to the timestep's embedding
before the adaLN modulations (DiT's class conditioning; captions through the same
door).

- "caption": the clip's caption (data.modalities has "text": the `.txt` sidecar),
  embedded by stoker's small built-in text embedding (`HashedWords`: a learned bag of
  hashed words, no vocabulary file and no weights to download), or by a text encoder
  of your own: `text_encoder: pkg.module:factory`, a factory returning a callable
  `(captions: list[str]) -> float tensor [B, D]`, kept frozen and out of checkpoints,
  whose D is projected to the model's width.
- "class": one field of the clip's metadata (data.modalities has "meta": the `.json`
  sidecar), `class_field`, whose value is one of `classes`.

Each also has a learned "no condition" vector: the rows dropped in training
(`cond_dropout`, drawn from each sample's own generator, so seeded as its noise is)
and the unconditional half of classifier-free guidance. The av_dit's adaLN-zero layers
make an untrained conditioned model's output the unconditioned one's (v = 0).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from stoker.runtime.models.training_model import Batch, Noise, normal_init_

HASHED_BUCKETS = 4096
"""Rows of HashedWords' table: words share a row only by CRC32 collision."""
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class ConditionArgs:
    """The av_dit's `model.args` for conditioning. A dataclass, not a pydantic model:
    the models import without pydantic (the step benchmark runs on bare GPU nodes);
    `model.args` is still validated by pydantic where a config builds the model."""

    condition: Literal["none", "caption", "class"] = "none"
    """What the model is conditioned on: nothing, each clip's caption, or a class label."""
    cond_dropout: float = 0.1
    """Share of training rows whose condition is dropped (for classifier-free guidance)."""
    class_field: str | None = None
    """condition: class: the metadata field that holds the label, e.g. shape."""
    classes: tuple[str, ...] = ()
    """condition: class: every label, in a fixed order (its index is the embedding row)."""
    text_encoder: str | None = None
    """condition: caption: pkg.module:factory of your own text encoder; null the built-in."""

    def __post_init__(self) -> None:
        if self.condition not in ("none", "caption", "class"):
            raise ValueError(f"condition {self.condition!r} is not none, caption or class")
        if not 0.0 <= self.cond_dropout <= 1.0:
            raise ValueError(f"cond_dropout {self.cond_dropout!r} must be from 0 to 1")
        if self.condition == "class" and (not self.class_field or len(self.classes) < 2):
            raise ValueError(
                "condition: class needs class_field (the metadata field) and classes (two or "
                "more labels), e.g. {condition: class, class_field: shape, classes: [square, "
                "circle]}"
            )
        if self.condition != "class" and (self.class_field or self.classes):
            raise ValueError("class_field and classes are for condition: class")
        if self.condition != "caption" and self.text_encoder:
            raise ValueError("text_encoder is for condition: caption")
        object.__setattr__(self, "classes", tuple(self.classes))

    @property
    def modality(self) -> str | None:
        """The data.modalities entry the condition comes from."""
        return {"caption": "text", "class": "meta"}.get(self.condition)


def words(caption: str) -> list[str]:
    """A caption's words, lower case, punctuation dropped."""
    return _WORD.findall(caption.lower())


class HashedWords(nn.Module):
    """The built-in text embedding: the mean of one learned vector per word, a word's
    row its CRC32 modulo HASHED_BUCKETS (stable across processes and runs)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.table = nn.EmbeddingBag(HASHED_BUCKETS, dim, mode="mean")

    def forward(self, captions: Sequence[str]) -> torch.Tensor:
        device = self.table.weight.device
        ids: list[int] = []
        offsets: list[int] = []
        for caption in captions:
            offsets.append(len(ids))
            ids += [zlib.crc32(w.encode()) % HASHED_BUCKETS for w in words(caption)] or [0]
        out: torch.Tensor = self.table(
            torch.tensor(ids, device=device), torch.tensor(offsets, device=device)
        )
        return out


class Conditioner(nn.Module):
    """Batch conditions -> [B, dim] vectors, the null vector where there is none."""

    def __init__(self, args: ConditionArgs, dim: int) -> None:
        super().__init__()
        self.args = args
        self.null = nn.Parameter(torch.zeros(dim))
        self._encoder: Callable[[list[str]], torch.Tensor] | None = None
        width = dim
        if args.condition == "class":
            self.classes = nn.Embedding(len(args.classes), dim)
        elif args.text_encoder:
            from stoker.import_path import import_callable

            factory = import_callable(
                args.text_encoder,
                key="model.args.text_encoder",
                shown=args.text_encoder,
                kind="a function or class",
                kind_fix="name the factory of your text encoder",
            )
            self._encoder = factory()
            width = int(self._encoder(["a probe caption"]).shape[-1])
        else:
            self.words = HashedWords(dim)
        self.project_in = nn.Linear(width, dim)
        self.project_out = nn.Linear(dim, dim)

    def init_weights(self) -> None:
        """Unit-scale embeddings, a small null vector; the projection as the model's
        linears (xavier). The model's adaLN-zero layers already make an untrained model's
        output independent of its conditioning; a zero projection on top would leave the
        conditioner without gradient until the modulations have moved."""
        with torch.no_grad():
            normal_init_(self.null, std=0.02)
            table = self.classes.weight if self.args.condition == "class" else None
            if table is None and self._encoder is None:
                table = self.words.table.weight
            if table is not None:
                # Unit scale, as nn.Embedding's own: at DiT's 0.02 the condition's vector
                # starts far below the timestep's and took hundreds of steps to matter.
                normal_init_(table, std=1.0)
            for linear in (self.project_in, self.project_out):
                nn.init.xavier_uniform_(linear.weight)
                nn.init.zeros_(linear.bias)

    def labels(self, batch: Batch) -> list[str]:
        """The batch's conditions as strings: captions, or the class field's values."""
        name = self.args.modality
        assert name is not None
        values = batch.get(name)
        if not isinstance(values, list):
            raise ValueError(
                f"this av_dit is conditioned on {self.args.condition}s but the batch has no "
                f"{name!r} list: add {name!r} to data.modalities"
            )
        if self.args.condition == "caption":
            return [str(v) for v in values]
        key = self.args.class_field
        return [str(v.get(key)) if isinstance(v, Mapping) else "" for v in values]

    def forward(self, conditions: Sequence[str | None]) -> torch.Tensor:
        """[B, dim]: each condition's vector, the null vector for None."""
        rows = [i for i, c in enumerate(conditions) if c is not None]
        given = [c for c in conditions if c is not None]
        out = self.null.expand(len(conditions), -1)
        if not given:
            return out
        hidden = F.silu(self.project_in(self._embed(given)))
        embedded = self.project_out(hidden).to(out.dtype)
        index = torch.tensor(rows, device=out.device)
        return out.index_copy(0, index, embedded)

    def _embed(self, given: list[str]) -> torch.Tensor:
        if self.args.condition == "class":
            unknown = sorted({c for c in given if c not in self.args.classes})
            if unknown:
                raise ValueError(
                    f"class labels {unknown} (metadata {self.args.class_field!r}) are not in "
                    f"model.args.classes {list(self.args.classes)}: add them there"
                )
            ids = [self.args.classes.index(c) for c in given]
            out: torch.Tensor = self.classes(torch.tensor(ids, device=self.null.device))
            return out
        if self._encoder is not None:
            with torch.no_grad():
                return self._encoder(given).to(self.null.device, torch.float32)
        words_out: torch.Tensor = self.words(given)
        return words_out

    def dropped(self, conditions: list[str], generator: Noise) -> list[str | None]:
        """`conditions` with each dropped (None) with probability cond_dropout, drawn
        from the sample's own generator (or the batch's, or torch's global one)."""
        p = self.args.cond_dropout
        if p <= 0.0:
            return list(conditions)
        if generator is None or isinstance(generator, torch.Generator):
            device = generator.device if generator is not None else self.null.device
            draws = torch.rand(len(conditions), generator=generator, device=device).tolist()
        else:
            draws = [float(torch.rand((), generator=g, device=g.device)) for g in generator]
        return [None if u < p else c for c, u in zip(conditions, draws, strict=True)]


NO_CONDITION = ConditionArgs()
"""The unconditioned av_dit's args."""
