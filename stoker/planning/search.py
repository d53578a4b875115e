"""The candidates of a plan, and the search for the fastest that fits.

A candidate is a layout (FSDP2 over every rank, or HSDP: sharded within a node and
replicated across nodes), a context parallelism (none, or CP groups of N ranks splitting
each sample's tokens: Ulysses within a node, a ring, or Ulysses within a node and a ring
across nodes), an activation-checkpointing mode, a precision and a gradient
accumulation; its micro-batch in each bucket follows from the experiment's global batch
(data.batch_size, or each bucket's): global / (ranks / N x accumulation). The global
batch is kept: it is an optimisation setting, not a memory one. A CP degree is a
candidate only where every bucket's sequences divide by it and, for Ulysses, the heads;
a causal model takes Ulysses only.

Every candidate is timed (timing.py: no trace needed). They are then visited fastest
first, each traced in each bucket at its own micro-batch (trace.py); the first that
fits is chosen, and a slower one is not traced (its memory cannot change the choice)
unless `trace_all`. A kind of candidate (precision, CP, accumulation) whose least
needy one does not fit is too big in every mode and micro-batch: the rest of it is not
traced. Each candidate keeps why it was not chosen.

Fits: traced peak x (1 + ALLOCATOR_SLACK) + the fixed allowances of a GPU (CUDA
context, NCCL) <= the GPU's memory x (1 - margin).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from stoker.gpus import GPUSpec
from stoker.modes import ActivationCheckpointing, ResolvedPrecision
from stoker.planning.timing import INTER_NODE_BYTES_S, StepWork, step_time
from stoker.planning.trace import AttentionFacts, ModelFacts, Traced, TraceSpec

GIB = 1024**3
ALLOCATOR_SLACK = 0.10
"""The CUDA caching allocator reserves more than it hands out (fragmentation)."""
CUDA_CONTEXT_BYTES = int(0.75 * GIB)
"""The CUDA context and torch's kernels' images, outside the allocator."""
NCCL_BYTES = int(0.5 * GIB)
"""NCCL's buffers per communicator (HSDP has two), outside the allocator."""
MODES: tuple[ActivationCheckpointing, ...] = ("none", "selective", "full")


@dataclass(frozen=True)
class Target:
    """Where the job would run."""

    nodes: int
    ranks_per_node: int
    gpu: GPUSpec | None
    """None: a CPU target (memory only; its times are relative)."""
    memory_bytes: int
    """Per rank: the GPU's memory, or what a CPU rank may use."""
    source: str
    """Where these facts came from (a partition, flags, the profile)."""
    inter_node_bytes_s: float = INTER_NODE_BYTES_S
    margin: float = 0.05
    spare_nodes: int = 0
    """Nodes allocated beyond `nodes` to replace a failed one (job.spare_nodes): they
    train nothing, but the partition must hold them."""

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class Batch:
    """One shape the steps come in: a bucket (index) or the data's one shape (None)."""

    bucket: int | None
    label: str
    global_batch: int


CandidateStatus = Literal["not traced", "slower", "too big", "chosen", "fits"]
"""Where the search left a candidate: not traced (the search stopped before it), slower
than the chosen one (so not traced), too big for the GPU, chosen, or fits (not chosen)."""


@dataclass
class Candidate:
    shard: int
    replicate: int
    activation_checkpointing: ActivationCheckpointing
    precision: ResolvedPrecision
    grad_accum: int
    micro_batches: list[int]
    """Per Batch, the rows of one rank's micro-batch (of its CP group, with CP)."""
    cp: int = 1
    ulysses: int = 1
    step_s: list[float] = field(default_factory=list)
    peak: list[int | None] = field(default_factory=list)
    """Per Batch; None for a bucket not traced (another one did not fit)."""
    parts: list[dict[str, int]] = field(default_factory=list)
    status: CandidateStatus = "not traced"
    reason: str = ""

    @property
    def layout(self) -> str:
        return "fsdp" if self.replicate == 1 else "hsdp"

    @property
    def sharding(self) -> str:
        return "all" if self.replicate == 1 else "node"

    @property
    def mean_step_s(self) -> float:
        return sum(self.step_s) / len(self.step_s)

    def describe(self) -> str:
        where = (
            "one rank"
            if self.shard * self.replicate == 1
            else f"FSDP over {self.shard}"
            if self.replicate == 1
            else f"HSDP {self.replicate}x{self.shard}"
        )
        micro = "/".join(str(m) for m in self.micro_batches)
        return (
            f"{where}{self.cp_text()}, AC {self.activation_checkpointing}, {self.precision}, "
            f"micro-batch {micro} x {self.grad_accum}"
        )

    def cp_text(self) -> str:
        """', CP 8 (Ulysses 8)', ', CP 16 (Ulysses 8 x ring 2)'; '' without CP."""
        if self.cp == 1:
            return ""
        ring = self.cp // self.ulysses
        how = (
            f"Ulysses {self.ulysses}"
            if ring == 1
            else f"ring {ring}"
            if self.ulysses == 1
            else f"Ulysses {self.ulysses} x ring {ring}"
        )
        return f", CP {self.cp} ({how})"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_candidates(
    target: Target,
    batches: list[Batch],
    facts: ModelFacts,
    precisions: list[ResolvedPrecision],
) -> list[Candidate]:
    world = target.world
    modes: tuple[ActivationCheckpointing, ...] = MODES if facts.blocks else ("none",)
    out = []
    for cp, ulysses in cp_options(target, facts):
        groups = world // cp
        if any(b.global_batch % groups for b in batches):
            continue
        per_rank = [b.global_batch // groups for b in batches]
        common = math.gcd(*per_rank)
        layouts = [(world, 1)]
        if target.nodes > 1 and cp <= target.ranks_per_node:
            layouts.append((target.ranks_per_node, target.nodes))
        for shard, replicate in layouts:
            for mode in modes:
                for precision in precisions:
                    for accum in divisors(common):
                        micro = [rows // accum for rows in per_rank]
                        out.append(
                            Candidate(
                                shard,
                                replicate,
                                mode,
                                precision,
                                accum,
                                micro,
                                cp=cp,
                                ulysses=ulysses,
                            )
                        )
    return out


def cp_options(target: Target, facts: ModelFacts) -> list[tuple[int, int]]:
    """(CP, Ulysses) pairs worth a candidate: none; within a node each degree as Ulysses
    (where it divides the heads) and, for a non-causal model, as a ring; across nodes,
    Ulysses over a node and a ring over the nodes. Only where every bucket's sequences
    divide by the degree."""
    options = [(1, 1)]
    attention = facts.attention
    if not attention or any(a.heads is None for a in attention):
        return options  # the model calls no stoker.model.attention
    heads = min(a.heads or 0 for a in attention)
    causal = any(a.causal for a in attention)
    per_node = target.ranks_per_node
    degrees = [
        (cp, per_node) for cp in (per_node * n for n in divisors(target.nodes)) if cp > per_node
    ]
    pairs = [(cp, cp) for cp in divisors(per_node) if cp > 1] + degrees
    pairs += [(cp, 1) for cp in divisors(per_node) if cp > 1]
    for cp, ulysses in pairs:
        splits = all(t % cp == 0 for a in attention for t in a.tokens)
        ring = cp // ulysses
        if splits and heads % ulysses == 0 and not (causal and ring > 1):
            options.append((cp, ulysses))
    return options


def time_candidates(candidates: list[Candidate], target: Target, facts: ModelFacts) -> None:
    for c in candidates:
        c.step_s = []
        none = [AttentionFacts((), None, False, 0)] * len(facts.flops_per_sample)
        attention = facts.attention or none
        for rows, flops, a in zip(c.micro_batches, facts.flops_per_sample, attention, strict=True):
            work = StepWork(
                flops=flops * rows * c.grad_accum / c.cp,  # a CP rank: its share of each sample
                params=facts.params,
                shard=c.shard,
                replicate=c.replicate,
                accum=c.grad_accum,
                activation_checkpointing=c.activation_checkpointing,
                precision=c.precision,
                cp=c.cp,
                ulysses=c.ulysses,
                qkv_elements=a.qkv_elements * rows / c.cp,
                score_flops=a.score_flops * rows / c.cp,
            )
            gpu = target.gpu or _CPU
            c.step_s.append(
                step_time(work, gpu, target.ranks_per_node, target.inter_node_bytes_s).seconds
            )


# A CPU target's times only rank its candidates: one FLOP/s figure for both precisions.
_CPU = GPUSpec("cpu", 0, 1e12, 1e12, 50e9, 10e9)


def need_bytes(peak: int, target: Target, replicate: int) -> int:
    """What a traced peak needs of the device, with the allowances of a GPU."""
    if target.gpu is None:
        return peak
    communicators = 2 if replicate > 1 else 1
    return int(peak * (1 + ALLOCATOR_SLACK)) + CUDA_CONTEXT_BYTES + communicators * NCCL_BYTES


def usable_bytes(target: Target) -> int:
    return int(target.memory_bytes * (1 - target.margin))


def memory_legend(target: Target) -> str:
    """What the plan's PEAK and its `needs` figures are, in one line under its tables:
    `need_bytes` in words."""
    peak = "PEAK: the most the step's tensors hold at once on a rank (traced)"
    usable = f"which must fit in the usable memory (less --margin, {target.margin:.0%})"
    if target.gpu is None:
        return f"{peak}; needs: PEAK itself on a CPU host, {usable}"
    return (
        f"{peak}; needs: PEAK x {1 + ALLOCATOR_SLACK:.2f} (allocator slack) + "
        f"{size_text(CUDA_CONTEXT_BYTES)} (CUDA context) + {size_text(NCCL_BYTES)} per NCCL "
        f"communicator, {usable}"
    )


Tracer = Callable[[list[TraceSpec]], list[Traced]]
"""Traces several specs (in parallel where it can), in order."""


class Memory:
    """Peaks of candidates, traced once per distinct trace and reused."""

    def __init__(
        self,
        target: Target,
        batches: list[Batch],
        tracer: Tracer,
        flops: tuple[float, ...],
        width: int,
    ) -> None:
        self.target, self.batches, self.tracer = target, batches, tracer
        self.flops, self.width = flops, width
        self.cache: dict[TraceSpec, Traced] = {}
        self.traces = 0

    def spec(self, c: Candidate, index: int, rows: int) -> TraceSpec:
        return TraceSpec(
            world=self.target.world,
            shard=c.shard,
            activation_checkpointing=c.activation_checkpointing,
            precision=c.precision,
            micro_batch=rows,
            micro_batches=min(c.grad_accum, 2),
            bucket=self.batches[index].bucket,
            gpu=self.target.gpu is not None,
            cp=c.cp,
            ulysses=c.ulysses,
        )

    def estimate(self, c: Candidate, *, every: bool = False) -> None:
        """Fill c.peak and c.parts: one trace per bucket at its micro-batch (a fake
        tensor costs the same at any size: the micro-batch costs the trace nothing).
        The buckets likely to need most (micro-batch x FLOPs per sample) are traced
        first, `width` at a time; once one does not fit the rest are not traced (None),
        unless `every`."""
        specs = [self.spec(c, index, rows) for index, rows in enumerate(c.micro_batches)]
        order = sorted(range(len(specs)), key=lambda i: -c.micro_batches[i] * self.flops[i])
        c.peak = [None] * len(specs)
        c.parts = [{} for _ in specs]
        for start in range(0, len(order), self.width):
            chunk = order[start : start + self.width]
            todo = list(dict.fromkeys(specs[i] for i in chunk if specs[i] not in self.cache))
            if todo:
                self.cache.update(zip(todo, self.tracer(todo), strict=True))
                self.traces += len(todo)
            for i in chunk:
                c.peak[i] = self.cache[specs[i]].peak
                c.parts[i] = dict(self.cache[specs[i]].parts)
            if not every and not _fits(c, self.target)[0]:
                return


def _fits(c: Candidate, target: Target) -> tuple[bool, int, int]:
    """(fits, the worst bucket's need, its index)."""
    needs = [need_bytes(p, target, c.replicate) if p is not None else 0 for p in c.peak]
    worst = max(range(len(needs)), key=lambda i: needs[i])
    return needs[worst] <= usable_bytes(target), needs[worst], worst


def search(
    candidates: list[Candidate],
    target: Target,
    batches: list[Batch],
    tracer: Tracer,
    flops: tuple[float, ...],
    *,
    width: int = 1,
    trace_all: bool | Callable[[Candidate], bool] = False,
) -> tuple[Candidate | None, int]:
    """Visit fastest first; set each candidate's status and reason. The chosen one, and
    how many traces it took. `trace_all`: trace every candidate (or those it returns
    True for), every bucket, whatever the search needs. Once two of a kind are too big,
    the least needy of that kind decides for the rest (_try_least_needy). When the
    chosen one takes context parallelism, whether the run needs CP at all is worth a
    plan's saying (plan.needs_cp_note): the candidates without it are judged too."""
    memory = Memory(target, batches, tracer, flops, width)
    chosen: Candidate | None = None
    too_big: list[Candidate] = []  # traced, and did not fit
    for c in sorted(candidates, key=lambda c: c.mean_step_s):
        every = trace_all(c) if callable(trace_all) else trace_all
        if chosen is not None and not every:
            c.status = "slower"
            c.reason = (
                f"{c.mean_step_s / chosen.mean_step_s:.2f}x the chosen step time; "
                "not traced (its memory cannot change the choice)"
            )
            continue
        if c.status != "not traced" or (not every and _too_big_as(c, too_big)):
            continue  # judged already as the least needy of its kind, or held more than one
        memory.estimate(c, every=every)
        if _judge(c, chosen, target, batches):
            chosen = c
        elif not _fits(c, target)[0]:
            too_big.append(c)
            if not every:
                _try_least_needy(c, candidates, memory, too_big)
    if chosen is not None and chosen.cp > 1:
        _judge_without_cp([c for c in candidates if c.cp == 1], chosen, memory, too_big)
    for c in candidates:  # slower, but traced as the least needy of its kind: say so
        if c.status == "slower" and c.peak:
            _judge(c, chosen, target, batches)
    return chosen, memory.traces


def _try_least_needy(
    c: Candidate, candidates: list[Candidate], memory: Memory, too_big: list[Candidate]
) -> None:
    """After a second candidate of c's kind (_kind) did not fit: trace the least needy
    of that kind (full recompute, the fewest rows, the most sharding). If that does not
    fit either, none of its kind can, and the search says so of each without tracing it
    (it would otherwise trace every mode and micro-batch of a degree that cannot fit: a
    long clip's plan). If it fits, it waits for its turn. After the first only, one that
    does not fit is common (no recompute at the largest micro-batch) and the next
    usually fits: no trace is spent on it."""
    kind = _kind(c)
    if sum(1 for o in too_big if _kind(o) == kind) < 2:
        return
    rest = [o for o in candidates if _kind(o) == kind and o.status == "not traced"]
    if not rest:
        return
    least = min(rest, key=_neediness)
    memory.estimate(least)
    if not _fits(least, memory.target)[0]:
        _judge(least, None, memory.target, memory.batches)
        too_big.append(least)


def _kind(c: Candidate) -> tuple[str, int, int, bool]:
    """Candidates whose memory orders by recompute, rows and sharding alone: the same
    precision and CP, and all accumulating gradients or none (_needs_at_least)."""
    return (c.precision, c.cp, c.ulysses, c.grad_accum > 1)


def _too_big_as(c: Candidate, too_big: list[Candidate]) -> bool:
    """Mark `c` too big, untraced, when it holds at least what a traced candidate that
    did not fit holds; True if so."""
    for other in too_big:
        if _needs_at_least(c, other):
            c.status = "too big"
            c.reason = (
                f"needs more than {other.describe()}, which does not fit (not traced: "
                "it recomputes less, holds more rows or shards over fewer ranks)"
            )
            return True
    return False


def _judge_without_cp(
    without: list[Candidate], chosen: Candidate, memory: Memory, too_big: list[Candidate]
) -> None:
    """Whether the run needs CP at all: per kind (_kind), the candidate without CP that
    needs least (full recompute, the smallest micro-batch, sharded over every rank) is
    traced if the search has not. When it does not fit, none of the others of its kind
    can: they are too big, said so untraced. When it fits, the others stay as the
    search left them: slower than the chosen, so not traced."""
    for kind in dict.fromkeys(_kind(c) for c in without):
        mine = [c for c in without if _kind(c) == kind]
        least = min(mine, key=_neediness)
        if least.status == "slower":
            _trace_and_judge(least, chosen, memory, too_big)
        if least.status != "too big":
            continue
        for c in mine:
            if c.status == "slower" and not _too_big_as(c, too_big):
                _trace_and_judge(c, chosen, memory, too_big)  # not comparable: traced


def _trace_and_judge(
    c: Candidate, chosen: Candidate, memory: Memory, too_big: list[Candidate]
) -> None:
    memory.estimate(c)
    _judge(c, chosen, memory.target, memory.batches)
    if c.status == "too big":
        too_big.append(c)


def _neediness(c: Candidate) -> tuple[int, int, int]:
    """Orders candidates by what they hold: full recompute, fewer rows, more sharding first
    (the least of them holds least of all but perhaps the accumulated gradients)."""
    return (-MODES.index(c.activation_checkpointing), max(c.micro_batches), -c.shard)


def _needs_at_least(c: Candidate, least: Candidate) -> bool:
    """c holds at least what `least` does in every respect: the same precision and
    context parallelism, no more recompute, no fewer rows, no more sharding, and
    unsharded gradients held across micro-batches if `least` holds them (FSDP2
    reduce-scatters on the last micro-batch only: fewer rows with accumulation can
    need more than more rows without)."""
    return (
        (c.precision, c.cp, c.ulysses) == (least.precision, least.cp, least.ulysses)
        and min(c.grad_accum, 2) >= min(least.grad_accum, 2)
        and MODES.index(c.activation_checkpointing) <= MODES.index(least.activation_checkpointing)
        and all(m >= n for m, n in zip(c.micro_batches, least.micro_batches, strict=True))
        and c.shard <= least.shard
        and c.replicate >= least.replicate
    )


def _judge(c: Candidate, chosen: Candidate | None, target: Target, batches: list[Batch]) -> bool:
    """Set a traced candidate's status and reason; True when it is the one chosen (it
    fits and none was chosen before it)."""
    fits, need, worst = _fits(c, target)
    where = f" in {batches[worst].label}" if len(batches) > 1 else ""
    if not fits:
        c.status = "too big"
        c.reason = (
            f"needs {size_text(need)}{where} > {size_text(usable_bytes(target))} usable "
            f"({_biggest(c.parts[worst])})"
        )
        return False
    if chosen is None:
        c.status, c.reason = "chosen", f"the fastest that fits: {size_text(need)}{where}"
        return True
    c.status = "fits"
    ratio = c.mean_step_s / chosen.mean_step_s
    c.reason = f"fits ({size_text(need)}{where}) but {ratio:.2f}x the chosen step time"
    return False


def _biggest(parts: dict[str, int]) -> str:
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:2]
    return ", ".join(f"{name} {size_text(size)}" for name, size in top)


def size_text(value: int | None) -> str:
    """1.5 GiB, 89 MiB; - for None."""
    if value is None:
        return "-"
    if abs(value) >= GIB:
        return f"{value / GIB:.1f} GiB"
    return f"{value / 2**20:.0f} MiB"


def as_dict(c: Candidate, batches: list[Batch]) -> dict[str, Any]:
    return {
        "layout": c.layout,
        "shard": c.shard,
        "replicate": c.replicate,
        "activation_checkpointing": c.activation_checkpointing,
        "precision": c.precision,
        "grad_accum": c.grad_accum,
        "context_parallel": c.cp,
        "context_parallel_ulysses": c.ulysses,
        "status": c.status,
        "reason": c.reason,
        "step_s": round(c.mean_step_s, 6),
        "buckets": [
            {
                "bucket": b.label,
                "global_batch": b.global_batch,
                "micro_batch": m,
                "step_s": round(s, 6),
                "peak_bytes": p,
                "parts": parts,
            }
            for b, m, s, p, parts in zip(
                batches,
                c.micro_batches,
                c.step_s,
                c.peak or [None] * len(batches),
                c.parts or [{}] * len(batches),
                strict=True,
            )
        ],
    }
