"""What `stoker plan` and `stoker submit` need to know of a partition, from one `sinfo`
call: its nodes, the GPUs per node and their type (the GRES `gpu:h100:8`), the memory
and the CPUs of a node. The GPU's own figures come from stoker/gpus.py's table by that
type."""

from __future__ import annotations

import re
from dataclasses import dataclass

from stoker.errors import StokerError
from stoker.launcher.slurm.cli import SlurmError, run_slurm

SINFO_FORMAT = "%P|%D|%G|%m|%c"
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::(?P<type>[^:,(]+))?:(?P<count>\d+)")


@dataclass(frozen=True)
class PartitionFacts:
    name: str
    nodes: int
    gpus_per_node: int
    gpu_type: str | None
    """The GRES type (`h100`), None when the GRES names none (`gpu:8`)."""
    node_memory_mb: int | None
    node_cpus: int | None = None
    """The CPUs of its largest node: more CPUs a node than that, no node can hold the job
    (where nodes differ, SLURM may place it on the larger ones); None when sinfo did not
    say."""


def parse_gpu_gres(gres: str) -> tuple[str | None, int]:
    """("h100", 8) from "gpu:h100:8(S:0-1)"; (None, 4) from "gpu:4"; (None, 0) without."""
    match = _GPU_GRES.search(gres)
    if match is None:
        return None, 0
    return match.group("type"), int(match.group("count"))


def parse_partition(text: str, name: str | None) -> PartitionFacts | None:
    """The partition `name` (None: the default one, marked `*`) from
    `sinfo --noheader --format=SINFO_FORMAT`; None when it is not there."""
    nodes = 0
    found: str | None = None
    gpus: list[tuple[str | None, int]] = []
    memory: list[int] = []
    cpus: list[int] = []
    for line in text.splitlines():
        if line.count("|") != 4:
            continue
        raw, count, gres, mem, cpu = line.split("|")
        part = raw.rstrip("*")
        if (name is None and not raw.endswith("*")) or (name is not None and part != name):
            continue
        found = part
        nodes += int(count) if count.isdigit() else 0
        gpus.append(parse_gpu_gres(gres))
        if mem.rstrip("+").isdigit():
            memory.append(int(mem.rstrip("+")))
        if cpu.rstrip("+").isdigit():
            cpus.append(int(cpu.rstrip("+")))
    if found is None:
        return None
    # Mixed node types in one partition: plan for the smallest (it must fit on any).
    gpu_type, per_node = min(gpus, key=lambda g: g[1]) if gpus else (None, 0)
    return PartitionFacts(found, nodes, per_node, gpu_type, min(memory) if memory else None,
                          max(cpus) if cpus else None)  # fmt: skip


def partition_facts(name: str | None) -> PartitionFacts:
    """Ask sinfo; a StokerError naming the partition and the fix when it cannot say."""
    argv = ["sinfo", "--noheader", f"--format={SINFO_FORMAT}"]
    if name is not None:
        argv.append(f"--partition={name}")
    try:
        text = run_slurm(argv, timeout=30)
    except SlurmError as exc:
        raise StokerError(
            f"could not ask SLURM about partition {name or '(the default)'}: "
            f"{exc.message.splitlines()[0]}",
            fix="give the target instead: --gpus-per-node G --gpu H100 [--nodes N]",
        ) from exc
    facts = parse_partition(text, name)
    if facts is None:
        raise StokerError(
            f"sinfo knows no partition {name!r}" if name else "SLURM has no default partition",
            fix="`sinfo -s` lists the partitions; or give --gpus-per-node G --gpu H100",
        )
    return facts
