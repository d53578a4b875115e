"""Sampling the built-in models and a plugin's: media shapes and ranges, seeds (the same
seed gives the same sample, whatever batch it is drawn in), the flow solvers' order
and exactness, autoregressive draws, and the plugin contract."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from stoker.config import DataConfig, ModelConfig
from stoker.errors import StokerError
from stoker.runtime.models import AV_DIT_SIZES, AudioAR, AVDiT, build_model
from stoker.runtime.models.audio_ar import BOS
from stoker.runtime.models.mu_law import mu_law_decode, mu_law_encode
from stoker.runtime.sampling.autoregressive import sample_audio_ar
from stoker.runtime.sampling.draw import sample_model
from stoker.runtime.sampling.flow import Tokens, sample_av_dit, solve_flow
from tests.runtime.batches import data_config, random_batch
from tests.runtime.sampled_models import generators, scrambled

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The smallest clips the tiny presets' patches allow: 4 frames of 16x16 (8 video
# tokens), 800 samples (2 audio tokens); the audio_ar's 48 samples.
AV = data_config(clip_seconds=0.5, fps=8, resolution=(16, 16), sample_rate=1600)
VIDEO_ONLY = data_config(clip_seconds=0.5, fps=8, resolution=(16, 16), modalities=["video"])
AUDIO_ONLY = data_config(clip_seconds=0.5, sample_rate=1600, channels=2, modalities=["audio"])
AR = data_config(clip_seconds=0.003, sample_rate=16000, modalities=["audio"])


def built(arch: str, data: DataConfig) -> nn.Module:
    return build_model(ModelConfig(arch=arch, size="tiny"), data)  # type: ignore[arg-type]


def av_dit(data: DataConfig) -> AVDiT:
    model = built("av_dit", data)
    assert isinstance(model, AVDiT)
    return scrambled(model)


def latent_av_dit() -> AVDiT:
    """As stoker.runtime.models.build makes one on latents: video [4, 4, 4, 4], audio
    [8, 8], patches (2, 2, 2) and 4."""
    size = replace(AV_DIT_SIZES["tiny"], video_patch=(2, 2, 2), audio_patch=4)
    model = AVDiT(size, video=(4, 4, 4), audio=(8, 8), fps=8.0, sample_rate=16.0,
                  video_channels=4, latent=True)  # fmt: skip
    return scrambled(model)


def audio_ar() -> AudioAR:
    model = built("audio_ar", AR)
    assert isinstance(model, AudioAR)
    return scrambled(model)


# --- av_dit: shapes, seeds --------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (AV, {"video": (2, 4, 3, 16, 16), "audio": (2, 1, 800)}),
        (VIDEO_ONLY, {"video": (2, 4, 3, 16, 16)}),
        (AUDIO_ONLY, {"audio": (2, 2, 800)}),
    ],
    ids=["av", "video", "audio"],
)
def test_av_dit_samples_media(data: DataConfig, expected: dict[str, tuple[int, ...]]) -> None:
    model = av_dit(data)
    model.train()
    out = sample_model(model, seeds=[0, 1], steps=3, method="heun")
    assert model.training  # its mode back
    assert {name: tuple(x.shape) for name, x in out.items()} == expected
    if "video" in out:
        assert out["video"].dtype == torch.uint8
        assert len(out["video"].unique()) > 10  # not all clamped to 0 or 255
    if "audio" in out:
        audio = out["audio"]
        assert audio.dtype == torch.float32 and float(audio.abs().max()) <= 1.0
        assert float(audio.std()) > 0.01
    assert not any(x.requires_grad for x in out.values())


def test_latent_av_dit_returns_the_latents_unscaled() -> None:
    model = latent_av_dit()
    out = sample_model(model, seeds=[0, 1, 2], steps=2, method="euler")
    assert out["video"].shape == (3, 4, 4, 4, 4) and out["audio"].shape == (3, 8, 8)
    assert all(x.dtype == torch.float32 for x in out.values())
    # Not clamped: latents have no range (scrambled weights push v well past 1).
    assert max(float(x.abs().max()) for x in out.values()) > 1.0


def test_a_bucket_smaller_than_the_largest_clip() -> None:
    model = av_dit(AV)
    out = sample_av_dit(model, generators(0), steps=1, grid=(1, 2, 1), audio_tokens=1)
    assert out["video"].shape == (1, 2, 3, 16, 8) and out["audio"].shape == (1, 1, 400)
    with pytest.raises(ValueError, match=r"video grid \(3, 2, 2\) does not fit"):
        sample_av_dit(model, generators(0), steps=1, grid=(3, 2, 2))


def test_the_same_seed_gives_the_same_sample_in_any_batch() -> None:
    model = av_dit(AV)
    first = sample_model(model, seeds=[5, 6], steps=2)
    again = sample_model(model, seeds=[5, 6], steps=2)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["video"][0], first["video"][1])
    # Seed 6 alone, and between two others: the sample does not depend on its batch
    # (up to the last bits of batched matmuls: one uint8 level, 1e-5 of audio).
    for seeds, row in (([6], 0), ([9, 6, 5], 1)):
        other = sample_model(model, seeds=seeds, steps=2)
        video_diff = (other["video"][row].int() - first["video"][1].int()).abs().max()
        assert int(video_diff) <= 1
        torch.testing.assert_close(other["audio"][row], first["audio"][1], atol=1e-5, rtol=0)


# --- the flow solvers ---------------------------------------------------------------


def test_heun_is_second_order_and_euler_first() -> None:
    """dx/dt = t x from x(1) = 1: x(0) = exp(-1/2). Doubling the steps halves Euler's
    error and quarters Heun's (its last Euler step is a second-order error too)."""

    def velocity(x: Tokens, t: torch.Tensor) -> Tokens:
        return {"x": t.double()[:, None, None] * x["x"]}

    exact = math.exp(-0.5)
    noise = {"x": torch.ones(1, 1, 1, dtype=torch.float64)}

    def error(steps: int, method: str) -> float:
        x = solve_flow(velocity, noise, steps, method)  # type: ignore[arg-type]
        return abs(float(x["x"]) - exact)

    for method, order in (("euler", 1), ("heun", 2)):
        errors = [error(steps, method) for steps in (16, 32, 64)]
        for coarse, fine in itertools.pairwise(errors):
            assert coarse / fine == pytest.approx(2**order, rel=0.1), (method, errors)
    assert error(16, "heun") < error(16, "euler") / 10


class PerfectVelocity(AVDiT):
    """The exact velocity towards one clean clip x0 per row: v = eps - x0 = (x_t - x0)/t."""

    x0: Tokens = {}  # noqa: RUF012 (set per test)

    def velocity(
        self, x_t: Tokens, t: torch.Tensor, grid: tuple[int, int, int] | None = None
    ) -> Tokens:
        return {name: (x - self.x0[name]) / t[:, None, None] for name, x in x_t.items()}


@pytest.mark.parametrize(("steps", "method"), [(1, "euler"), (4, "euler"), (4, "heun")])
def test_the_perfect_velocity_lands_on_the_data(steps: int, method: str) -> None:
    """The training path is straight: with v = eps - x0, one Euler step from t = 1 lands on
    x0, and so does any number of steps of either method."""
    model = PerfectVelocity(
        AV_DIT_SIZES["tiny"], video=(4, 16, 16), audio=(1, 800), fps=8, sample_rate=1600
    )
    batch = random_batch(AV, 2, seed=3)
    model.x0 = model.clean_tokens(batch)
    out = sample_av_dit(model, generators(0, 1), steps=steps, method=method)  # type: ignore[arg-type]
    assert torch.equal(out["video"], batch["video"])
    torch.testing.assert_close(out["audio"], batch["audio"], atol=1e-6, rtol=0)


def test_flow_settings_are_checked() -> None:
    model = av_dit(AUDIO_ONLY)
    with pytest.raises(ValueError, match="steps 0 must be"):
        sample_model(model, seeds=[0], steps=0)
    with pytest.raises(ValueError, match="method 'rk4' is not one of euler, heun"):
        sample_model(model, seeds=[0], method="rk4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no seeds"):
        sample_model(model, seeds=[])


# --- audio_ar -----------------------------------------------------------------------


def test_audio_ar_samples_audio_by_seed() -> None:
    model = audio_ar()
    out = sample_model(model, seeds=[0, 1, 2])
    audio = out["audio"]
    assert list(out) == ["audio"] and audio.shape == (3, 1, 48) and audio.dtype == torch.float32
    assert float(audio.abs().max()) <= 1.0
    # Every value is a mu-law level.
    assert torch.equal(mu_law_decode(mu_law_encode(audio)), audio)
    assert not torch.equal(audio[0], audio[1])
    again = sample_model(model, seeds=[2, 0])["audio"]
    assert torch.equal(again[0], audio[2]) and torch.equal(again[1], audio[0])


def test_audio_ar_top_k_1_is_greedy() -> None:
    model = audio_ar()
    tokens = torch.full((2, 1), BOS)
    with torch.no_grad():
        for _ in range(20):
            tokens = torch.cat((tokens, model.logits(tokens)[:, -1].argmax(-1)[:, None]), dim=1)
    greedy = mu_law_decode(tokens[:, 1:])[:, None]
    drawn = sample_audio_ar(model, generators(3, 4), samples=20, top_k=1, temperature=2.0)
    assert torch.equal(drawn["audio"], greedy)


def test_audio_ar_prompt_starts_every_sample() -> None:
    model = audio_ar()
    prompt = torch.linspace(-0.5, 0.5, 10)[None].expand(2, 10)  # stereo [C, P]
    out = sample_audio_ar(model, generators(0, 1), samples=16, prompt=prompt, top_k=8)
    assert out["audio"].shape == (2, 1, 16)
    levels = mu_law_decode(mu_law_encode(prompt.mean(dim=0)))
    assert torch.equal(out["audio"][:, 0, :10], levels.expand(2, 10))
    with pytest.raises(ValueError, match="leave none of the 10 to draw"):
        sample_audio_ar(model, generators(0), samples=10, prompt=prompt)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": 0.0}, "temperature 0.0 must be a finite number above 0"),
        ({"temperature": -1.0}, "temperature -1.0 must be"),
        ({"temperature": math.inf}, "temperature inf must be"),
        ({"temperature": math.nan}, "temperature nan must be"),
        ({"top_k": 0}, "top_k 0 must be None .* or a whole number from 1 to 256"),
        ({"top_k": 257}, "top_k 257 must be"),
        ({"samples": 49}, "samples 49 must be from 1 to 48"),
    ],
)
def test_audio_ar_settings_are_checked(settings: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sample_audio_ar(audio_ar(), generators(0), **settings)  # type: ignore[arg-type]


# --- plugins ------------------------------------------------------------------------


class OwnSampler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2, 2)
        self.calls: list[tuple[int, int, bool, bool]] = []

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.proj.weight.sum()

    def sample(self, generators: list[torch.Generator], steps: int) -> dict[str, torch.Tensor]:
        self.calls.append((len(generators), steps, self.training, torch.is_grad_enabled()))
        audio = torch.stack([torch.rand(1, 8, generator=g) * 2 - 1 for g in generators])
        return {"audio": audio}


def test_a_plugin_sample_method_is_called() -> None:
    model = OwnSampler()
    out = sample_model(model, seeds=[4, 5, 6], steps=7)
    assert model.calls == [(3, 7, False, False)] and model.training
    assert out["audio"].shape == (3, 1, 8)
    assert torch.equal(out["audio"][1], sample_model(model, seeds=[5], steps=7)["audio"][0])


def test_a_plugin_sample_returning_other_rows_is_refused() -> None:
    model = OwnSampler()
    model.sample = lambda generators, steps: {"audio": torch.zeros(1, 8)}  # type: ignore[method-assign]
    with pytest.raises(StokerError, match=r"OwnSampler.sample\(\) returned \{'audio': \(1, 8\)\}"):
        sample_model(model, seeds=[0, 1])


def test_a_model_without_sample_is_refused_with_the_fix() -> None:
    class Plain(nn.Module):
        def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return torch.zeros(())

    with pytest.raises(StokerError) as info:
        sample_model(Plain(), seeds=[0])
    assert "Plain has no sample() method" in info.value.message
    assert info.value.fix is not None
    assert "sample(self, generators: list[torch.Generator], steps: int)" in info.value.fix
