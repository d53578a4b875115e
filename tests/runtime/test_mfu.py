"""The FLOPs formula MFU is measured against, checked against what torch's
FlopCounterMode counts for a real forward + backward of each model."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from stoker.config import DataConfig, ModelConfig
from stoker.kernels import use_backend
from stoker.runtime.models import (
    attention_flops,
    build_model,
    flops_per_token,
    matmul_flops,
    mfu,
    peak_flops,
    peak_flops_of_name,
)
from tests.runtime.batches import data_config, random_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CASES = [
    ("av_dit", "tiny", DataConfig()),  # 64x64, 8 frames, 1 s mono 16 kHz: 296 tokens
    ("av_dit", "tiny", data_config(resolution=(32, 64), channels=2, modalities=["video"])),
    ("av_dit", "tiny", data_config(sample_rate=8000, channels=2, modalities=["audio"])),
    ("av_dit", "small", data_config(clip_seconds=0.5, resolution=(32, 32), sample_rate=8000)),
    ("audio_ar", "tiny", DataConfig()),  # cropped to 1024 tokens
    ("audio_ar", "tiny", data_config(clip_seconds=0.02, channels=2, modalities=["audio"])),
    ("audio_ar", "small", data_config(clip_seconds=0.032, modalities=["audio"])),
]


def counted_flops(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """FLOPs FlopCounterMode counts in forward + backward of the loss.

    It counts matmuls (mm, addmm, bmm, ...) and attention, and ignores
    elementwise ops: norms, RoPE, SwiGLU's gate, softmax, the loss. With the
    reference kernels the norms and RoPE are plain torch ops, which it sees
    and skips, as the formula does. The math SDPA backend runs attention as
    two bmm forward and four backward (the full S x S, masked or not); CPU's
    fused attention kernel has no FLOP formula in torch and would count 0."""
    counter = FlopCounterMode(display=False)
    with use_backend("reference"), sdpa_kernel(SDPBackend.MATH), counter:
        model.loss(batch).backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize(
    ("arch", "size", "data"), CASES, ids=[f"{a}-{s}-{i}" for i, (a, s, _) in enumerate(CASES)]
)
def test_formula_matches_flop_counter(arch: str, size: str, data: DataConfig) -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch, size=size), data)  # type: ignore[arg-type]
    batch_size = 2
    formula = model.flops_per_sample() * batch_size
    counted = counted_flops(model, random_batch(data, batch_size))
    # Within 5%. The formula is the larger by about 1% for av_dit: it counts 6
    # FLOPs per parameter and token for the patch embeddings and the timestep
    # MLP's first layer, whose inputs need no gradient (autograd does 4).
    assert formula == pytest.approx(counted, rel=0.05), formula / counted
    assert formula >= counted


def test_audio_ar_formula_is_the_textbook_one() -> None:
    """Every audio_ar weight sees every token: S * (6 N + 12 L d S) exactly."""
    model = build_model(ModelConfig(arch="audio_ar"), DataConfig())
    seq, blocks = model.tokens_per_sample(), len(model.blocks)
    expected = seq * flops_per_token(model.matmul_params(), blocks, 128, seq)
    assert model.flops_per_sample() == pytest.approx(expected, rel=1e-12)


def test_formula_pieces() -> None:
    assert matmul_flops(10, 3) == 180
    assert attention_flops(2, 64, 100) == 12 * 2 * 64 * 100 * 100
    assert flops_per_token(1000, 2, 64, 100) == 6 * 1000 + 12 * 2 * 64 * 100


def test_mfu_and_peaks() -> None:
    assert mfu(494.5e12, 989e12) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="peak_flops 0"):
        mfu(1.0, 0.0)
    assert peak_flops("cpu") is None
    assert peak_flops_of_name("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_of_name("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_of_name("NVIDIA H200") == 989e12
    assert peak_flops_of_name("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_of_name("NVIDIA GeForce GTX 1080") is None
