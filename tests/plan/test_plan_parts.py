"""The plan's parts that need no trace: GPU and partition facts, sizes, the roofline's
ordering, the search's statuses and reasons (with a tracer of known peaks), and the
experiment file `--write` leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.cli.plan import parse_memory, write_planned
from stoker.config import resolve_config
from stoker.errors import StokerError
from stoker.gpus import gpu_spec
from stoker.launcher.slurm.partition_facts import parse_gpu_gres, parse_partition
from stoker.planning.search import (
    GIB,
    Batch,
    Target,
    enumerate_candidates,
    search,
    time_candidates,
)
from stoker.planning.timing import StepWork, step_time
from stoker.planning.trace import ModelFacts, Traced, TraceSpec


@pytest.mark.parametrize(
    ("name", "expected"),
    [("NVIDIA H100 80GB HBM3", "H100 SXM"), ("h100", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
     ("h200", "H200 SXM"), ("NVIDIA GH200 480GB", "GH200"), ("a100_40g", "A100 40GB"),
     ("NVIDIA A100-SXM4-80GB", "A100 80GB"), ("NVIDIA A10", "A10"), ("l40s", "L40S"),
     ("B200", "B200")],
)  # fmt: skip
def test_gpus_are_matched_by_name_most_specific_first(name: str, expected: str) -> None:
    spec = gpu_spec(name)
    assert spec is not None and spec.name == expected
    assert gpu_spec("GeForce GTX 1080") is None


def test_gres_and_partitions_from_sinfo() -> None:
    assert parse_gpu_gres("gpu:h100:8(S:0-1)") == ("h100", 8)
    assert parse_gpu_gres("gpu:4") == (None, 4)
    assert parse_gpu_gres("(null)") == (None, 0)
    assert parse_gpu_gres("shard:8,gpu:a100:4") == ("a100", 4)
    text = ("cpu*|10|(null)|256000|64\ngpu|6|gpu:h100:8(S:0-1)|1024000|96\n"
            "gpu|2|gpu:h100:4|512000+|48+\n")  # fmt: skip
    gpu = parse_partition(text, "gpu")
    # Mixed nodes: the plan must fit the smaller ones.
    assert gpu is not None and (gpu.nodes, gpu.gpus_per_node, gpu.gpu_type) == (8, 4, "h100")
    assert gpu.node_memory_mb == 512000
    assert gpu.node_cpus == 96  # a job may go to the larger nodes: SLURM places it
    default = parse_partition(text, None)
    assert default is not None and (default.name, default.gpus_per_node) == ("cpu", 0)
    assert parse_partition(text, "nope") is None


def test_memory_sizes() -> None:
    assert parse_memory("80GB") == parse_memory("80G") == parse_memory("80GiB") == 80 * GIB
    assert parse_memory("141") == 141 * GIB
    assert parse_memory("512MB") == 512 * 2**20
    with pytest.raises(StokerError, match="'eighty' is not a size"):
        parse_memory("eighty")


def test_the_roofline_orders_what_costs_more() -> None:
    h100 = gpu_spec("H100")
    assert h100 is not None

    def seconds(**change: object) -> float:
        work = {"flops": 1e15, "params": 10**9, "shard": 8, "replicate": 1, "accum": 1,
                "activation_checkpointing": "none", "precision": "bf16", **change}  # fmt: skip
        return step_time(StepWork(**work), h100, 8, 50e9).seconds  # type: ignore[arg-type]

    assert seconds() < seconds(activation_checkpointing="selective") < seconds(
        activation_checkpointing="full")  # fmt: skip
    assert seconds(precision="fp32") > 10 * seconds()
    # Sharding over two nodes moves the gathers onto the network: slower than HSDP's
    # in-node gathers plus one all-reduce per step.
    assert seconds(shard=16) > seconds(shard=8, replicate=2) > seconds()
    # Many small micro-batches re-gather the weights each time: the gathers show.
    assert seconds(accum=512) > seconds()


def _fake_tracer(per_row: dict[str, int]) -> tuple[list[TraceSpec], object]:
    seen: list[TraceSpec] = []

    def tracer(specs: list[TraceSpec]) -> list[Traced]:
        seen.extend(specs)
        peaks = [GIB + per_row[s.activation_checkpointing] * s.micro_batch for s in specs]
        return [Traced(peak, {"activations": peak - GIB, "params": GIB}) for peak in peaks]

    return seen, tracer


def test_the_search_chooses_the_fastest_that_fits_and_says_why_of_each() -> None:
    target = Target(2, 4, None, 20 * GIB, "test", margin=0.0)
    facts = ModelFacts(10**8, 4, (1e12,), "test")
    batches = [Batch(None, "the data's shape", 64)]
    candidates = enumerate_candidates(target, batches, facts, ["fp32"])
    # Two layouts (FSDP over 8, HSDP 2x4) x three modes x accumulation 1, 2, 4, 8.
    assert len(candidates) == 2 * 3 * 4
    time_candidates(candidates, target, facts)
    seen, tracer = _fake_tracer({"none": 4 * GIB, "selective": 2 * GIB, "full": GIB})
    chosen, traces = search(candidates, target, batches, tracer, facts.flops_per_sample)  # type: ignore[arg-type]
    assert chosen is not None and traces == len(seen)
    # Micro-batch 8 with none needs 33 GiB; with accumulation 2 (micro-batch 4), 17 GiB
    # and no recompute: faster than selective at 8 (also 17 GiB), so chosen.
    assert (chosen.activation_checkpointing, chosen.grad_accum) == ("none", 2)
    statuses = {c.status for c in candidates}
    assert statuses == {"chosen", "too big", "slower"}
    too_big = [c for c in candidates if c.status == "too big"]
    assert all("> 20.0 GiB usable" in c.reason and "activations" in c.reason for c in too_big)
    assert all(c.mean_step_s <= chosen.mean_step_s for c in too_big)
    slower = [c for c in candidates if c.status == "slower"]
    assert all("the chosen step time" in c.reason and c.peak == [] for c in slower)
    # With trace_all every candidate is traced and keeps its peak.
    candidates = enumerate_candidates(target, batches, facts, ["fp32"])
    time_candidates(candidates, target, facts)
    _, tracer = _fake_tracer({"none": 4 * GIB, "selective": 2 * GIB, "full": GIB})
    search(
        candidates,
        target,
        batches,
        tracer,  # type: ignore[arg-type]
        facts.flops_per_sample,
        trace_all=True,
    )
    assert all(c.peak for c in candidates) and {"fits", "chosen"} <= {c.status for c in candidates}


def test_a_kind_that_cannot_fit_is_judged_by_its_least_needy_candidate() -> None:
    """Nothing fits 1.5 GiB (full recompute at one row needs 2): after two candidates of
    a kind (precision, CP, accumulation) are too big, the least needy of that kind is
    traced, and when it is too big every other of its kind is said too big untraced,
    naming it. A search over 24 candidates then traces a handful."""
    target = Target(2, 4, None, int(1.5 * GIB), "test", margin=0.0)
    facts = ModelFacts(10**8, 4, (1e12,), "test")
    batches = [Batch(None, "the data's shape", 64)]
    candidates = enumerate_candidates(target, batches, facts, ["fp32"])
    time_candidates(candidates, target, facts)
    seen, tracer = _fake_tracer({"none": 4 * GIB, "selective": 2 * GIB, "full": GIB})
    chosen, traces = search(candidates, target, batches, tracer, facts.flops_per_sample)  # type: ignore[arg-type]
    assert chosen is None and all(c.status == "too big" for c in candidates)
    traced = [c for c in candidates if c.peak]
    assert traces == len(seen) <= 8 < len(candidates), [c.describe() for c in traced]
    # The least needy of each kind was traced: full recompute, the smallest micro-batch.
    for accumulates in (False, True):
        kind = [c for c in candidates if (c.grad_accum > 1) == accumulates]
        least = min(
            kind, key=lambda c: (c.micro_batches[0], -c.shard, c.activation_checkpointing != "full")
        )
        assert least.peak and least.activation_checkpointing == "full", least.describe()
    for c in candidates:
        if not c.peak:
            named = next(
                o for o in traced if c.reason.startswith(f"needs more than {o.describe()},")
            )
            # It holds at least what the named one does: as many rows, and the
            # accumulated gradients if that one holds them.
            assert c.micro_batches[0] >= named.micro_batches[0], c.reason
            assert c.grad_accum > 1 or named.grad_accum == 1, c.reason


def test_write_keeps_the_experiment_and_sets_the_plan(tmp_path: Path) -> None:
    experiment = tmp_path / "exp.yaml"
    experiment.write_text("model:\n  size: tiny\ndata:\n  batch_size: 8\n  fps: 8\n")
    out = tmp_path / "planned.yaml"
    write_planned(out, experiment, ["train.steps=50"],
                  {"job.nodes": 1, "job.gpus_per_node": 8, "train.grad_accum": 2,
                   "train.activation_checkpointing": "selective"})  # fmt: skip
    text = out.read_text()
    assert text.startswith("# Planned by `stoker plan` from ")
    cfg = resolve_config(out, use_profile=False).config
    assert (cfg.model.size, cfg.data.batch_size, cfg.train.steps) == ("tiny", 8, 50)
    assert (cfg.job.gpus_per_node, cfg.train.grad_accum) == (8, 2)
    assert cfg.train.activation_checkpointing == "selective"
    # A plan the schema refuses is never written, and the file there stays as it was.
    from stoker.config import ConfigError

    with pytest.raises(ConfigError):
        write_planned(out, experiment, [], {"train.grad_accum": 0})
    assert out.read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml", "planned.yaml"]
