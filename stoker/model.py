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
- `flops_per_sample(batch)` -> training FLOPs (forward + backward) of one sample.
  Optional: without it there is no MFU, said once in the log.
- `sample(...)`: generation, used for logged samples (a later milestone). Optional.

The batch (`Batch`) holds what the loader decoded, as `data.modalities` asks: "video"
uint8 [B, T, 3, H, W], "audio" float32 [B, C, N], "text" (the captions, a list of
strings), "meta" (the `.json` members, a list of dicts); "valid" bool [B] (False for a
row that repeats another because its sample could not be decoded or transformed),
"position" int64 [B] (each sample's place in the data order), and "generators": one
`torch.Generator` per sample on the batch's device, seeded by (train.seed, the sample's
position in the data order): draw noise from them and the losses are the same whatever
the number of ranks and restarts; the global RNG works too, without that guarantee.

Array members pass through whatever `data.modalities` says: each `.npy` and
`.safetensors` member that every sample of the data set has, under its extension
("npy", "latent.npy", "safetensors"). A `.npy` is a tensor of its stored dtype (never
unpickled); a `.safetensors` a dict of tensors by name. Tensors of one shape and dtype
in every row are stacked [B, ...]; where they differ, the key holds a list of B
tensors (and a `.safetensors` dict, a dict of those). What `data.transform` adds is
collated the same way; values that are not tensors come as lists. Stacked tensors
arrive on the model's device; lists and dicts stay on the host for forward to move.

This module imports no torch: the login node reads it.
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
class DataShapes:
    """The shapes every clip of the run has (the loader crops and resizes to them)."""

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

    @property
    def video_shape(self) -> tuple[int, int, int, int]:
        """[T, 3, H, W] of one sample's video."""
        return (self.frames, 3, *self.resolution)

    @property
    def audio_shape(self) -> tuple[int, int]:
        """[C, N] of one sample's audio."""
        return (self.channels, self.samples)


@runtime_checkable
class TrainableModel(Protocol):
    """The one method a model must have (the optional ones are in the module's doc)."""

    def forward(self, batch: Batch) -> torch.Tensor | tuple[torch.Tensor, Mapping[str, Any]]:
        """The training loss of the batch, a scalar; or (loss, {name: scalar})."""
        ...

    def parameters(self, recurse: bool = True) -> Iterable[nn.Parameter]: ...
