"""Ring attention: exact non-causal attention over a sequence split across the ranks of
a group, each holding one contiguous block of queries, keys and values.

Forward: each rank computes its queries against its own K/V block, then passes the
block to the next rank and receives the previous rank's: R blocks and R-1 passes (R the
ring's size), the partial results merged by their log-sum-exp (an online softmax). The
pass for the next block is in flight while the current one is computed.

Backward: the same ring again. With the output O and log-sum-exp L of the whole
sequence, the attention kernels' own backward gives each block's exact share of dQ, dK
and dV (P = exp(QK^T * scale - L), delta = rowsum(dO * O)), so dQ is summed in place
while each K/V block travels with an accumulator of its dK and dV, which a last pass
hands back to the block's owner.

The block kernels are torch's own attention ops that return the log-sum-exp: the CPU
flash kernel on CPU, the memory-efficient kernel on CUDA (fp32, bf16 and fp16; its
log-sum-exp is padded to a multiple of 32 rows), and plain matmuls elsewhere (also the
reference the tests hold the kernels to). Present in torch 2.11 and 2.13.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

# A block's result: (output in the inputs' dtype, log-sum-exp [B, H, S_q] in fp32, fp64 for fp64).
Block = tuple[torch.Tensor, torch.Tensor]


def block_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool = False
) -> Block:
    """Attention of q [B, H, Sq, D] over k, v [B, H, Sk, D]: its output and log-sum-exp
    per query."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, scale=scale
        )
        return out, lse.to(_accumulated(q))
    if q.device.type == "cuda":
        out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, causal, scale=scale
        )
        return out, lse[..., : q.shape[2]].to(_accumulated(q))
    return math_block_forward(q, k, v, scale, causal)


def block_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of one K/V block, given the whole sequence's `out` and `lse`."""
    if q.device.type == "cpu":
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, causal, scale=scale
        )
        return grads[0], grads[1], grads[2]
    if q.device.type == "cuda":
        # The kernel reads a log-sum-exp padded to a multiple of 32 queries.
        padded = 32 * math.ceil(q.shape[2] / 32)
        lse_padded = torch.zeros((*lse.shape[:2], padded), dtype=torch.float32, device=q.device)
        lse_padded[..., : q.shape[2]] = lse
        seed = offset = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            grad_out, q, k, v, None, out, lse_padded, seed, offset, 0.0,
            [True, True, True, False], causal, scale=scale,
        )  # fmt: skip
        return dq, dk, dv
    return math_block_backward(grad_out, q, k, v, out, lse, scale, causal)


def math_block_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool = False
) -> Block:
    """block_forward in plain matmuls, in fp32 (or fp64 for fp64 inputs)."""
    compute = _accumulated(q)
    scores = _masked(torch.matmul(q.to(compute), k.to(compute).transpose(-1, -2)) * scale, causal)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse[..., None]), v.to(compute))
    return out.to(q.dtype), lse


def math_block_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """block_backward in plain matmuls."""
    compute = _accumulated(q)
    q32, k32, v32 = q.to(compute), k.to(compute), v.to(compute)
    do32 = grad_out.to(compute)
    scores = _masked(torch.matmul(q32, k32.transpose(-1, -2)) * scale, causal)
    probs = torch.exp(scores - lse.to(compute)[..., None])
    dv = torch.matmul(probs.transpose(-1, -2), do32)
    dp = torch.matmul(do32, v32.transpose(-1, -2))
    delta = (do32 * out.to(compute)).sum(dim=-1, keepdim=True)
    ds = probs * (dp - delta) * scale
    dq = torch.matmul(ds, k32)
    dk = torch.matmul(ds.transpose(-1, -2), q32)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _masked(scores: torch.Tensor, causal: bool) -> torch.Tensor:
    """Causal: query i sees keys 0..i (q and k of one sequence, the same length)."""
    if not causal:
        return scores
    rows, cols = scores.shape[-2:]
    allowed = torch.ones(rows, cols, dtype=torch.bool, device=scores.device).tril()
    return scores.masked_fill(~allowed, float("-inf"))


def _accumulated(t: torch.Tensor) -> torch.dtype:
    """Where partial results add up: fp32, or fp64 for fp64 inputs (the tests' reference)."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


class _Ring:
    """The ring's neighbours in global ranks, and one pass of tensors to the next rank
    (receiving the previous rank's) as one batch of point-to-point ops."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        me = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (me + 1) % self.size)
        self.prev = dist.get_global_rank(group, (me - 1) % self.size)

    def start(self, tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[Any]]:
        """Send `tensors` on, receive the previous rank's into new tensors; the requests
        to wait on before those are read."""
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in received]
        return received, dist.batch_isend_irecv(ops)

    def pass_on(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        received, requests = self.start(tensors)
        for request in requests:
            request.wait()
        return received


def _wait(requests: list[Any]) -> None:
    for request in requests:
        request.wait()


def ring_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None,
    scale: float,
    causal: bool = False,
) -> Block:
    """Attention of this rank's q [B, H, S, D] over the ring's whole k, v (module doc):
    the output and its log-sum-exp. Without a ring (None), one block, causal or not."""
    if group is None:
        return block_forward(q, k, v, scale, causal)
    if causal:
        raise ValueError("a ring takes non-causal attention only")
    ring = _Ring(group)
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    block_k, block_v = k.contiguous(), v.contiguous()
    for step in range(ring.size):
        last = step == ring.size - 1
        if not last:
            received, requests = ring.start([block_k, block_v])
        block_out, block_lse = block_forward(q, block_k, block_v, scale)
        if out is None or lse is None:
            out, lse = block_out.to(block_lse.dtype), block_lse
        else:
            merged = torch.logaddexp(lse, block_lse)
            out = (
                out * torch.exp(lse - merged)[..., None]
                + block_out.to(merged.dtype) * torch.exp(block_lse - merged)[..., None]
            )
            lse = merged
        if not last:
            _wait(requests)
            block_k, block_v = received
    assert out is not None and lse is not None
    return out.to(q.dtype), lse


def ring_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    group: dist.ProcessGroup | None,
    scale: float,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of ring_forward, each rank's for its own q, k, v (module doc)."""
    grad_out = grad_out.contiguous()
    if group is None:
        return block_backward(grad_out, q, k, v, out, lse, scale, causal)
    ring = _Ring(group)
    acc = _accumulated(q)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    block_k, block_v = k.contiguous(), v.contiguous()
    # The dK, dV of the block this rank holds; they travel with it.
    dk = torch.zeros(k.shape, dtype=acc, device=k.device)
    dv = torch.zeros(v.shape, dtype=acc, device=v.device)
    for step in range(ring.size):
        last = step == ring.size - 1
        if not last:
            received, requests = ring.start([block_k, block_v])
        block_dq, block_dk, block_dv = block_backward(
            grad_out, q, block_k, block_v, out, lse, scale
        )
        dq += block_dq.to(acc)
        # After this pass the next rank holds this block's accumulators, and (once the
        # K/V pass lands) the K/V they belong to; the last pass hands each rank its own
        # block's.
        dk, dv = ring.pass_on([dk + block_dk.to(acc), dv + block_dv.to(acc)])
        if not last:
            _wait(requests)
            block_k, block_v = received
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
