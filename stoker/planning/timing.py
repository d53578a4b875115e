"""A candidate's step time, from a roofline of its work: no GPU is run.

    step = accum * max(compute / accum, all-gathers of one micro-batch)
           + reduce-scatter [+ HSDP all-reduce] + optimizer

- compute: the step's training FLOPs (the model's `flops_per_sample`, else PyTorch's
  FLOP counter over a traced forward and backward) plus what activation checkpointing
  recomputes (a forward of the recomputed blocks: +1/3 of their FLOPs for full, half of
  that for selective), at MATMUL_EFFICIENCY of the GPU's peak for the precision.
- all-gathers: FSDP2 gathers every block's weights in forward and again in backward
  (every block but the last is resharded after forward), each micro-batch, in bf16 on a
  bf16 run (fp32 otherwise), (shard-1)/shard of the weights per rank. Overlapped with
  compute (FSDP2 prefetches the next block): the slower of the two counts.
- reduce-scatter: once per step (the last micro-batch), fp32 gradients. With HSDP, an
  all-reduce of each shard across the nodes follows, on the inter-node network.
- links: NVLink within a node (per GPU, one direction), INTER_NODE_BYTES_S per GPU
  between nodes (`--inter-node-gbps`), at LINK_EFFICIENCY.
- optimizer: fused AdamW reads and writes 16 bytes per parameter of the rank's shard
  (weight, gradient, two moments) twice: HBM-bound.
- context parallelism (train.context_parallel: N, Ulysses U of it, a ring of R = N/U):
  compute is unchanged (a CP group's ranks share its samples' FLOPs); each micro-batch
  adds, per attention call, Ulysses' all-to-alls of q, k, v and the output in forward
  and of their gradients in backward (and again in a recomputed forward), each rank
  sending (U-1)/U of its share, on NVLink when U ranks fit in a node (not overlapped:
  the attention waits for them); and the ring's R-1 passes of K and V in forward, R-1
  of K, V and R of fp32 dK, dV in backward, on the fabric when the CP group spans
  nodes. A ring pass overlaps the block computed meanwhile (ring_attention.py posts
  the next block's transfer before it computes the current one): only what the
  attention's R-1 hiding blocks (their q k^T and p v at the matmul rate; twice that in
  backward) do not cover counts. Attention runs below the matmul rate, so it hides
  more than this says: the estimate errs slow.

Not modelled: kernel launch gaps, the data loader (`stoker data bench` says whether it
keeps up), attention's own efficiency (FlashAttention runs below the matmul rate),
stragglers. `stoker plan --calibrate RUN` measures how far a run was from this.
"""

from __future__ import annotations

from dataclasses import dataclass

from stoker.gpus import PCIE_BYTES_S, GPUSpec
from stoker.modes import ActivationCheckpointing, ResolvedPrecision

MATMUL_EFFICIENCY = 0.80
"""Measured: 790-800 of the H100's 989 dense bf16 TFLOP/s on an 8192^3 matmul (FACTS)."""
LINK_EFFICIENCY = 0.80
"""NCCL's bus bandwidth on a ring against the link's data-sheet rate."""
INTER_NODE_BYTES_S = 50e9
"""Per GPU between nodes: one 400 Gb/s InfiniBand NIC per GPU, the usual H100 node."""
RECOMPUTE = {"none": 0.0, "selective": 1 / 6, "full": 1 / 3}
"""Extra FLOPs, as a share of the step's, that activation checkpointing recomputes."""


@dataclass(frozen=True)
class StepWork:
    """What one rank does in one step."""

    flops: float
    """Training FLOPs of the rank's samples in the step (forward + backward)."""
    params: int
    """Parameters of the whole model."""
    shard: int
    replicate: int
    accum: int
    activation_checkpointing: ActivationCheckpointing
    precision: ResolvedPrecision
    cp: int = 1
    ulysses: int = 1
    qkv_elements: float = 0.0
    """With CP: elements of this rank's q (= k = v = out) over every attention call of
    one micro-batch's forward."""
    score_flops: float = 0.0
    """With CP: FLOPs of this rank's attention matmuls over every call of one
    micro-batch's forward (what a ring's passes hide behind)."""


@dataclass(frozen=True)
class StepTime:
    seconds: float
    compute_s: float
    comm_s: float
    """All the collectives' time, overlapped or not."""


def step_time(
    work: StepWork, gpu: GPUSpec, ranks_per_node: int, inter_node_bytes_s: float
) -> StepTime:
    peak = gpu.bf16_flops if work.precision == "bf16" else gpu.fp32_flops
    flops = work.flops * (1 + RECOMPUTE[work.activation_checkpointing])
    compute = flops / (peak * MATMUL_EFFICIENCY)
    intra = (gpu.nvlink_bytes_s or PCIE_BYTES_S) * LINK_EFFICIENCY
    inter = inter_node_bytes_s * LINK_EFFICIENCY
    # A shard group within one node runs on NVLink; one that spans nodes, on the NICs.
    shard_link = intra if work.shard <= ranks_per_node else min(intra, inter)
    param_bytes = 2 if work.precision == "bf16" else 4
    spread = (work.shard - 1) / work.shard if work.shard > 1 else 0.0
    gather = 2 * work.params * param_bytes * spread / shard_link  # forward + backward
    scatter = work.params * 4 * spread / shard_link
    replicas = 0.0
    if work.replicate > 1:  # HSDP: the shard's all-reduce across the nodes
        replicas = 2 * work.params / work.shard * 4 * (work.replicate - 1) / work.replicate / inter
    micro_compute = compute / work.accum
    overlapped = work.accum * max(micro_compute, gather)
    optimizer = 2 * 16 * work.params / work.shard / gpu.hbm_bytes_s
    cp = work.accum * context_parallel_s(
        work, param_bytes, intra, inter, ranks_per_node, peak * MATMUL_EFFICIENCY
    )
    seconds = overlapped + scatter + replicas + optimizer + cp
    return StepTime(
        seconds=seconds, compute_s=compute, comm_s=work.accum * gather + scatter + replicas + cp
    )


def context_parallel_s(
    work: StepWork,
    element_bytes: int,
    intra: float,
    inter: float,
    ranks_per_node: int,
    flops_s: float = float("inf"),
) -> float:
    """One micro-batch's CP traffic in seconds that compute does not hide (the module
    doc); `flops_s`: the rate the attention's blocks run at."""
    if work.cp == 1:
        return 0.0
    forwards = 2 + 3 * RECOMPUTE[work.activation_checkpointing]  # the forward, backward, recompute
    share = work.qkv_elements * element_bytes
    ulysses = 0.0
    if work.ulysses > 1:
        link = intra if work.ulysses <= ranks_per_node else inter
        ulysses = 4 * forwards * share * (work.ulysses - 1) / work.ulysses / link
    ring = 0.0
    rounds = work.cp // work.ulysses
    if rounds > 1:
        link = intra if work.cp <= ranks_per_node else min(intra, inter)
        hiding = (rounds - 1) / rounds * work.score_flops / flops_s  # a forward's, seconds
        forward_kv = 2 * share * (rounds - 1) / link  # one forward's passes
        backward_kv = (2 * share * (rounds - 1) + 2 * rounds * work.qkv_elements * 4) / link
        forward = max(0.0, forward_kv - hiding)  # dK, dV above: fp32, home again
        ring = (forwards - 1) * forward + max(0.0, backward_kv - 2 * hiding)
    return ulysses + ring
