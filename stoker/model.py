"""The contract between stoker's trainer and a model: yours or a built-in one.

An experiment names a model by `model.arch`: a built-in (`av_dit`, `audio_ar`) or the
import path of your factory, `package.module:function`, imported by name on every rank
from the folder the job runs in (which `stoker submit` snapshots) or from the installed
packages. Never pickled. `model.args` are the factory's keyword arguments:

    # mypkg/models.py
    from dataclasses import dataclass
    from torch import nn
    from stoker.model import DataShapes

    @dataclass
    class Args:                       # optional: validated, errors name model.args.<field>
        width: int = 128
        depth: int = 4

    def build(data: DataShapes, args: Args) -> nn.Module:   # or (data, **kwargs)
        return MyModel(data, args.width, args.depth)

    # stoker run model.arch=mypkg.models:build model.args.width=256

The factory gets the data's shapes (`DataShapes`) and its arguments, and returns an
`nn.Module` the trainer calls as:

- `forward(batch) -> loss` (a scalar tensor) or `(loss, metrics)`, where metrics map
  names to scalars (tensors or numbers) the trainer averages over the log window and
  the ranks and logs beside the loss: the same names on every rank and every batch (the
  first log step checks the ranks agree). Required.
- `blocks()` -> the repeated modules (an iterable of `nn.Module`; a `blocks`
  `nn.ModuleList` attribute does as well): the units of FSDP2 sharding, activation
  checkpointing and per-block `torch.compile`. Optional: without it the whole model is
  one FSDP unit.
- `init_weights()`: (re)initialise every parameter and buffer in place. Optional:
  without it the parameters the factory made are kept (the factory runs under the
  run's seed, the same on every rank).
- `flops_per_sample(batch)` -> training FLOPs (forward + backward) of one sample of
  this batch's shape. Optional: without it there is no MFU, said once in the log.
- `sample(generators, steps)` -> {name: tensor [len(generators), ...]} of media in the
  batch's layouts, one sample per seeded `torch.Generator`: generation
  (stoker/runtime/sampling/draw.py; the built-in models have their own samplers), called
  with `prompts=` (one caption or label per generator) and `guidance=` as keywords
  when the caller has prompts. Optional: without it a run draws no samples (said
  once in the log) and `stoker sample` refuses the model with the fix.

The batch (`Batch`) holds what the loader decoded, as `data.modalities` asks: "video"
uint8 [B, T, 3, H, W], "audio" float32 [B, C, N], "text" (the captions, a list of
strings), "meta" (the `.json` members, a list of dicts); "valid" bool [B], "skipped"
(the "shard:key" of each sample of this batch that could not be used, a list),
"position" int64 [B] (each sample's place in the data order), and "generators": one
`torch.Generator` per sample on the batch's device, seeded by (train.seed, the sample's
position in the data order): draw noise from them and the losses are the same whatever
the number of ranks and restarts; the global RNG works too, without that guarantee.

`valid` is False for a row that stands in for a sample that could not be fetched,
decoded or transformed: the row is a copy of another row of the batch, so that shapes
stay fixed. forward must leave such rows out of the loss (and so out of the gradient):
compute a loss per sample and average it over the valid rows with
`valid_mean(per_sample_loss, batch)`. A batch may hold no valid row at all (a
micro-batch of a gradient-accumulation step): valid_mean gives 0 then, not NaN.

Shapes: without `data.buckets` every batch has the one shape of `DataShapes`. With
buckets each batch is one bucket's shape (`DataShapes.buckets`: T frames of H x W and N
audio samples per bucket; the batch size varies too): forward must take each, and
`stoker check` runs it on every bucket's shape before anything is queued.
`flops_per_sample(batch)` is asked once per shape of batch.

Array members pass through whatever `data.modalities` says: each `.npy` and
`.safetensors` member that every sample of the data set has, under its extension
("npy", "latent.npy", "safetensors"). A `.npy` is a tensor of its stored dtype (never
unpickled); a `.safetensors` a dict of tensors by name. Tensors of one shape and dtype
in every row are stacked [B, ...]; where they differ, the key holds a list of B
tensors (and a `.safetensors` dict, a dict of those). What `data.transform` adds is
collated the same way; values that are not tensors come as lists. Stacked tensors,
and dicts of stacked tensors, arrive on the model's device; lists stay on the host
for forward to move.

Latents (a data set `stoker data encode` wrote, `data.modalities: [latent]`): "latent"
is a dict of the encoder's tensors by name, stacked [B, ...] ("video" [B, T, C, h, w]
from stoker's own encoder), one shape per bucket the data set was encoded at
(`DataShapes.latents`); the built-in av_dit trains on its "video" and "audio".

Long sequences (`train.context_parallel: N`, docs/runtime.md): each sample's tokens are
split over N ranks, and a model computes on its own share. A model that works on its own
token sequence needs three things, each a plain no-op without context parallelism:

- `token_slice(n)`: the slice of a sequence of n tokens this rank computes (all of it
  without CP). Cut every per-token tensor with it (the tokens, their positions' RoPE
  rows, the noise and the targets), after drawing what is random for the whole sample.
- `attention(q, k, v, causal=False)`: q, k, v [B, heads, tokens of this rank, head_dim]
  -> the attention over every rank's tokens; torch's scaled_dot_product_attention
  without CP.
- `cp_sum(t)`: `t` summed over the ranks that share the samples: a loss is the sum of
  the per-token losses over `cp_sum`, divided by the whole sequence's count, so every
  rank has the loss (and gradients) of one rank holding all tokens.

        tokens = tokens[:, token_slice(tokens.shape[1])]
        ...
        squared = (predicted - target).square().sum(dim=(1, 2))
        per_sample = cp_sum(squared) / (target_tokens * channels)
        return valid_mean(per_sample, batch)

`context_parallel()` gives the active one (None without): its `rank`, `size`, `ulysses`
and `ring` degrees, and `gather(t, dim)` for what needs every token.

This module imports no torch when imported (valid_mean does when called): the login node
reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn

Batch = Mapping[str, Any]
"""What forward gets: tensors, lists and generators by name (above)."""


@dataclass(frozen=True)
class ClipShape:
    """One shape a batch's clips have: one bucket of `data.buckets`."""

    clip_seconds: float
    frames: int
    """T: video frames per clip (clip_seconds x fps, rounded)."""
    resolution: tuple[int, int]
    """[H, W] of every frame."""
    channels: int
    samples: int
    """N: audio samples per clip and channel (clip_seconds x sample_rate, rounded)."""

    @property
    def video_shape(self) -> tuple[int, int, int, int]:
        """[T, 3, H, W] of one sample's video."""
        return (self.frames, 3, *self.resolution)

    @property
    def audio_shape(self) -> tuple[int, int]:
        """[C, N] of one sample's audio."""
        return (self.channels, self.samples)


@dataclass(frozen=True)
class LatentShape:
    """One shape a batch's latents have (data.modalities [latent]): one sample's tensors
    as the encoder gave them, for one bucket the data set was encoded at."""

    bucket: str | None
    """The bucket's name ('64x64x1s'); None for a data set encoded at one shape."""
    clip_seconds: float
    """Length of the clips the latents encode."""
    tensors: Mapping[str, tuple[int, ...]]
    """One sample's shape of each tensor, by name ("video": (T, C, h, w), ...)."""
    dtypes: Mapping[str, str]
    """Each tensor's dtype ("float16", "bfloat16", "float32", ...), by name."""


@dataclass(frozen=True)
class DataShapes:
    """The shapes of the run's clips (the loader crops and resizes to them).

    Without `data.buckets`, every clip has the one shape the fields below give. With
    buckets, `buckets` holds each bucket's shape (in `data.buckets`' order) and the
    fields below give the largest of each over the buckets: the longest clip, the most
    frames and samples, the largest H and the largest W (which may come from two
    buckets): a box every bucket's clips fit in, for sizing position tables."""

    modalities: tuple[str, ...]
    """What the data set's samples hold and the loader decodes: 'video', 'audio', ..."""
    clip_seconds: float
    fps: int
    frames: int
    """T: video frames per clip (clip_seconds x fps, rounded)."""
    resolution: tuple[int, int]
    """[H, W] of every frame."""
    sample_rate: int
    channels: int
    samples: int
    """N: audio samples per clip and channel (clip_seconds x sample_rate, rounded)."""
    buckets: tuple[ClipShape, ...] = ()
    """Each bucket's shape, in `data.buckets`' order; empty without buckets."""
    latents: tuple[LatentShape, ...] = ()
    """With data.modalities [latent]: the latents' shapes, one per clip shape (in the
    order of `clip_shapes`); empty otherwise. The fields above then describe the clips
    the latents were encoded from (the encode's decode settings)."""

    @property
    def video_shape(self) -> tuple[int, int, int, int]:
        """[T, 3, H, W] of one sample's video (with buckets: the largest of each)."""
        return (self.frames, 3, *self.resolution)

    @property
    def audio_shape(self) -> tuple[int, int]:
        """[C, N] of one sample's audio (with buckets: the longest)."""
        return (self.channels, self.samples)

    @property
    def clip_shapes(self) -> tuple[ClipShape, ...]:
        """Every shape a batch may have: the buckets', or without buckets the one shape."""
        if self.buckets:
            return self.buckets
        only = ClipShape(
            self.clip_seconds, self.frames, self.resolution, self.channels, self.samples
        )
        return (only,)


@runtime_checkable
class TrainableModel(Protocol):
    """The one method a model must have (the optional ones are in the module's doc)."""

    def forward(self, batch: Batch) -> torch.Tensor | tuple[torch.Tensor, Mapping[str, Any]]:
        """The training loss of the batch, a scalar; or (loss, {name: scalar})."""
        ...

    def parameters(self, recurse: bool = True) -> Iterable[nn.Parameter]: ...


def valid_mean(per_sample: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The mean of `per_sample` [B] (one loss per row) over the rows of `batch` whose
    `valid` is True: rows that stand in for a skipped sample add nothing to the loss
    and get an exact zero gradient. 0 (not NaN) when no row is valid; the plain mean
    when the batch has no "valid" (a batch not from stoker's loader).

        per_sample = ((predicted - target) ** 2).flatten(1).mean(dim=1)
        return valid_mean(per_sample, batch)

    A non-finite value in a stand-in row does not reach the loss either (it is
    selected away, not multiplied by 0). Works under torch.compile and on meta tensors.
    """
    import torch

    if per_sample.dim() != 1:
        raise ValueError(
            f"valid_mean takes one loss per sample, a [B] tensor; got shape "
            f"{tuple(per_sample.shape)} (reduce the other dims first, e.g. .flatten(1).mean(1))"
        )
    valid = batch.get("valid")
    if valid is None:
        return per_sample.mean()
    if tuple(valid.shape) != tuple(per_sample.shape):
        raise ValueError(
            f"batch['valid'] has shape {tuple(valid.shape)} but the losses "
            f"{tuple(per_sample.shape)}: give one loss per row of the batch"
        )
    valid = valid.to(device=per_sample.device, dtype=torch.bool)
    kept = torch.where(valid, per_sample, torch.zeros_like(per_sample))
    mean: torch.Tensor = kept.sum() / valid.sum().clamp(min=1).to(per_sample.dtype)
    return mean


class ContextParallel(Protocol):
    """The context parallelism a rank trains with (the module doc; implemented by the
    runtime, stoker/runtime/models/context_parallel.py)."""

    rank: int
    """This rank's index in its CP group: it holds the group's rank-th share of tokens."""
    size: int
    """N: the ranks that split each sample's tokens."""
    ulysses: int
    """Of N, the ranks that exchange heads (all-to-all); N / ulysses pass K/V in a ring."""
    ring: int

    def token_slice(self, tokens: int) -> slice: ...

    def sum(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor: ...

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        scale: float | None = None,
    ) -> torch.Tensor: ...


_active: ContextParallel | None = None


def context_parallel() -> ContextParallel | None:
    """The context parallelism this process trains with; None without."""
    return _active


def set_context_parallel(cp: ContextParallel | None) -> ContextParallel | None:
    """Make `cp` the active context parallelism (None: none); returns the one before.
    The runtime calls it when it sets up the ranks; a test of a model may too."""
    global _active
    before, _active = _active, cp
    return before


def token_slice(tokens: int) -> slice:
    """The slice of a sequence of `tokens` this rank computes: all of it without context
    parallelism; a ValueError when the tokens do not split evenly over the CP ranks."""
    return _active.token_slice(tokens) if _active is not None else slice(0, tokens)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries over every rank's keys and values, q, k, v
    [B, heads, tokens, head_dim] with the tokens of `token_slice`; without context
    parallelism, torch's scaled_dot_product_attention (in fp32 for bf16 inputs on a CPU
    up to CPU_FP32_ATTENTION_TOKENS, where that is the faster). Causal attention takes
    Ulysses only (train.context_parallel_ulysses equal to train.context_parallel)."""
    if _active is not None:
        return _active.attention(q, k, v, causal=causal, scale=scale)
    import torch
    import torch.nn.functional as F

    if (
        q.dtype == torch.bfloat16
        and q.device.type == "cpu"
        and max(q.shape[-2], k.shape[-2]) <= CPU_FP32_ATTENTION_TOKENS
    ):
        # torch's bf16 flash attention on CPU costs 2-3x its fp32 below ~256 tokens, most
        # of it in backward (docs/runtime.md); above, bf16 is the faster. Autocast would
        # cast the fp32 inputs back to bf16, hence off around the call.
        with torch.autocast("cpu", enabled=False):
            wide = F.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=causal, scale=scale
            )
        return wide.to(q.dtype)
    out: torch.Tensor = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return out


CPU_FP32_ATTENTION_TOKENS = 256
"""The longest sequence whose bf16 attention on a CPU is computed in fp32 (and its output
cast back to bf16): there it is the faster of the two."""


def cp_sum(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` summed over the context-parallel ranks (itself without): see the module
    doc for the loss."""
    return _active.sum(tensor) if _active is not None else tensor
