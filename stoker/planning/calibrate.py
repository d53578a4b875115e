"""`stoker plan --calibrate RUN|CKPT`: the plan of the run's own settings held against
what its steps measured (runtime/step_memory.py; a checkpoint carries both, as of its
commit): per batch shape, the traced peak against
the measured one and the estimated step time against the measured median; on a GPU,
the allowances the plan adds (allocator slack, CUDA context and NCCL) against what the
run had: reserved over allocated, and the device's use beyond the allocator's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker.config import ExperimentConfig
from stoker.errors import StokerError
from stoker.gpus import gpu_spec
from stoker.modes import ResolvedPrecision
from stoker.planning import trace
from stoker.planning.plan import plan_batches
from stoker.planning.search import (
    ALLOCATOR_SLACK,
    CUDA_CONTEXT_BYTES,
    GIB,
    NCCL_BYTES,
    Candidate,
    Target,
    time_candidates,
)
from stoker.planning.trace import TraceSpec
from stoker.runtime.observe.step_memory import read_measured, shape_name


@dataclass
class ShapeCheck:
    shape: str
    micro_batch: int
    micro_batches: int
    measured_bytes: int | None
    planned_bytes: int
    measured_step_s: float | None
    planned_step_s: float
    source: str

    @property
    def memory_error(self) -> float | None:
        if not self.measured_bytes:
            return None
        return (self.planned_bytes - self.measured_bytes) / self.measured_bytes

    @property
    def time_error(self) -> float | None:
        if not self.measured_step_s:
            return None
        return (self.planned_step_s - self.measured_step_s) / self.measured_step_s


@dataclass
class Calibration:
    source: str
    """The run folder, or the checkpoint step folder, the measures were read from."""
    label: str
    """What the report's title calls it: "run <name>" or "checkpoint <step folder>"."""
    device: str
    world: int
    shapes: list[ShapeCheck]
    allowances: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "device": self.device,
            "world_size": self.world,
            "shapes": [
                {**s.__dict__, "memory_error": s.memory_error, "time_error": s.time_error}
                for s in self.shapes
            ],
            "allowances": self.allowances,
            "notes": self.notes,
        }

    def sections(self) -> list[tuple[str, list[str], list[list[str]]]]:
        def pct(value: float | None) -> str:
            return "-" if value is None else f"{100 * value:+.1f}%"

        rows = [
            [
                s.shape,
                f"{s.micro_batch} x {s.micro_batches}",
                _mib(s.measured_bytes),
                _mib(s.planned_bytes),
                pct(s.memory_error),
                _ms(s.measured_step_s),
                _ms(s.planned_step_s),
                pct(s.time_error),
                s.source,
            ]
            for s in self.shapes
        ]
        out = [
            (
                f"Plan against {self.label} ({self.device}, {self.world} ranks)",
                [
                    "SHAPE",
                    "MICRO x N",
                    "PEAK RUN",
                    "PEAK PLAN",
                    "ERROR",
                    "STEP RUN",
                    "STEP PLAN",
                    "ERROR",
                    "MEASURED BY",
                ],
                rows,
            )
        ]
        if self.allowances:
            out.append(
                (
                    "Allowances (GPU): assumed against measured",
                    ["", "ASSUMED", "MEASURED"],
                    [
                        [name, f"{v['assumed']:.3g}", f"{v['measured']:.3g}"]
                        for name, v in self.allowances.items()
                    ],
                )
            )
        return out


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f} MiB"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


def calibrate(run_dir: Path) -> Calibration:
    """The calibration of a run folder: its frozen config and measured-steps.json."""
    from stoker.config import load_frozen

    measured = read_measured(run_dir)
    if measured is None:
        raise StokerError(
            f"{run_dir} has no measured-steps.json: the run measured nothing yet",
            fix="train at least one log step; on CPU with train.measure_memory=true",
        )
    try:
        cfg = load_frozen(run_dir / "config.yaml")
    except OSError as exc:
        raise StokerError(
            f"{run_dir} has no readable config.yaml: {exc}",
            fix="give the run's folder (`stoker status --json` shows run_dir)",
        ) from exc
    return calibrate_measured(cfg, measured, source=str(run_dir), label=f"run {run_dir.name}")


def calibrate_measured(
    cfg: ExperimentConfig, measured: dict[str, Any], *, source: str, label: str
) -> Calibration:
    """The plan of `cfg` held against `measured` (a measured-steps.json document, as
    step_memory.read_measured gives it), read from `source`."""
    world = int(measured["world_size"])
    device = str(measured.get("device", "cpu"))
    spec = gpu_spec(device) if device != "cpu" else None
    per_node = max(1, world // max(1, cfg.job.nodes))
    target = Target(
        world // per_node,
        per_node,
        spec,
        int(spec.memory_gib * GIB) if spec else 0,
        label,
    )
    shard = per_node if cfg.train.sharding == "node" and target.nodes > 1 else world
    precision: ResolvedPrecision = "bf16" if measured.get("precision") == "bf16" else "fp32"
    batches = plan_batches(cfg)
    names = {shape_name(trace.random_batch(cfg, 1, bucket=b.bucket)): b for b in batches}
    facts = trace.model_facts(cfg, [b.bucket for b in batches])
    flops = dict(zip([b.bucket for b in batches], facts.flops_per_sample, strict=True))
    checks: list[ShapeCheck] = []
    try:
        for name, entry in sorted(measured.get("shapes", {}).items()):
            batch = names.get(name)
            rows, count = int(entry["micro_batch"]), int(entry["micro_batches"])
            if batch is None:
                continue
            spec_ = TraceSpec(
                world,
                shard,
                cfg.train.activation_checkpointing,
                precision,
                rows,
                min(count, 2),
                batch.bucket,
                spec is not None,
            )
            traced = trace.trace_step(cfg, spec_)
            candidate = Candidate(
                shard,
                world // shard,
                spec_.activation_checkpointing,
                precision,
                count,
                [spec_.micro_batch],
            )
            one = dataclasses.replace(facts, flops_per_sample=(flops[batch.bucket],))
            time_candidates([candidate], target, one)
            checks.append(
                ShapeCheck(
                    name,
                    spec_.micro_batch,
                    count,
                    entry.get("peak_bytes"),
                    traced.peak,
                    entry.get("step_s"),
                    candidate.step_s[0],
                    str(entry.get("peak_source", "-")),
                )
            )
    finally:
        trace.close()
    result = Calibration(source, label, device, world, checks)
    if spec is None:
        result.notes.append("a CPU run: the step times are a GPU roofline's, not comparable")
    for entry in measured.get("shapes", {}).values():
        if "reserved_bytes" in entry and entry.get("peak_bytes"):
            result.allowances["allocator slack (reserved / allocated - 1)"] = {
                "assumed": ALLOCATOR_SLACK,
                "measured": entry["reserved_bytes"] / entry["peak_bytes"] - 1,
            }
            outside = entry["device_used_bytes"] - entry["reserved_bytes"]
            result.allowances["outside the allocator, GiB (context + NCCL)"] = {
                "assumed": (CUDA_CONTEXT_BYTES + NCCL_BYTES) / GIB,
                "measured": outside / GIB,
            }
            break
    return result
