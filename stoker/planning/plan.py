"""A plan of one experiment for one target: its candidates ranked, the chosen one, the
micro-batch of each bucket, and the settings that make the experiment run it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stoker.errors import StokerError
from stoker.modes import ResolvedPrecision
from stoker.planning import trace
from stoker.planning.search import (
    Batch,
    Candidate,
    Target,
    as_dict,
    enumerate_candidates,
    need_bytes,
    search,
    size_text,
    time_candidates,
    usable_bytes,
)
from stoker.planning.trace import ModelFacts
from stoker.planning.tracers import tracer_for


@dataclass
class Plan:
    target: Target
    batches: list[Batch]
    facts: ModelFacts
    candidates: list[Candidate]
    """Fastest first."""
    chosen: Candidate | None
    traces: int
    seconds: float

    def settings(self) -> dict[str, Any]:
        """The experiment keys that make a run take the chosen candidate."""
        c = self.chosen
        if c is None:
            return {}
        gpu = self.target.gpu is not None
        # A rank per GPU, or the CPU ranks planned: said either way, since an experiment
        # that sets job.ntasks_per_node (two CPU ranks, say) would otherwise keep it.
        out: dict[str, Any] = {
            "job.nodes": self.target.nodes,
            "job.gpus_per_node": self.target.ranks_per_node if gpu else 0,
            "job.ntasks_per_node": self.target.ranks_per_node,
            "train.activation_checkpointing": c.activation_checkpointing,
            "train.precision": c.precision,
            "train.grad_accum": c.grad_accum,
        }
        if c.cp > 1:
            out["train.context_parallel"] = c.cp
            out["train.context_parallel_ulysses"] = c.ulysses
        if self.target.spare_nodes:
            out["job.spare_nodes"] = self.target.spare_nodes
        if self.target.nodes > 1:
            out["train.sharding"] = c.sharding
        return out

    def to_json(self) -> dict[str, Any]:
        t = self.target
        return {
            "target": {
                "nodes": t.nodes,
                "spare_nodes": t.spare_nodes,
                "ranks_per_node": t.ranks_per_node,
                "world": t.world,
                "gpu": t.gpu.name if t.gpu else "cpu",
                "memory_bytes": t.memory_bytes,
                "usable_bytes": usable_bytes(t),
                "margin": t.margin,
                "source": t.source,
            },
            "model": {
                "params": self.facts.params,
                "blocks": self.facts.blocks,
                "flops_per_sample": list(self.facts.flops_per_sample),
                "flops_source": self.facts.flops_source,
            },
            "chosen": as_dict(self.chosen, self.batches) if self.chosen else None,
            "settings": self.settings(),
            "candidates": [as_dict(c, self.batches) for c in self.candidates],
            "traces": self.traces,
            "seconds": round(self.seconds, 3),
        }


def plan_batches(cfg: Any) -> list[Batch]:
    """The shapes a run's steps come in, with their global batches."""
    from stoker.data.sets.buckets import resolve_buckets

    buckets = resolve_buckets(cfg.data)
    if not buckets:
        return [Batch(None, "the data's shape", cfg.data.batch_size)]
    return [
        Batch(
            i,
            f"bucket {i} ({b.resolution[0]}x{b.resolution[1]}, {b.clip_seconds:g} s)",
            b.batch_size,
        )
        for i, b in enumerate(buckets)
    ]


def make_plan(
    cfg: Any, target: Target, *, trace_all: bool | Callable[[Candidate], bool] = False
) -> Plan:
    """Trace, time and choose (search.py). A StokerError when no candidate can exist.
    `trace_all`: trace every candidate, or those it returns True for."""
    began = time.perf_counter()
    batches = plan_batches(cfg)
    precisions = _precisions(cfg, target)
    with tracer_for(cfg, len(batches)) as (tracer, width):  # workers start meanwhile
        facts = trace.model_facts(cfg, [b.bucket for b in batches])
        candidates = enumerate_candidates(target, batches, facts, precisions)
        if not candidates:  # not even a CP group's share of the ranks splits a batch
            _refuse_batch(batches, target)
        time_candidates(candidates, target, facts)
        chosen, traces = search(
            candidates,
            target,
            batches,
            tracer,
            facts.flops_per_sample,
            width=width,
            trace_all=trace_all,
        )
    candidates.sort(key=lambda c: c.mean_step_s)
    return Plan(target, batches, facts, candidates, chosen, traces, time.perf_counter() - began)


def _refuse_batch(batches: list[Batch], target: Target) -> None:
    for b in batches:
        if b.global_batch % target.world:
            key = "data.batch_size" if b.bucket is None else f"data.buckets[{b.bucket}]"
            raise StokerError(
                f"{key}: a global batch of {b.global_batch} does not split over "
                f"{target.world} ranks ({target.nodes} node(s) x {target.ranks_per_node})",
                fix=f"use a multiple of {target.world}, or plan for another number of nodes",
            )
    raise StokerError(f"no candidate for {target.world} ranks", fix="plan for other ranks")


def _precisions(cfg: Any, target: Target) -> list[ResolvedPrecision]:
    asked = cfg.train.precision
    if asked != "auto":
        return [asked]
    # auto is bf16 on every GPU of the table; on a CPU target, what this CPU would take.
    if target.gpu is not None:
        return ["bf16", "fp32"]
    import torch

    from stoker.runtime.dist.precision import resolve_precision

    return [resolve_precision("auto", torch.device("cpu")).value]


def fits_note(plan: Plan) -> str:
    """One line on the chosen one's need, or why none fits."""
    if plan.chosen is None:
        return "no candidate fits: " + (plan.candidates[0].reason if plan.candidates else "none")
    c = plan.chosen
    worst = max(need_bytes(p or 0, plan.target, c.replicate) for p in c.peak)
    note = f"{c.describe()}: needs {size_text(worst)} of {size_text(usable_bytes(plan.target))}"
    return note + needs_cp_note(plan)


def needs_cp_note(plan: Plan) -> str:
    """'; needs CP on 80 GB: activations 61 GiB at CP 1 (CP 4 chosen)' when the chosen
    takes CP and no candidate without it fits (the activations of the least needy one
    named); else ''. The chosen degree is the fastest that fits, not always the least."""
    c, target = plan.chosen, plan.target
    if (
        c is None
        or c.cp == 1
        or any(o.cp == 1 and o.status in ("fits", "chosen") for o in plan.candidates)
    ):
        return ""
    without = [o for o in plan.candidates if o.cp == 1 and o.status == "too big" and o.peak]
    memory = target.memory_bytes
    gpu = f"{memory / 1e9:.0f} GB" if memory >= 1e9 else size_text(memory)
    chosen = f"CP {c.cp} chosen"
    if not without:
        return f"; needs CP on {gpu} ({chosen})"
    least = min(without, key=lambda o: max(p or 0 for p in o.peak))
    worst = max(range(len(least.peak)), key=lambda i: least.peak[i] or 0)
    activations = size_text(least.parts[worst].get("activations", 0))
    return f"; needs CP on {gpu}: activations {activations} at CP 1 ({chosen})"
