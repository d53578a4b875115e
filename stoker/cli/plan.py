"""`stoker plan`: the layout, activation checkpointing, precision and micro-batch per
bucket that fit the target's GPUs, fastest first, before anything is queued."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from stoker.errors import StokerError

if TYPE_CHECKING:
    from stoker.cli.output import Section
    from stoker.config import ExperimentConfig
    from stoker.planning.calibrate import Calibration
    from stoker.planning.plan import Plan
    from stoker.planning.search import Target

_SIZE = re.compile(r"^\s*(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]i?B?|)\s*$", re.IGNORECASE)


def parse_memory(text: str, flag: str = "--gpu-memory") -> int:
    """Bytes from '80GB', '80G', '80GiB' or '141' (GiB): GPU memory is sold in GiB."""
    match = _SIZE.match(text)
    if match is None:
        raise StokerError(f"{flag} {text!r} is not a size", fix=f"use e.g. {flag} 80GB")
    unit = (match.group("unit") or "G")[0].upper()
    return int(float(match.group("n")) * 1024 ** "KMGT".index(unit) * 1024)


def plan(
    args: list[str] = typer.Argument(
        None,
        metavar="EXP.yaml KEY=VALUE",
        help="Experiment file (default: the built-in experiment), then overrides.",
    ),
    partition: str | None = typer.Option(
        None,
        "--partition",
        "-p",
        help="Plan for this SLURM partition (sinfo: GPUs per node, their type).",
    ),
    nodes: int | None = typer.Option(None, "--nodes", min=1, help="Nodes (default: job.nodes)."),
    gpus_per_node: int | None = typer.Option(
        None,
        "--gpus-per-node",
        min=0,
        help="GPUs per node; 0 plans CPU ranks (job.ntasks_per_node).",
    ),
    gpu: str | None = typer.Option(
        None, "--gpu", help="GPU model: H100, H200, A100, L40S, B200..."
    ),
    gpu_memory: str | None = typer.Option(
        None,
        "--gpu-memory",
        help="Memory per GPU (per rank on CPUs), e.g. 80GB: overrides the table's.",
    ),
    margin: float = typer.Option(
        0.05, "--margin", min=0.0, max=0.5, help="Memory left free, a share."
    ),
    inter_node_gbps: float | None = typer.Option(
        None, "--inter-node-gbps", help="Network per GPU between nodes, Gb/s (default 400)."
    ),
    trace_all: bool = typer.Option(
        False, "--trace-all", help="Trace every candidate at its own micro-batch (slower)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON document."),
    write: Path | None = typer.Option(
        None, "--write", help="Write the experiment with the chosen settings to this file."
    ),
    calibrate: str | None = typer.Option(
        None,
        "--calibrate",
        metavar="RUN|CKPT",
        help="Compare the plan with what a run measured: its folder, its job id, or a "
        "checkpoint it saved (local or s3://), which carries its config and measures.",
    ),
    profile: Path | None = typer.Option(None, "--profile", help="Site profile to use."),
    no_profile: bool = typer.Option(False, "--no-profile", help="Use no site profile."),
) -> None:
    """Plan an experiment's parallelism and memory before it is queued: on this machine,
    without a GPU, each candidate (FSDP2 or HSDP, activation checkpointing none /
    selective / full, bf16 or fp32, micro-batch x gradient accumulation reaching the
    global batch) is traced on fake tensors as one rank of the target would run it, and
    timed by a roofline of its FLOPs and collectives. The fastest that fits is chosen;
    every other candidate says why not. docs/plan.md says what is modelled.

    Examples: stoker plan exp.yaml --partition gpu ; stoker plan exp.yaml
    --gpus-per-node 8 --gpu H100 --nodes 2 --write planned.yaml ; stoker plan
    --calibrate RUN ; stoker plan --calibrate s3://bucket/exp/checkpoints
    """
    from stoker.cli.output import note, print_json, print_sections

    if calibrate is not None:
        _calibrate(calibrate, as_json=as_json)
        return
    from stoker.cli.config import split_experiment_args
    from stoker.config import resolve_config

    experiment, overrides = split_experiment_args(args or [])
    cfg = resolve_config(experiment, overrides, profile=profile, use_profile=not no_profile).config
    target = make_target(
        cfg,
        partition=partition,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu=gpu,
        gpu_memory=gpu_memory,
        margin=margin,
        inter_node_gbps=inter_node_gbps,
    )
    note(f"planning for {target.source}: tracing candidates on fake tensors...")
    from stoker.process.gc_pause import pause_collector, resume_collector

    pause_collector()  # while torch and the runtime import (stoker/process/gc_pause.py)
    try:
        from stoker.planning.plan import make_plan
    finally:
        resume_collector()
    result = make_plan(cfg, target, trace_all=trace_all)
    if write is not None and result.chosen is not None:
        write_planned(write, experiment, overrides, result.settings())
        note(f"wrote {write}")
    if as_json:
        print_json(result.to_json())
    else:
        print_sections(sections(result))
        _say_choice(result)
    note(f"{len(result.candidates)} candidates, {result.traces} traces, {result.seconds:.1f} s")
    if result.chosen is None:
        raise typer.Exit(1)


def make_target(
    cfg: ExperimentConfig,
    *,
    partition: str | None,
    nodes: int | None,
    gpus_per_node: int | None,
    gpu: str | None,
    gpu_memory: str | None,
    margin: float,
    inter_node_gbps: float | None,
) -> Target:
    """Where the plan is for: flags over the partition's facts over the experiment's job."""
    from stoker.gpus import gpu_spec, known_gpu_names
    from stoker.planning.search import GIB, Target
    from stoker.planning.timing import INTER_NODE_BYTES_S

    job = cfg.job
    source = "the experiment's job settings"
    per_node = gpus_per_node if gpus_per_node is not None else job.gpus_per_node
    gpu_name = gpu
    node_memory_mb: int | None = None
    partition_nodes: int | None = None
    if partition is not None or (gpus_per_node is None and gpu is None and job.partition):
        from stoker.launcher.slurm.partition_facts import partition_facts

        facts = partition_facts(partition or job.partition)
        source = f"partition {facts.name} (sinfo)"
        per_node = gpus_per_node if gpus_per_node is not None else facts.gpus_per_node
        gpu_name = gpu or facts.gpu_type
        node_memory_mb = facts.node_memory_mb
        partition_nodes = facts.nodes
    node_count = nodes or job.nodes
    spares = job.spare_nodes
    if partition_nodes is not None and node_count + spares > partition_nodes:
        asked = f"{node_count} nodes asked (--nodes or job.nodes)"
        if spares:
            asked += f" and {spares} spare (job.spare_nodes)"
        raise StokerError(
            f"{asked} but {source} has {partition_nodes}",
            fix=f"plan for at most {partition_nodes - spares} nodes, or for another partition",
        )
    # Spares train nothing: named beside the training nodes, in the plan's settings too.
    spare_text = f" + {spares} spare node(s)" if spares else ""
    inter = inter_node_gbps * 1e9 / 8 if inter_node_gbps else INTER_NODE_BYTES_S
    if gpus_per_node is not None or gpu is not None:
        source = f"{source} and flags" if partition else "the flags"
    if per_node == 0:
        ranks = job.ntasks_per_node or 2
        if gpu_memory is not None:
            memory = parse_memory(gpu_memory)
        else:
            memory = (node_memory_mb * 2**20 if node_memory_mb else _host_memory()) // ranks
        where = f"{source}: {node_count} x {ranks} CPU ranks{spare_text}"
        return Target(node_count, ranks, None, memory, where, inter, margin, spares)
    if gpu_name is None:
        raise StokerError(
            f"which GPU has {source}? the GPU type is not known",
            fix=f"give --gpu (one of {', '.join(known_gpu_names())}) and, if it is not one "
            "of those, --gpu-memory",
        )
    spec = gpu_spec(gpu_name)
    if spec is None:  # no silent stand-in: its FLOP/s and bandwidths time the candidates
        raise StokerError(
            f"GPU {gpu_name!r} is not in stoker's table ({', '.join(known_gpu_names())})",
            fix="give --gpu with the one whose figures are closest, and --gpu-memory with "
            "this GPU's memory",
        )
    if gpu_memory is not None:
        spec = spec.with_memory(parse_memory(gpu_memory) / GIB)
    where = f"{source}: {node_count} x {per_node} {spec.name} ({spec.memory_gib:g} GiB){spare_text}"
    return Target(
        node_count, per_node, spec, int(spec.memory_gib * GIB), where, inter, margin, spares
    )


def _host_memory() -> int:
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def sections(result: Plan) -> list[Section]:
    from stoker.planning.search import size_text

    head = ["#", "LAYOUT", "AC", "PRECISION", "MICRO x ACCUM", "STEP", "PEAK", "STATUS", "WHY"]
    rows = []
    for n, c in enumerate(result.candidates, 1):
        layout = f"fsdp {c.shard}" if c.replicate == 1 else f"hsdp {c.replicate}x{c.shard}"
        layout = ("1 rank" if c.shard * c.replicate == 1 else layout) + c.cp_text()
        micro = "/".join(str(m) for m in c.micro_batches)
        peak = max((p for p in c.peak if p is not None), default=None) if c.peak else None
        rows.append(
            [
                str(n),
                layout,
                c.activation_checkpointing,
                c.precision,
                f"{micro} x {c.grad_accum}",
                f"{c.mean_step_s * 1000:.1f} ms",
                size_text(peak),
                c.status,
                c.reason,
            ]
        )
    out: list[Section] = [("Candidates, fastest first (step time estimated)", head, rows)]
    chosen = result.chosen
    if chosen is not None:
        c = chosen
        bucket_rows = [
            [
                b.label,
                str(b.global_batch),
                str(m),
                str(c.grad_accum),
                size_text(p),
                f"{s * 1000:.1f} ms",
            ]
            for b, m, p, s in zip(result.batches, c.micro_batches, c.peak, c.step_s, strict=True)
        ]
        out.append(
            (
                "Per bucket, the chosen plan",
                ["SHAPE", "GLOBAL BATCH", "MICRO-BATCH", "ACCUM", "PEAK", "STEP"],
                bucket_rows,
            )
        )
    return out


def _say_choice(result: Plan) -> None:
    from stoker.cli.output import out
    from stoker.planning.plan import fits_note
    from stoker.planning.search import memory_legend

    out().print(f"\n{memory_legend(result.target)}", markup=False)
    out().print(fits_note(result), markup=False)
    settings = result.settings()
    if settings:
        out().print("settings: " + " ".join(f"{k}={v}" for k, v in settings.items()), markup=False)


def write_planned(
    path: Path, experiment: Path | None, overrides: list[str], settings: dict[str, Any]
) -> None:
    """The experiment file with the command line's overrides and the plan's settings
    set in it. Written beside `path` first and checked to resolve: a file that would not
    is never left at `path` (nor one there replaced)."""
    import os

    import yaml

    from stoker.config import resolve_config
    from stoker.config.overrides import parse_override

    data: dict[str, Any] = {}
    if experiment is not None:
        loaded = yaml.safe_load(experiment.read_text())
        data = loaded if isinstance(loaded, dict) else {}
    keys: list[tuple[tuple[str, ...], Any]] = [parse_override(o)[:2] for o in overrides]
    keys += [(tuple(k.split(".")), v) for k, v in settings.items()]
    for key, value in keys:
        node = data
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    header = (
        f"# Planned by `stoker plan`{f' from {experiment}' if experiment else ''}: "
        + " ".join(f"{k}={v}" for k, v in settings.items())
        + "\n"
    )
    staged = path.with_name(f".{path.name}.planned")
    staged.write_text(header + yaml.safe_dump(data, sort_keys=False))
    try:
        resolve_config(staged, use_profile=False)  # a ConfigError names the values
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)


def _calibrate(source: str, *, as_json: bool) -> None:
    from stoker.cli.output import note, print_json, print_sections
    from stoker.planning.calibrate import calibrate

    run_dir = _run_folder(source)
    report = calibrate(run_dir) if run_dir is not None else _calibrate_checkpoint(source)
    if as_json:
        print_json(report.to_json())
        return
    print_sections(report.sections())
    for line in report.notes:
        note(line)


def _calibrate_checkpoint(url: str) -> Calibration:
    """The calibration a checkpoint carries: its commit's config.yaml and the steps the
    run had measured when it committed (a root: its newest that verifies)."""
    from stoker.checkpoint.commit import MEASURED_NAME
    from stoker.checkpoint.origin import saved_description
    from stoker.cli.ckpt_root import carried_config
    from stoker.planning.calibrate import calibrate_measured
    from stoker.runtime.observe.step_memory import parse_measured

    described = saved_description(url)
    fix = "give the run folder that saved it (`stoker status --json` shows run_dir)"
    cfg = carried_config(described, fix=fix)
    measured = parse_measured(described.measured_text or "")
    if measured is None:
        raise StokerError(
            f"{described.folder} carries no {MEASURED_NAME}: saved before the run's first "
            "log step, or by an older stoker",
            fix=fix,
        )
    folder = described.folder.rstrip("/")
    return calibrate_measured(
        cfg, measured, source=folder, label=f"checkpoint {folder.rsplit('/', 2)[-1]}"
    )


def _run_folder(source: str) -> Path | None:
    """The run folder `source` names (a folder, or a job of the ledger); None for a
    checkpoint (a URL, a checkpoint root or step folder)."""
    path = Path(source)
    if "://" in source or (path / "COMMIT.json").is_file() or _holds_steps(path):
        return None
    if path.is_dir():
        return path
    from stoker.launcher.jobs.ledger import Ledger

    record = Ledger().get(source)
    if record is None:
        raise StokerError(
            f"{source!r} is neither a run folder, a checkpoint nor a job in the ledger",
            fix="give the run folder (`stoker status --json` shows run_dir), a checkpoint "
            "(root or step-<N> folder, local or s3://) or the job id",
        )
    return Path(record.run_dir)


def _holds_steps(path: Path) -> bool:
    """A checkpoint root: step-<N> folders, and not a run folder's config beside them."""
    return (
        path.is_dir()
        and not (path / "config.yaml").is_file()
        and any(p.name.startswith("step-") for p in path.iterdir())
    )
