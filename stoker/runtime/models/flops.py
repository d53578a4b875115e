"""Training FLOPs of a transformer, and model FLOPs utilisation (MFU).

Per token, forward + backward (Kaplan et al. 2020; PaLM, appendix B):

    flops_per_token = 6 * N + 12 * L * d * S

- N: parameters in matmuls: the blocks' Linear weights, embeddings that are
  linear layers (patch embeddings) and the output head. Not norms, not biases,
  not lookup embeddings (a gather is no matmul). A weight that multiplies a
  [rows, in] input costs 2 FLOPs per parameter and row forward, and 4 backward
  (the input's gradient and the weight's): 6 per parameter and token.
- 12 * L * d * S: attention scores (q k^T) and the weighted sum of values,
  2 * S * d FLOPs per token each forward, 3x that for forward + backward, in L
  layers. It is the full S x S square for bidirectional and causal attention
  alike, as FlopCounterMode counts scaled_dot_product_attention (a causal
  FlashAttention kernel skips half of it, which MFU does not credit).

Per sample the two models use `matmul_flops` for each weight with the rows it
really multiplies: in av_dit the video patch embedding and its output linear
see only the video tokens, the audio ones only the audio tokens, and the
timestep MLP and the adaLN modulation run once per sample, not per token
(counting them per token would overstate the tiny av_dit's FLOPs by a third).
When every weight sees every token this is exactly S * flops_per_token.

Left out, as FlopCounterMode also leaves it out: elementwise work (norms,
RoPE, SwiGLU's gate, softmax, the loss). The formula counts 6 per parameter
where autograd does 4 for a first layer whose input needs no gradient (the
patch embeddings, the timestep MLP's first linear): about 1% of the tiny
av_dit. It counts no recomputation: activation checkpointing and
FlashAttention's backward redo forward work that MFU by definition does not
credit.

MFU = achieved model FLOPs per second / the device's dense bf16 peak.
"""

from __future__ import annotations

import torch

from stoker.gpus import KNOWN_GPUS, gpu_spec

# Dense (not 2:4 sparse) bf16 tensor-core peaks from the vendors' data sheets, by the
# name torch.cuda.get_device_name gives, most specific first (stoker/gpus.py's table).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = tuple(
    (key, spec.bf16_flops) for key, spec in KNOWN_GPUS
)


def matmul_flops(params: int, rows: int) -> float:
    """Training FLOPs of one weight of `params` entries applied to `rows` rows:
    2 forward + 4 backward per parameter and row."""
    return 6.0 * params * rows


def attention_flops(layers: int, dim: int, seq_len: int) -> float:
    """Training FLOPs of the attention scores and values of one sequence:
    12 * L * d * S^2 (full S x S, forward + backward)."""
    return 12.0 * layers * dim * seq_len * seq_len


def flops_per_token(matmul_params: int, layers: int, dim: int, seq_len: int) -> float:
    """6 * N + 12 * L * d * S, when every matmul weight sees every token."""
    return 6.0 * matmul_params + 12.0 * layers * dim * seq_len


def mfu(flops_per_s: float, peak_flops: float) -> float:
    """Model FLOPs utilisation, a fraction: achieved / peak."""
    if not peak_flops > 0:
        raise ValueError(f"peak_flops {peak_flops} must be positive; take it from peak_flops()")
    return flops_per_s / peak_flops


def peak_flops_of_name(name: str) -> float | None:
    """Dense bf16 peak of a GPU by its name (e.g. 'NVIDIA H100 80GB HBM3'), or
    None when the name is not in stoker/gpus.py's table."""
    spec = gpu_spec(name)
    return spec.bf16_flops if spec is not None else None


def peak_flops(device: torch.device | str) -> float | None:
    """Dense bf16 peak FLOP/s of one device, or None (CPU, unknown GPU): then
    MFU is not reported rather than reported against a guess."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return peak_flops_of_name(torch.cuda.get_device_name(device))
