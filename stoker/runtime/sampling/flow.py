"""Sampling the av_dit: its flow-matching ODE integrated from noise back to data.

Training (stoker.runtime.models.av_dit) puts the data x at t = 0 and the noise eps at
t = 1 on the straight line x_t = (1 - t) x + t eps, and teaches the model the velocity
v = dx_t/dt = eps - x. Sampling runs that ODE backwards: x = eps ~ N(0, I) at t = 1,
then dx/dt = v(x, t) down to t = 0 over N steps, uniform in t, or in the shifted time
of a model trained with model.args.time_shift (av_dit.shift_time: the same steps spent
where it was trained).

- "euler": x <- x + (t' - t) v(x, t); N model calls, first order (the error halves
  when N doubles).
- "heun": Euler's step as a predictor, then the mean of v at both ends (EDM's
  sampler); 2N - 1 model calls, second order (the error quarters when N doubles).
  Its last step is Euler's, so the model is never asked at t = 0, where even a perfect
  model's v = (x_t - x) / t is 0 / 0.

Each sample's noise comes from its own generator, drawn in fp32 on the model's device,
video before audio: a sample depends on its generator only, never on the batch it is
drawn in. The state stays fp32 between steps; the model computes in its own dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, get_args

import torch

from stoker.runtime.models.av_dit import AVDiT, shift_time
from stoker.runtime.models.patches import unpatchify_audio, unpatchify_video

FlowMethod = Literal["euler", "heun"]
FLOW_METHODS: tuple[FlowMethod, ...] = get_args(FlowMethod)
Tokens = dict[str, torch.Tensor]
Velocity = Callable[[Tokens, torch.Tensor], Tokens]
"""(x [B, tokens, width] by modality, t [B] fp32) -> v in the same layout."""
OnStep = Callable[[int, int], None]
"""(steps done, steps in all): called after each solver step, for a progress bar."""


def check_flow_settings(steps: int, method: str) -> None:
    """A ValueError naming the bad value: steps must be 1 or more, method one of
    FLOW_METHODS."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps {steps!r} must be a whole number of solver steps, 1 or more")
    if method not in FLOW_METHODS:
        raise ValueError(f"method {method!r} is not one of {', '.join(FLOW_METHODS)}")


def solve_flow(
    velocity: Velocity,
    noise: Tokens,
    steps: int,
    method: FlowMethod = "heun",
    on_step: OnStep | None = None,
    time_shift: float = 1.0,
) -> Tokens:
    """x at t = 0, from x = `noise` at t = 1 along dx/dt = velocity(x, t), in `steps`
    steps of `method` (module docstring), uniform in t shifted by `time_shift`. Each
    modality keeps its dtype."""
    check_flow_settings(steps, method)
    x = dict(noise)
    first = next(iter(x.values()))
    batch, device = first.shape[0], first.device
    # 1 - i / steps is exact at both ends, and the shift keeps them: t starts at 1.0 and
    # ends at 0.0.
    times = [shift_time(1.0 - i / steps, time_shift) for i in range(steps + 1)]

    def at(t: float) -> torch.Tensor:
        return torch.full((batch,), t, device=device, dtype=torch.float32)

    for i in range(steps):
        dt = times[i + 1] - times[i]
        v = in_dtypes_of(x, velocity(x, at(times[i])))
        stepped = {name: x[name] + dt * v[name] for name in x}
        if method == "heun" and i < steps - 1:
            v_next = in_dtypes_of(x, velocity(stepped, at(times[i + 1])))
            stepped = {name: x[name] + (0.5 * dt) * (v[name] + v_next[name]) for name in x}
        x = stepped
        if on_step is not None:
            on_step(i + 1, steps)
    return x


def in_dtypes_of(x: Tokens, v: Tokens) -> Tokens:
    """v with each modality in x's dtype (the model may answer in bf16)."""
    return {name: v[name].to(x[name].dtype) for name in x}


def token_shapes(
    model: AVDiT, grid: tuple[int, int, int] | None, audio_tokens: int | None
) -> dict[str, tuple[int, int]]:
    """(tokens, width) of one sample per modality, for a clip of `grid` video patches
    and `audio_tokens` audio tokens (None: the model's largest clip's); a ValueError for
    a clip that does not fit the model."""
    shapes = {}
    if model.video_grid is not None:
        grid = grid or model.video_grid
        if len(grid) != 3 or not all(
            0 < n <= most for n, most in zip(grid, model.video_grid, strict=True)
        ):
            raise ValueError(
                f"video grid {grid} does not fit this av_dit's largest grid {model.video_grid} "
                f"(patches of {model.size.video_patch}): give (T/pt, H/ph, W/pw) of a bucket"
            )
        pt, ph, pw = model.size.video_patch
        shapes["video"] = (math.prod(grid), pt * ph * pw * model.video_channels)
    elif grid is not None:
        raise ValueError(f"video grid {grid} given, but this av_dit has no video")
    if model.audio is not None:
        tokens = audio_tokens or model.audio_tokens
        if not 0 < tokens <= model.audio_tokens:
            raise ValueError(
                f"{tokens} audio tokens do not fit this av_dit's {model.audio_tokens} "
                f"(patches of {model.size.audio_patch} samples)"
            )
        shapes["audio"] = (tokens, model.audio[0] * model.size.audio_patch)
    elif audio_tokens is not None:
        raise ValueError(f"{audio_tokens} audio tokens given, but this av_dit has no audio")
    return shapes


def tokens_to_media(
    model: AVDiT, tokens: Tokens, grid: tuple[int, int, int] | None
) -> dict[str, torch.Tensor]:
    """Clean tokens back to clips: video uint8 [B, T, 3, H, W] (the inverse of training's
    uint8 / 127.5 - 1, rounded and clamped) and audio float32 [B, C, N] clamped to
    [-1, 1]; on latents float32 "video" [B, T, C, h, w] and "audio" [B, A, n], unscaled
    and unclamped, as the encoder gives them."""
    media = {}
    if "video" in tokens:
        assert grid is not None
        patch = model.size.video_patch
        frames, height, width = (n * p for n, p in zip(grid, patch, strict=True))
        shape = (frames, model.video_channels, height, width)
        video = unpatchify_video(tokens["video"].float(), patch, shape)
        if not model.latent:
            video = ((video + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
        media["video"] = video
    if "audio" in tokens:
        assert model.audio is not None
        audio = unpatchify_audio(tokens["audio"].float(), model.size.audio_patch, model.audio[0])
        media["audio"] = audio if model.latent else audio.clamp(-1.0, 1.0)
    return media


def check_prompts(
    model: AVDiT, prompts: Sequence[str | None] | None, count: int, guidance: float
) -> None:
    """A ValueError naming the fix for prompts an av_dit cannot take."""
    if not math.isfinite(guidance) or guidance < 0:
        raise ValueError(f"guidance {guidance!r} must be 0 or more (1: no guidance)")
    if prompts is None:
        return
    if len(prompts) != count:
        raise ValueError(f"{len(prompts)} prompts for {count} samples: give one per sample")
    conditioner = model.conditioner
    if conditioner is None:
        if any(p is not None for p in prompts):
            raise ValueError(
                "prompts given, but this av_dit was trained without conditioning: leave "
                "them out, or train with model.args.condition caption or class"
            )
        return
    classes = list(conditioner.args.classes)
    unknown = sorted({p for p in prompts if p is not None and classes and p not in classes})
    if unknown:
        raise ValueError(f"prompts {unknown} are not among this model's classes {classes}")


@torch.no_grad()
def sample_av_dit(
    model: AVDiT,
    generators: Sequence[torch.Generator],
    *,
    steps: int = 50,
    method: FlowMethod = "heun",
    grid: tuple[int, int, int] | None = None,
    audio_tokens: int | None = None,
    on_step: OnStep | None = None,
    prompts: Sequence[str | None] | None = None,
    guidance: float = 1.0,
) -> dict[str, torch.Tensor]:
    """len(generators) clips from `model` (tokens_to_media's layouts), one per generator
    (each on the model's device), integrating the flow in `steps` steps of `method`.

    The clip is the model's largest unless `grid` (video patches (T/pt, H/ph, W/pw))
    or `audio_tokens` (N / the audio patch) name a smaller one, as a bucket's. The model
    is put in eval mode for the duration and back in its mode afterwards.

    `prompts`: a conditioned model's caption or class label per sample (None: no
    condition); `guidance` w: classifier-free guidance, v = v(none) + w (v(prompt) -
    v(none)), both halves in one batch of 2B (w = 1: the conditional v alone)."""
    check_flow_settings(steps, method)
    if not generators:
        raise ValueError("no generators: give one per sample to draw")
    check_prompts(model, prompts, len(generators), guidance)
    shapes = token_shapes(model, grid, audio_tokens)
    device = next(model.parameters()).device
    for g in generators:
        if g.device != device:
            raise ValueError(
                f"a generator is on {g.device} but the model on {device}: make them with "
                f"torch.Generator(device={str(device)!r})"
            )
    noise = {
        name: torch.stack([torch.randn(shape, generator=g, device=device) for g in generators])
        for name, shape in shapes.items()
    }
    video_grid = (grid or model.video_grid) if "video" in shapes else None

    def velocity(x: Tokens, t: torch.Tensor) -> Tokens:
        if prompts is None:  # as before conditioning: a subclass's velocity(x, t, grid)
            return model.velocity(x, t, video_grid)
        if guidance == 1.0:
            return model.velocity(x, t, video_grid, prompts)
        doubled = {name: torch.cat((value, value)) for name, value in x.items()}
        none: list[str | None] = [None] * len(prompts)
        v = model.velocity(doubled, torch.cat((t, t)), video_grid, [*prompts, *none])
        guided = {}
        for name, both in v.items():
            conditional, unconditional = both.float().chunk(2)
            guided[name] = unconditional + guidance * (conditional - unconditional)
        return guided

    was_training = model.training
    model.eval()
    try:
        clean = solve_flow(velocity, noise, steps, method, on_step, model.time_shift)
    finally:
        model.train(was_training)
    return tokens_to_media(model, clean, video_grid)
