"""The two models of the runtime: shapes, exact invariants (patchify round trip,
adaLN-zero, no cross-sample leakage, causality), learning on CPU, presets and
build errors."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from stoker.config import DataConfig, ModelConfig
from stoker.kernels import rope_table_3d
from stoker.kernels.rope import default_sections
from stoker.model import CPU_FP32_ATTENTION_TOKENS, attention
from stoker.runtime.models import (
    AUDIO_AR_SIZES,
    AV_DIT_SIZES,
    SIZE_NAMES,
    AudioAR,
    AVDiT,
    TrainingModel,
    build_model,
)
from stoker.runtime.models.av_dit import MIN_DATA_T
from stoker.runtime.models.build import DataDoesNotFitModel, ModelSetupError
from stoker.runtime.models.mu_law import mu_law_decode, mu_law_encode
from stoker.runtime.models.patches import (
    patchify_audio,
    patchify_video,
    unpatchify_audio,
    unpatchify_video,
)
from stoker.runtime.sampling.draw import sample_model
from tests.runtime.batches import data_config, moving_square_batch, random_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Small clips keep every test here to a second or two on 2 cores.
AV = data_config(clip_seconds=0.5, fps=8, resolution=(32, 32), sample_rate=8000)
VIDEO_ONLY = data_config(clip_seconds=0.5, resolution=(32, 48), modalities=["video", "text"])
AUDIO_ONLY = data_config(clip_seconds=0.5, sample_rate=8000, channels=2, modalities=["audio"])
STEREO_AR = data_config(clip_seconds=0.02, sample_rate=16000, channels=2, modalities=["audio"])


def av_dit(data: DataConfig, size: str = "tiny") -> AVDiT:
    model = build_model(ModelConfig(arch="av_dit", size=size), data)  # type: ignore[arg-type]
    assert isinstance(model, AVDiT)
    return model


def audio_ar(data: DataConfig, size: str = "tiny") -> AudioAR:
    model = build_model(ModelConfig(arch="audio_ar", size=size), data)  # type: ignore[arg-type]
    assert isinstance(model, AudioAR)
    return model


def scramble(model: torch.nn.Module, seed: int = 1) -> None:
    """Random values in every parameter, zero-initialised ones included, so
    that outputs depend on every input path."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1 + (param.dim() == 1))


# --- shapes ----------------------------------------------------------------------


@pytest.mark.parametrize("data", [AV, VIDEO_ONLY, AUDIO_ONLY], ids=["av", "video", "audio"])
def test_av_dit_shapes(data: DataConfig) -> None:
    torch.manual_seed(0)
    model = av_dit(data)
    batch = random_batch(data, 3)
    clean = model.clean_tokens(batch)
    assert list(clean) == list(model.modalities)
    assert sum(x.shape[1] for x in clean.values()) == model.tokens_per_sample()
    x_t, t, target = model.noised(clean)
    assert t.shape == (3,) and bool(((t > 0) & (t < 1)).all())
    predicted = model.velocity(x_t, t)
    for name, x in clean.items():
        assert predicted[name].shape == x.shape == target[name].shape
    loss = model.loss(batch)
    assert loss.dtype == torch.float32 and loss.shape == () and math.isfinite(loss.item())
    if "video" in clean:
        # T/pt x H/ph x W/pw tokens of pt*ph*pw*3 values.
        frames, (height, width) = round(data.clip_seconds * data.fps), data.resolution
        assert clean["video"].shape == (3, frames // 2 * height // 8 * width // 8, 2 * 8 * 8 * 3)
    if "audio" in clean:
        samples = round(data.clip_seconds * data.sample_rate)
        assert clean["audio"].shape == (3, samples // 400, 400 * data.channels)


def test_audio_ar_shapes_stereo() -> None:
    torch.manual_seed(0)
    model = audio_ar(STEREO_AR)
    batch = random_batch(STEREO_AR, 2)
    inputs, targets = model.tokens(batch)
    assert inputs.shape == targets.shape == (2, 320) == (2, model.tokens_per_sample())
    assert bool((inputs[:, 0] == 256).all()) and torch.equal(inputs[:, 1:], targets[:, :-1])
    # Stereo is mixed to mono before coding.
    assert torch.equal(targets, mu_law_encode(batch["audio"].mean(dim=1)))
    assert model.logits(inputs).shape == (2, 320, 256)
    loss = model.loss(batch)
    assert loss.dtype == torch.float32 and loss.shape == ()
    # At initialisation the logits are near uniform: the loss is close to ln 256.
    assert abs(loss.item() - math.log(256)) < 0.1


def test_audio_ar_crops_long_clips_and_takes_shorter_ones_whole() -> None:
    model = audio_ar(data_config(clip_seconds=1.0, modalities=["audio"]))
    assert model.tokens_per_sample() == AUDIO_AR_SIZES["tiny"].max_tokens == 1024
    inputs, targets = model.tokens({"audio": torch.rand(2, 1, 16000) - 0.5})
    assert inputs.shape == (2, 1024)
    # A shorter clip (a shorter bucket) is a shorter sequence, not padding.
    short = {"audio": torch.rand(2, 1, 1000) - 0.5}
    inputs, targets = model.tokens(short)
    assert inputs.shape == targets.shape == (2, 1000) and bool((targets >= 0).all())
    assert model.tokens_per_sample(short) == 1000


# --- exact invariants --------------------------------------------------------------


def test_patchify_round_trip_and_token_order() -> None:
    video = torch.randn(2, 4, 3, 16, 24)
    tokens = patchify_video(video, (2, 8, 8))
    assert tokens.shape == (2, 2 * 2 * 3, 2 * 8 * 8 * 3)
    assert torch.equal(unpatchify_video(tokens, (2, 8, 8), (4, 3, 16, 24)), video)
    # Token s holds the patch at grid (t, h, w), s = (t * H' + h) * W' + w: the row
    # order of rope_table_3d.
    t, h, w = 1, 0, 2
    s = (t * 2 + h) * 3 + w
    patch = video[:, 2 * t : 2 * t + 2, :, 8 * h : 8 * h + 8, 8 * w : 8 * w + 8]
    assert torch.equal(tokens[:, s].sort().values, patch.reshape(2, -1).sort().values)
    audio = torch.randn(2, 3, 1200)
    tokens = patchify_audio(audio, 400)
    assert tokens.shape == (2, 3, 1200)
    assert torch.equal(unpatchify_audio(tokens, 400, 3), audio)
    assert torch.equal(tokens[:, 1].reshape(2, 3, 400), audio[:, :, 400:800])


def test_mu_law_round_trip_within_one_step() -> None:
    x = torch.linspace(-1, 1, 20001, dtype=torch.float64)
    codes = mu_law_encode(x)
    assert int(codes.min()) == 0 and int(codes.max()) == 255
    assert bool((codes.diff() >= 0).all())  # monotonic
    levels = mu_law_decode(torch.arange(256)).double()
    assert bool((levels.diff() > 0).all()) and levels[0] == -1 and levels[255] == 1
    # x lies between its level and a neighbour: the error is at most that one
    # step (rounding happens on the log curve, so not always half of it).
    decoded = mu_law_decode(codes).double()
    gap_up = levels[(codes + 1).clamp(max=255)] - levels[codes]
    gap_down = levels[codes] - levels[(codes - 1).clamp(min=0)]
    step = torch.where(x >= decoded, gap_up, gap_down)
    assert bool(((x - decoded).abs() <= step + 1e-6).all())
    # ... and the code is the nearest level in the companded domain: within 0.6 steps.
    assert bool(((x - decoded).abs() <= 0.6 * torch.maximum(gap_up, gap_down) + 1e-6).all())
    assert int(mu_law_encode(torch.tensor(0.0))) == 128


@pytest.mark.parametrize("data", [AV, AUDIO_ONLY], ids=["av", "audio"])
def test_av_dit_predicts_zero_velocity_at_init(data: DataConfig) -> None:
    """adaLN-zero: every block starts as the identity and the output layer at
    zero, so v = 0 exactly and the first loss is E|eps - x|^2."""
    torch.manual_seed(0)
    model = av_dit(data)
    batch = random_batch(data, 4)
    x_t, t, target = model.noised(model.clean_tokens(batch), torch.Generator().manual_seed(7))
    for v in model.velocity(x_t, t).values():
        assert bool((v == 0).all())
    # Every block starts as the identity (zero gates), whatever its input.
    x = torch.randn(4, model.tokens_per_sample(), 128)
    cond = torch.randn(4, 128)
    for block in model.blocks:
        assert torch.equal(block(x, cond, model.rope_cos, model.rope_sin), x)
    expected = sum(target[name].pow(2).mean() for name in model.modalities)
    loss = model.loss(batch, torch.Generator().manual_seed(7))
    assert loss.item() == pytest.approx(float(expected), rel=1e-6)
    # Uniform noise in [-1, 1]: E[x^2] = 1/3, so about 4/3 per modality.
    assert loss.item() == pytest.approx(4 / 3 * len(model.modalities), rel=0.05)


def test_av_dit_predicting_data_shifts_its_time_in_training_and_sampling() -> None:
    """model.args.prediction=data: the network's output is the clean estimate x^ and
    velocity() gives v = (x_t - x^) / t, t held at MIN_DATA_T or more (x^ = 0 at init, so
    v = x_t / t); model.args.time_shift=3 shifts training's t (SD3) and the sampler's
    grid alike; model.args.pixel_patch replaces the preset's patch; model.args.loss=data
    takes the squared error of x: v's times t^2."""
    args = {"prediction": "data", "time_shift": 3.0, "pixel_patch": [2, 16, 16], "loss": "data"}
    model = build_model(ModelConfig(arch="av_dit", args=args), AV)  # type: ignore[arg-type]
    assert isinstance(model, AVDiT)
    assert model.video_grid == (2, 2, 2) and model.size.video_patch == (2, 16, 16)
    batch = random_batch(AV, 4)
    x_t, t, _ = model.noised(model.clean_tokens(batch), torch.Generator().manual_seed(7))
    _, plain_t, _ = av_dit(AV).noised(
        av_dit(AV).clean_tokens(batch), torch.Generator().manual_seed(7)
    )
    assert torch.allclose(t, 3 * plain_t / (1 + 2 * plain_t))
    held = t.clamp(min=MIN_DATA_T)[:, None, None]
    for name, v in model.velocity(x_t, t).items():
        assert torch.equal(v, x_t[name] / held), name
    # x^ = 0 at init: each sample's loss is the mean of x^2 over each modality, summed.
    x_t, t, target = model.noised(model.clean_tokens(batch), torch.Generator().manual_seed(7))
    clean = {name: x_t[name] - t[:, None, None] * target[name] for name in x_t}
    per_sample = sum(clean[name].square().mean(dim=(1, 2)) for name in model.modalities)
    loss = model.loss(batch, torch.Generator().manual_seed(7))
    assert loss.item() == pytest.approx(float(per_sample.mean()), rel=1e-4)
    asked: list[float] = []

    def velocity(x: dict[str, torch.Tensor], t: torch.Tensor, *rest: object) -> dict:
        asked.append(float(t[0]))
        return {name: torch.zeros_like(value) for name, value in x.items()}

    model.velocity = velocity  # type: ignore[method-assign]
    sample_model(model, seeds=[0], steps=4, method="euler")
    assert asked == pytest.approx([1.0, 0.9, 0.75, 0.5])  # s t / (1 + (s - 1) t), t = 1 - i/4


def test_pixel_patch_leaves_latents_their_own_patch() -> None:
    """model.args.pixel_patch is pixel video's: on latents (an experiment switched to
    data.modalities [latent]) the av_dit keeps its latent patch (frames, 2, 2)."""
    from stoker.model import DataShapes, LatentShape
    from stoker.runtime.models.build import av_dit as av_dit_factory

    latent = LatentShape(None, 1.0, {"video": (4, 8, 8, 8)}, {"video": "float32"})
    shapes = DataShapes(("latent",), 1.0, 8, 8, (64, 64), 16000, 1, 16000, latents=(latent,))
    model = av_dit_factory(shapes, "tiny", pixel_patch=[2, 16, 16], prediction="data")
    assert model.latent and model.size.video_patch == (2, 2, 2) and model.video_grid == (2, 4, 4)
    assert model.prediction == "data"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"prediction": "x"}, "model.args.prediction 'x' is not one of velocity, data"),
        ({"time_shift": 0}, "model.args.time_shift 0 is not a number above 0"),
        ({"loss": "x"}, "model.args.loss 'x' is not one of velocity, data"),
        ({"pixel_patch": [2, 16]}, "model.args.pixel_patch [2, 16] is not [frames, height, width]"),
        (
            {"pixel_patch": [2, 12, 12]},
            "data.resolution [32, 32] is not a multiple of the tiny av_dit's patch 12x12 "
            "(model.args.pixel_patch)\n  fix: use data.resolution=[36, 36]",
        ),
    ],
)
def test_av_dit_args_errors_name_the_value(args: dict[str, object], message: str) -> None:
    with pytest.raises(ModelSetupError, match=re.escape(message)):
        build_model(ModelConfig(arch="av_dit", args=args), AV)  # type: ignore[arg-type]


def test_av_dit_loss_uses_the_generator() -> None:
    model = av_dit(AV)
    batch = random_batch(AV, 2)
    same = [model.loss(batch, torch.Generator().manual_seed(3)).item() for _ in range(2)]
    other = model.loss(batch, torch.Generator().manual_seed(4)).item()
    assert same[0] == same[1] != other


def test_av_dit_samples_do_not_leak_into_each_other() -> None:
    torch.manual_seed(0)
    model = av_dit(AV)
    scramble(model)
    clean = model.clean_tokens(random_batch(AV, 3))
    x_t, t, _ = model.noised(clean, torch.Generator().manual_seed(0))
    before = model.velocity(x_t, t)
    changed = {name: x.clone() for name, x in x_t.items()}
    for x in changed.values():
        x[1] = torch.randn_like(x[1])
    t_changed = t.clone()
    t_changed[1] = 0.123
    after = model.velocity(changed, t_changed)
    for name in model.modalities:
        torch.testing.assert_close(after[name][0], before[name][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(after[name][2], before[name][2], rtol=1e-5, atol=1e-6)
        assert not torch.allclose(after[name][1], before[name][1])


def test_audio_ar_is_causal() -> None:
    torch.manual_seed(0)
    model = audio_ar(STEREO_AR)
    scramble(model)
    inputs = torch.randint(0, 256, (2, 320))
    before = model.logits(inputs)
    k = 150
    changed = inputs.clone()
    changed[:, k] = (changed[:, k] + 100) % 256
    after = model.logits(changed)
    torch.testing.assert_close(after[:, :k], before[:, :k], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after[:, k], before[:, k])
    assert not torch.allclose(after[:, -1], before[:, -1])


@pytest.mark.parametrize(
    ("tokens", "computed_in"),
    [(CPU_FP32_ATTENTION_TOKENS, torch.float32), (2 * CPU_FP32_ATTENTION_TOKENS, torch.bfloat16)],
    ids=["short-in-fp32", "long-in-bf16"],
)
def test_bf16_attention_on_cpu_computes_short_sequences_in_fp32(
    tokens: int, computed_in: torch.dtype
) -> None:
    """Up to CPU_FP32_ATTENTION_TOKENS torch's bf16 flash attention on CPU costs 2-3x its
    fp32, so attention runs the kernel (forward and backward) in fp32 there, bf16 above;
    either way under autocast it gives bf16 back, to the output and the gradients."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    kernel_dtypes: list[torch.dtype] = []

    class KernelDtypes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if "scaled_dot_product" in str(func):
                kernel_dtypes.append(args[0].dtype)
            return func(*args, **(kwargs or {}))

    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, tokens, 32, generator=gen).bfloat16().requires_grad_() for _ in range(3)
    )
    with KernelDtypes(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(q, k, v)
        out.float().square().sum().backward()
    assert len(kernel_dtypes) == 2 and set(kernel_dtypes) == {computed_in}, kernel_dtypes
    assert out.dtype == torch.bfloat16 and q.grad is not None and q.grad.dtype == torch.bfloat16
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch.testing.assert_close(out.double(), exact, rtol=2e-2, atol=2e-2)


def test_audio_tokens_share_the_t_angle_of_video_at_the_same_moment() -> None:
    """AV at 8 fps, patch (2, 8, 8), 16 kHz, audio patch 400: a video token spans
    0.25 s, an audio token 0.025 s, so audio token 10 * i starts with video t = i."""
    data = data_config(clip_seconds=1.0)
    model = av_dit(data)
    head_dim = 128 // 4
    pairs_t, _, _ = default_sections(head_dim)
    video_cos, video_sin = rope_table_3d((4, 8, 8), head_dim)
    cos, sin = model.rope_cos, model.rope_sin
    assert cos.shape == (4 * 8 * 8 + 40, head_dim // 2)
    torch.testing.assert_close(cos[:256], video_cos, rtol=0, atol=0)
    for i in range(4):
        audio_row, video_row = 256 + 10 * i, i * 64  # video token (t=i, h=0, w=0)
        torch.testing.assert_close(cos[audio_row], video_cos[video_row], rtol=0, atol=1e-7)
        torch.testing.assert_close(sin[audio_row], video_sin[video_row], rtol=0, atol=1e-7)
    # Between two video steps, audio moves on in t only; h and w stay at angle 0.
    assert 0 < float(sin[256 + 5, 1]) < float(video_sin[64, 1])
    assert bool((cos[256:, pairs_t:] == 1).all()) and bool((sin[256:, pairs_t:] == 0).all())


def test_models_compile_without_graph_breaks() -> None:
    """fullgraph=True fails on any graph break (data-dependent Python control
    flow); aot_eager traces forward and backward but generates no code, so it is fast."""
    torch.manual_seed(0)
    for model in (av_dit(AV), audio_ar(STEREO_AR)):
        data = AV if isinstance(model, AVDiT) else STEREO_AR
        batch = random_batch(data, 2)
        expected = model.loss(batch, None)
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
        torch.manual_seed(1)
        got = compiled(batch)
        got.backward()
        assert got.shape == () and math.isfinite(got.item())
        if isinstance(model, AudioAR):
            assert got.item() == pytest.approx(expected.item(), rel=1e-5)


def test_meta_build_then_materialise_with_wrapped_blocks() -> None:
    """The runtime's order: build on meta, wrap blocks, allocate, init_weights."""
    for arch, data in (("av_dit", AV), ("audio_ar", STEREO_AR)):
        with torch.device("meta"):
            model = build_model(ModelConfig(arch=arch), data)  # type: ignore[arg-type]
        assert all(p.device.type == "meta" for p in model.parameters())
        assert "rope_cos" not in model.state_dict()  # rebuilt, not checkpointed
        for index, block in enumerate(model.blocks):
            model.blocks[index] = checkpoint_wrapper(block, preserve_rng_state=False)
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        model.init_weights()
        fresh = build_model(ModelConfig(arch=arch), data)  # type: ignore[arg-type]
        torch.testing.assert_close(model.rope_cos, fresh.rope_cos, rtol=0, atol=0)
        batch = random_batch(data, 2)
        loss = model.loss(batch, torch.Generator().manual_seed(0))
        loss.backward()
        assert math.isfinite(loss.item())
        if isinstance(model, AVDiT):  # adaLN-zero holds after init_weights too
            assert loss.item() == pytest.approx(
                fresh.loss(batch, torch.Generator().manual_seed(0)).item(), rel=1e-6
            )


# --- learning ----------------------------------------------------------------------


def train(
    model: TrainingModel, batches: list[dict[str, torch.Tensor]], steps: int, lr: float
) -> tuple[float, float]:
    """(first, last) evaluation loss: the mean over the batches with a fixed
    generator, so that the two are comparable despite the random t and noise."""

    def evaluate() -> float:
        with torch.no_grad():
            gen = torch.Generator().manual_seed(1234)
            return sum(model.loss(b, gen).item() for b in batches) / len(batches)

    first = evaluate()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for step in range(steps):
        loss = model.loss(batches[step % len(batches)])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return first, evaluate()


def test_tiny_av_dit_learns() -> None:
    torch.manual_seed(0)
    model = av_dit(AV)
    batches = [moving_square_batch(AV, 4, seed) for seed in range(2)]
    # Seeds 0-2 reach 0.69-0.70 of the first loss at step 40 and 0.58-0.60 at 100.
    first, last = train(model, batches, steps=150, lr=2e-3)
    assert last < 0.7 * first, (first, last)


def test_tiny_audio_ar_learns() -> None:
    torch.manual_seed(0)
    data = data_config(clip_seconds=0.016, sample_rate=8000, modalities=["audio"])
    model = audio_ar(data)
    assert model.tokens_per_sample() == 128
    batches = [moving_square_batch(data, 4, seed) for seed in range(2)]
    # Seeds 0-2 reach 0.53-0.69 of the first loss (ln 256) at step 50.
    first, last = train(model, batches, steps=100, lr=3e-3)
    assert last < 0.7 * first, (first, last)


# --- presets and build errors ------------------------------------------------------

# Parameter counts at the default data config (64x64, 8 frames, 1 s mono 16 kHz);
# docs/runtime.md quotes them. Only the patch layers depend on the data.
PARAMS = {
    "av_dit": {
        "tiny": 1_530_000,
        "small": 33_030_000,
        "base": 130_640_000,
        "large": 462_910_000,
        "1b": 1_083_500_000,
    },
    "audio_ar": {
        "tiny": 920_000,
        "small": 21_440_000,
        "base": 85_350_000,
        "large": 304_140_000,
        "1b": 1_013_010_000,
    },
}


@pytest.mark.parametrize("arch", ["av_dit", "audio_ar"])
def test_parameter_counts_per_preset(arch: str) -> None:
    counts = []
    for size in SIZE_NAMES:
        with torch.device("meta"):  # 1b allocates nothing
            model = build_model(ModelConfig(arch=arch, size=size), DataConfig())  # type: ignore[arg-type]
        total = sum(p.numel() for p in model.parameters())
        counts.append(total)
        assert total == pytest.approx(PARAMS[arch][size], rel=0.005), (size, total)
        # Norm weights, biases, modality and token embeddings are not matmul weights.
        assert 0.95 * total < model.matmul_params() < total
        preset = (AV_DIT_SIZES if arch == "av_dit" else AUDIO_AR_SIZES)[size]  # type: ignore[index]
        assert len(model.blocks) == preset.depth
        assert preset.mlp_hidden % 64 == 0
        assert 8 / 3 * preset.dim <= preset.mlp_hidden < 8 / 3 * preset.dim + 64
    assert counts == sorted(counts)
    assert 0.8e9 <= counts[-1] <= 1.3e9


def test_tiny_presets_are_small() -> None:
    assert AV_DIT_SIZES["tiny"].dim == AUDIO_AR_SIZES["tiny"].dim == 128
    assert AV_DIT_SIZES["tiny"].depth == 4 and AV_DIT_SIZES["tiny"].heads == 4


@pytest.mark.parametrize(
    ("model", "data", "message"),
    [
        (
            ModelConfig(arch="av_dit"),
            data_config(resolution=(60, 64)),
            "data.resolution [60, 64] is not a multiple of the tiny av_dit's patch 8x8\n"
            "  fix: use data.resolution=[64, 64]",
        ),
        (
            ModelConfig(arch="av_dit", size="large"),
            data_config(resolution=(64, 40)),
            "data.resolution [64, 40] is not a multiple of the large av_dit's patch 16x16\n"
            "  fix: use data.resolution=[64, 48]",
        ),
        (
            ModelConfig(arch="av_dit"),
            data_config(clip_seconds=1.125),
            "data.clip_seconds 1.125 x data.fps 8 gives 9 frames, not a positive multiple of "
            "the tiny av_dit's temporal patch 2\n  fix: use data.clip_seconds=1.0",
        ),
        (
            ModelConfig(arch="av_dit"),
            data_config(sample_rate=44100),
            "data.clip_seconds 1.0 x data.sample_rate 44100 gives 44100 audio samples, not a "
            "positive multiple of the tiny av_dit's audio patch of 400 samples",
        ),
        (
            ModelConfig(arch="av_dit"),
            data_config(modalities=["text", "meta"]),
            "data.modalities ['text', 'meta'] has neither 'video' nor 'audio'",
        ),
        (
            ModelConfig(arch="audio_ar"),
            data_config(modalities=["video"]),
            "data.modalities ['video'] has no 'audio'",
        ),
    ],
)
def test_build_errors_name_the_value(model: ModelConfig, data: DataConfig, message: str) -> None:
    with pytest.raises(DataDoesNotFitModel, match=re.escape(message)) as info:
        build_model(model, data)
    assert message.startswith(f"{info.value.key} ")  # the setting named first


def test_suggested_clip_seconds_builds() -> None:
    """The fix an error proposes is one that works."""
    data = data_config(sample_rate=44100, clip_seconds=1.0)
    with pytest.raises(ValueError, match=r"use data.clip_seconds=([\d.]+)") as info:
        build_model(ModelConfig(arch="av_dit"), data)
    match = re.search(r"use data.clip_seconds=([\d.]+)", str(info.value))
    assert match is not None
    fixed = data.model_copy(update={"clip_seconds": float(match.group(1))})
    model = build_model(ModelConfig(arch="av_dit"), fixed)
    assert model.loss(random_batch(fixed, 1)).shape == ()


def test_batch_without_a_modality_is_refused() -> None:
    model = av_dit(AV)
    batch = random_batch(AV, 1)
    del batch["audio"]
    with pytest.raises(ValueError, match=r"built for \['video', 'audio'\].*lacks \['audio'\]"):
        model.loss(batch)
    wrong = random_batch(data_config(clip_seconds=0.5, resolution=(32, 64)), 1)
    with pytest.raises(ValueError, match=r"batch\['video'\] has shape \(1, 4, 3, 32, 64\)"):
        model.loss(wrong)
    with pytest.raises(ValueError, match="no 'audio'"):
        audio_ar(STEREO_AR).loss({"video": batch["video"]})
