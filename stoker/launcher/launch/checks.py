"""What a launch must pass before anything is created: each check raises a StokerError
naming the bad value, where it came from and the fix.

`submit` (for SLURM, `--local` and `stoker run` alike) runs them before it makes a run
folder, an MLflow run or a job, so that a refused launch leaves nothing behind.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from stoker.config import ResolvedConfig
from stoker.errors import StokerError

# `--after 123`, `--after 123_4`, `--after 123:456` (all must succeed).
_AFTER = re.compile(r"^\d+(_\d+)?(:\d+(_\d+)?)*$")
# Characters that would break an `#SBATCH --output=` path or the script's quoting rules.
_UNSAFE_PATH = re.compile(r"[\s'\"\\\x00-\x1f\x7f]")


def check_launch(resolved: ResolvedConfig, after: str | None) -> None:
    """The checks on a config and `--after` that the rendered script depends on."""
    check_after(after)
    check_stop_grace(resolved)
    check_eval_data(resolved)
    check_context_parallel(resolved)
    check_buckets(resolved)
    check_pass_env(resolved)
    check_no_tracking(resolved)


def check_run_root(root: Path) -> None:
    if _UNSAFE_PATH.search(str(root)):
        raise StokerError(
            f"the runs folder {str(root)!r} contains whitespace, a quote, a backslash or a "
            "control character, which SLURM's #SBATCH --output cannot take",
            fix="set STOKER_HOME to a path without them",
        )


def check_after(after: str | None) -> None:
    """`--after`: one SLURM job id, or several joined with ':'."""
    if after is not None and not _AFTER.fullmatch(after):
        raise StokerError(
            f"--after {after!r} is not a SLURM job id",
            fix="give a job id such as 1234 or 1234_5, several joined with ':'",
        )


def time_limit_seconds(text: str) -> int | None:
    """sbatch's --time forms in seconds; None for UNLIMITED."""
    if text == "UNLIMITED":
        return None
    days = 0
    if "-" in text:  # D-H, D-H:M, D-H:M:S
        day_text, text = text.split("-", 1)
        days = int(day_text)
        hours, minutes, seconds = [*map(int, text.split(":")), 0, 0][:3]
    else:
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 1:  # a bare number is minutes
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def check_stop_grace(resolved: ResolvedConfig) -> None:
    """The stop signal comes job.stop_grace seconds before the limit: it must fit in it."""
    job = resolved.config.job
    limit = time_limit_seconds(job.time)
    if limit is not None and job.stop_grace >= limit:
        raise StokerError(
            f"job.stop_grace={job.stop_grace} s ({resolved.source_of(('job', 'stop_grace'))}) "
            f"is not shorter than job.time={job.time} ({resolved.source_of(('job', 'time'))}): "
            "the job would be told to save and stop as soon as it starts",
            fix=f"set job.stop_grace below {limit} s (a step plus a checkpoint), "
            f"e.g. job.stop_grace={max(10, limit // 3)}, or give the job more time",
        )


def check_command(command: Sequence[str]) -> None:
    """Each argument goes into the script and the `stoker.command` tag as UTF-8 text."""
    for arg in command:
        try:
            str(arg).encode("utf-8")
        except UnicodeEncodeError:
            raise StokerError(
                f"the command argument {str(arg)!r} is not UTF-8 text",
                fix="pass it in UTF-8 (or through a file the command reads)",
            ) from None


def check_pass_env(resolved: ResolvedConfig) -> None:
    """Every job.pass_env variable is set here: sbatch (and the local backend) hands the
    job this environment, so a missing one would fail the job only once it starts."""
    names = resolved.config.job.pass_env
    missing = [name for name in names if name not in os.environ]
    if missing:
        source = resolved.source_of(("job", "pass_env"))
        verb = "is" if len(missing) == 1 else "are"
        raise StokerError(
            f"job.pass_env ({source}) names {', '.join(missing)}, which {verb} not set in "
            "this environment",
            fix=f"export {missing[0]}=... in this shell before submitting (the job gets it "
            "by name; its value is written nowhere), or remove it from job.pass_env",
        )


def check_no_tracking(resolved: ResolvedConfig) -> None:
    """tracking.uri none (no MLflow) leaves nothing to register train.register_final in."""
    from stoker.tracking.store import tracking_off

    cfg = resolved.config
    if tracking_off(cfg.tracking.uri) and cfg.train.register_final:
        raise StokerError(
            f"train.register_final={cfg.train.register_final!r} "
            f"({resolved.source_of(('train', 'register_final'))}) needs MLflow's model "
            f"registry, but tracking.uri is none ({resolved.source_of(('tracking', 'uri'))})",
            fix="set train.register_final=null (register later with `stoker ckpt export "
            "CKPT OUT --register NAME --tracking-uri URI`), or tracking.uri to a store",
        )


def check_eval_data(resolved: ResolvedConfig) -> None:
    """Evaluation needs a held-out set: given (data.eval_url), or made with the
    synthetic training set (data.url null)."""
    cfg = resolved.config
    has_data = cfg.data.url is not None or bool(cfg.data.sources)
    if cfg.train.eval_every and has_data and cfg.data.eval_url is None:
        raise StokerError(
            f"train.eval_every={cfg.train.eval_every} "
            f"({resolved.source_of(('train', 'eval_every'))}) but data.eval_url is null: "
            f"there is no held-out data set to evaluate on",
            fix="set data.eval_url to a held-out data set (packed like data.url), "
            "or train.eval_every=0",
        )


def check_buckets(resolved: ResolvedConfig) -> None:
    """data.buckets: each bucket's batch size (given, or from data.batch_tokens) splits
    over the job's ranks and train.grad_accum, as the loader on every rank will need."""
    from stoker.data.sets.buckets import resolve_buckets

    cfg = resolved.config
    ranks = cfg.job.nodes * cfg.job.tasks_per_node // cfg.train.context_parallel
    over = f"{ranks} ranks" if cfg.train.context_parallel == 1 else f"{ranks} CP groups"
    accum = cfg.train.grad_accum
    for i, bucket in enumerate(resolve_buckets(cfg.data)):
        if bucket.batch_size % (ranks * accum):
            given = cfg.data.buckets[i].batch_size is not None
            how = "its batch_size" if given else "its batch size from data.batch_tokens"
            raise StokerError(
                f"data.buckets[{i}] ({bucket.name}, {resolved.source_of(('data', 'buckets'))}): "
                f"{how} {bucket.batch_size} does not split over {over} x "
                f"train.grad_accum={accum}",
                fix=f"use a batch size that is a multiple of {ranks * accum}"
                + ("" if given else f" (data.batch_multiple={ranks * accum})"),
            )


def check_context_parallel(resolved: ResolvedConfig) -> None:
    """train.context_parallel: its groups of consecutive ranks fit the job's ranks and
    nodes (stoker/mesh_layout.py); the model's heads and each bucket's tokens are checked
    by the model check (stoker/runtime/preflight.py)."""
    from stoker.mesh_layout import mesh_shape

    cfg = resolved.config
    if cfg.train.context_parallel == 1:
        return
    job = cfg.job
    try:
        mesh_shape(
            job.nodes * job.tasks_per_node,
            job.tasks_per_node,
            job.nodes,
            cfg.train.sharding,
            cfg.train.context_parallel,
        )
    except StokerError as exc:
        where = resolved.source_of(("train", "context_parallel"))
        raise StokerError(f"{exc.message} ({where})", fix=exc.fix) from exc


def check_partition_fits(resolved: ResolvedConfig) -> None:
    """job.nodes (and job.spare_nodes) fit in the partition, and a node's tasks in a node's
    CPUs, as one `sinfo` tells: SLURM's own refusal ("Requested node configuration is not
    available") names none of them. When sinfo cannot say, sbatch decides."""
    from stoker.launcher.slurm.partition_facts import partition_facts

    job = resolved.config.job
    wanted = job.nodes + job.spare_nodes
    try:
        facts = partition_facts(job.partition)
    except StokerError:
        return
    partition = facts.name + ("" if job.partition else " (the cluster's default)")
    cpus = job.tasks_per_node * job.cpus_per_task
    if facts.node_cpus is not None and cpus > facts.node_cpus:
        raise StokerError(
            f"{_tasks_per_node_said(resolved)} x job.cpus_per_task={job.cpus_per_task} = {cpus} "
            f"CPUs a node, but partition {partition}'s nodes have {facts.node_cpus}; nothing was "
            "submitted",
            fix=f"at most {facts.node_cpus} CPUs a node (--ntasks-per-node, job.cpus_per_task), "
            "or a partition with larger nodes (`sinfo -s` lists them; --partition P)",
        )
    if wanted <= facts.nodes:
        return
    asked = f"job.nodes={job.nodes} ({resolved.source_of(('job', 'nodes'))})"
    if job.spare_nodes:
        asked += (
            f" + job.spare_nodes={job.spare_nodes} "
            f"({resolved.source_of(('job', 'spare_nodes'))}) = {wanted} nodes"
        )
    fewer = facts.nodes - job.spare_nodes
    smaller = f"--nodes {fewer} or fewer" if fewer >= 1 else "fewer job.spare_nodes"
    if job.spare_nodes:
        smaller += f" (job.nodes + job.spare_nodes at most {facts.nodes})"
    raise StokerError(
        f"{asked}, but partition {partition} has {facts.nodes} nodes; nothing was submitted",
        fix=f"{smaller}, or a partition with more nodes (`sinfo -s` lists them; --partition P)",
    )


def _tasks_per_node_said(resolved: ResolvedConfig) -> str:
    """The tasks a node runs, with where that came from."""
    job = resolved.config.job
    if job.ntasks_per_node is not None:
        where = resolved.source_of(("job", "ntasks_per_node"))
        return f"job.ntasks_per_node={job.ntasks_per_node} ({where})"
    where = resolved.source_of(("job", "gpus_per_node"))
    return f"{job.tasks_per_node} tasks a node (one per GPU: job.gpus_per_node, {where})"


def check_same_job(configs: Sequence[ResolvedConfig]) -> None:
    """The tasks of a job array share one allocation: their job.* keys must agree."""
    for cfg in configs[1:]:
        if cfg.config.job != configs[0].config.job:
            raise StokerError(
                "a sweep may not vary job.* keys: all tasks of a job array share one allocation",
                fix="sweep over model, data, optim or train keys; submit job variants separately",
            )
