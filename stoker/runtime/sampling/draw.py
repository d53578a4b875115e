"""Samples from a model, seeded: video to watch and audio to hear.

`sample_model(model, seeds=[...], steps=..., method=...)` draws one sample per seed
and returns them by modality in the batch's layouts (stoker/model.py): "video" uint8
[B, T, 3, H, W] and "audio" float32 [B, C, N] in [-1, 1]. By model:

- the av_dit (stoker.runtime.sampling.flow): its flow ODE from noise to data, in
  `steps` "euler" or "heun" steps, on its largest clip. On latents it returns the
  latents as the encoder gives them, float32 "video" [B, T, C, h, w] and "audio"
  [B, A, n], for the encoder's decoder to make media of.
- the audio_ar (stoker.runtime.sampling.autoregressive): one mu-law code per step, drawn with
  `temperature` and `top_k`, its longest sequence: "audio" [B, 1, N]. `steps` and
  `method` mean nothing to it.
- a model of your own, with a method

      def sample(self, generators: list[torch.Generator], steps: int) -> dict[str, torch.Tensor]

  called as `model.sample(generators, steps)`: one generator per sample to draw,
  seeded and on the model's device (draw all randomness from them and a sample
  depends on its seed alone); `steps` the caller's budget of model calls per
  sample (a diffusion solver's steps; ignore it where it means nothing). Return the
  samples by name, each a tensor [len(generators), ...], media in the layouts above.
  A built-in model's subclass with its own `sample` gets the same call.

Every model samples under torch.no_grad, in eval mode, and is put back in its own mode
afterwards. Sample b depends on seeds[b] only (one generator per sample, as training's
per-sample noise), so the batch a seed is drawn in does not change its sample, up to
the last bits of the batched matmuls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from stoker.errors import StokerError
from stoker.runtime.models.audio_ar import AudioAR
from stoker.runtime.models.av_dit import AVDiT
from stoker.runtime.models.contract import model_class_name
from stoker.runtime.sampling.autoregressive import sample_audio_ar
from stoker.runtime.sampling.flow import (
    FlowMethod,
    OnStep,
    check_flow_settings,
    check_prompts,
    sample_av_dit,
)


def device_of(model: nn.Module) -> torch.device:
    """Where the model's first parameter (else buffer) lives; the CPU for neither."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def seeded_generators(seeds: Sequence[int], device: torch.device) -> list[torch.Generator]:
    """One generator per seed on `device`, each seeded with its seed."""
    return [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]


def sample_model(
    model: nn.Module,
    *,
    seeds: Sequence[int],
    steps: int = 50,
    method: FlowMethod = "heun",
    temperature: float = 1.0,
    top_k: int | None = None,
    on_step: OnStep | None = None,
    prompts: Sequence[str | None] | None = None,
    guidance: float = 1.0,
) -> dict[str, torch.Tensor]:
    """len(seeds) samples of `model` by modality (module docstring): its own
    `sample(generators, steps)` where it has one, else the built-in sampler of an
    av_dit (`steps`, `method`) or an audio_ar (`temperature`, `top_k`); a StokerError
    for a model with neither. `on_step(done, total)` follows a built-in sampler's
    steps (a model's own sample() is one call). `prompts` (one per seed) and
    `guidance` condition a conditioned av_dit (flow_sampling.sample_av_dit); a model's
    own sample() gets them as keywords when prompts are given."""
    if not seeds:
        raise ValueError("no seeds: give one per sample to draw")
    check_flow_settings(steps, method)
    check_samplable(model)
    own = getattr(model, "sample", None)
    generators = seeded_generators(seeds, device_of(model))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if callable(own):
                extra = {"prompts": prompts, "guidance": guidance} if prompts is not None else {}
                return checked_samples(model, own(generators, steps, **extra), len(seeds))
            if isinstance(model, AVDiT):
                try:
                    check_prompts(model, prompts, len(seeds), guidance)
                except ValueError as exc:
                    raise StokerError(
                        str(exc),
                        fix="--prompt takes a caption, or a class label of model.args.classes",
                    ) from None
                return sample_av_dit(
                    model,
                    generators,
                    steps=steps,
                    method=method,
                    on_step=on_step,
                    prompts=prompts,
                    guidance=guidance,
                )
            if prompts is not None and any(p is not None for p in prompts):
                raise StokerError("the audio_ar takes no prompts", fix="leave out the prompts")
            assert isinstance(model, AudioAR)
            return sample_audio_ar(
                model, generators, temperature=temperature, top_k=top_k, on_step=on_step
            )
    finally:
        model.train(was_training)


def check_samplable(model: nn.Module) -> None:
    """A StokerError with the fix for a model stoker cannot sample: neither a
    `sample()` method nor a built-in model."""
    if not callable(getattr(model, "sample", None)) and not isinstance(model, AVDiT | AudioAR):
        raise StokerError(
            f"{model_class_name(model)} has no sample() method, and stoker samples only its "
            "built-in models (av_dit, audio_ar) without one",
            fix="give the model a method `sample(self, generators: list[torch.Generator], "
            "steps: int) -> dict[str, torch.Tensor]` returning one sample per generator "
            "(stoker/runtime/sampling/draw.py), or set train.sample_every=0",
        )


def checked_samples(model: nn.Module, out: object, count: int) -> dict[str, torch.Tensor]:
    """A model's own samples as a dict, or a StokerError saying what it returned."""
    if (
        isinstance(out, Mapping)
        and out
        and all(
            isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == count
            for value in out.values()
        )
    ):
        return {str(name): value for name, value in out.items()}
    got: object = type(out).__name__
    if isinstance(out, Mapping):
        got = {
            str(k): tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
            for k, v in out.items()
        }
    raise StokerError(
        f"{model_class_name(model)}.sample() returned {got}, not a non-empty dict of tensors "
        f"with one row per generator ({count})",
        fix="return {name: tensor [len(generators), ...]}, e.g. {'video': uint8 "
        "[B, T, 3, H, W], 'audio': float32 [B, C, N]} (stoker/runtime/sampling/draw.py)",
    )
