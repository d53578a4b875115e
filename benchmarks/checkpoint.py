"""What a checkpoint save costs: how long an async save holds the training loop
against a sync save and plain `torch.save` of the same state, and how close the
save's write comes to the disk's sequential write speed, measured in the same run.

    python benchmarks/checkpoint.py [--size-gb 1.0] [--repeats 5] [--dir DIR]
        [--writer-threads 1,4] [--device auto|cpu|cuda] [--torch-threads N]
        [--nproc N] [--out DIR]

About 70 s at the defaults on a 2-core VM (1 GB state, 5 repeats).

--dir must be on the disk you care about (the file system the job checkpoints
to): the saves go to a temporary folder made under it, removed at the end. The
default is this checkout, so its disk.

The state: a stack of nn.Linear + nn.LayerNorm sized so that the fp32 weights and
AdamW's two moments come to --size-gb (decimal GB), with stoker's AdamW and LR
schedule (stoker.runtime.optim), after one optimizer step so the moments exist;
on the GPU when there is one. Each repeat runs every method once, in an order
that rotates from repeat to repeat; what a method wrote is deleted (and
os.sync() run) before the next starts, so that each writes in the same state
(on a VM, writes into a page cache that has to grow were several times slower):

  async       Checkpointer(async_save=True).save(): the blocking seconds it
              returns (state dict and staging copy; to pinned memory on a GPU),
              then wait(): the background seconds to the commit (DCP write, sha256
              of the shards, COMMIT.json, verify). One Checkpointer for all
              repeats, as in training; its first save allocates the staging
              buffers, so it is a warm-up, its blocking time reported apart.
  sync        Checkpointer(async_save=False).save(): the whole committed save.
  dcp xT      torch.distributed.checkpoint.save with stoker's storage writer
              (FileSystemWriter, sync_files=True, hashing as it writes; T =
              thread_count, stoker's is WRITER_THREADS = 4),
              nothing else: the write alone. After the 1-thread write, the sha256
              of its shards is timed apart: what the commit adds to the write.
  torch.save  the model, optimizer and schedule state dicts to one file, flushed
              and fsync'd.
  disk        as many bytes as the checkpoint, one random 64 MiB block written
              over and over (a counter makes each 4 KiB page new data), fsync'd
              at the end: dd bs=64M conv=fsync.

Every write is fsync'd, so no figure is a page-cache figure. Targets (issue):
async blocking / sync save < 0.10; save throughput / disk speed >= 0.80, both
for the DCP write alone and for the committed sync save. Ratios are taken per
repeat, from measurements made one after the other (the disk's drift hits both),
and the median over repeats is reported; also, as "best", the ratios of the
fastest repeats (on a machine shared with other work, the least disturbed).

With --nproc N the benchmark re-launches itself under torch.distributed.run
(gloo, one machine): every rank holds the whole state, DCP spreads the replicated
tensors over the ranks' files, a time is the slowest rank's, torch.save runs on
rank 0 only and the disk figure is N writers writing 1/N each at once.

Writes DIR/checkpoint-<host>[-<gpu>]-<date>.json (default benchmarks/results):
the machine and the file system of --dir, every raw timing, the medians, the
throughputs, the ratios and the targets met. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.machine import machine_info
from stoker.checkpoint import commit as ck
from stoker.checkpoint.checkpointer import Checkpointer
from stoker.checkpoint.storage import WRITER_THREADS, storage_writer
from stoker.checkpoint.train_state import TrainState, state_to_save

REPO = Path(__file__).resolve().parent.parent
BLOCKING_TARGET = 0.10
THROUGHPUT_TARGET = 0.80
BLOCK = 64 << 20  # the disk figure's write size, as dd bs=64M
PAGE = 4096
GB = 1e9
BYTES_PER_PARAM = 12  # fp32 weight + AdamW's exp_avg and exp_avg_sq


class Ranks:
    """This process among the benchmark's processes: one, or the ranks that
    torch.distributed.run started (--nproc)."""

    def __init__(self) -> None:
        self.distributed = "TORCHELASTIC_RUN_ID" in os.environ
        self.rank = int(os.environ["RANK"]) if self.distributed else 0
        self.world_size = int(os.environ["WORLD_SIZE"]) if self.distributed else 1
        self.is_coordinator = self.rank == 0
        if self.distributed:
            torch.distributed.init_process_group("gloo")

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def gather(self, value: Any) -> list[Any]:
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(out, value)
        return out

    def slowest(self, seconds: float) -> float:
        return float(max(self.gather(seconds)))

    def from_coordinator(self, value: Any) -> Any:
        box = [value]
        if self.distributed:
            torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.distributed:
            torch.distributed.destroy_process_group()


@dataclass
class Training:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    layers: int
    dim: int
    params: int
    state_bytes: int
    """Bytes of every tensor of the model and optimizer state dicts."""


def build_training(size_gb: float, device: torch.device) -> Training:
    """A model whose weights and AdamW moments come to about size_gb, one step in."""
    from stoker.config import OptimConfig
    from stoker.runtime.optim import build_optimizer, build_scheduler

    params = size_gb * GB / BYTES_PER_PARAM
    # 2048-wide layers (50 MB of state each); narrower when the state is tiny.
    dim = max(64, min(2048, int(math.sqrt(params / 4)) // 64 * 64))
    layers = max(1, round(params / (dim * dim + 3 * dim)))
    torch.manual_seed(0)  # the same weights on every rank
    with device:
        model = nn.Sequential(
            *(m for _ in range(layers) for m in (nn.Linear(dim, dim), nn.LayerNorm(dim)))
        )
    cfg = OptimConfig()
    optimizer = build_optimizer(model, cfg, device)
    scheduler = build_scheduler(optimizer, cfg, total_steps=1000)
    model(torch.randn(8, dim, device=device)).square().mean().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    tensors = list(model.state_dict().values()) + [
        t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
    ]
    return Training(
        model,
        optimizer,
        scheduler,
        layers,
        dim,
        sum(p.numel() for p in model.parameters()),
        sum(t.numel() * t.element_size() for t in tensors),
    )


def write_like_dd(path: Path, nbytes: int, block: np.ndarray) -> float:
    """Seconds to write nbytes from `block` (uint8, a multiple of 4 KiB) over and
    over, fsync included. A counter in the first 8 bytes of each 4 KiB page makes
    every page new data, as a checkpoint's are: a deduplicating store gains nothing."""
    pages = block.view(np.uint64).reshape(-1, PAGE // 8)
    counter = np.arange(len(pages), dtype=np.uint64)
    view = memoryview(block.data)
    began = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            pages[:, 0] = counter
            counter += len(pages)
            left -= f.write(view[: min(left, len(view))]) or 0
        os.fsync(f.fileno())
    return time.perf_counter() - began


def torch_save(path: Path, training: Training) -> float:
    began = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(
            {
                "model": training.model.state_dict(),
                "optim": training.optimizer.state_dict(),
                "scheduler": training.scheduler.state_dict(),
            },
            f,
        )
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - began


def dcp_write(folder: Path, state_dict: dict[str, Any], threads: int, ranks: Ranks) -> float:
    """Seconds of a plain DCP save with stoker's storage writer (thread_count changed)."""
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    writer = storage_writer(str(folder))
    if not isinstance(writer, FileSystemWriter):
        raise SystemExit(f"--dir {folder.parent}: not a local file system; give a local --dir")
    writer.thread_count = threads  # stoker's writer otherwise (hashing as it writes)
    ranks.barrier()
    began = time.perf_counter()
    save(state_dict, storage_writer=writer, no_dist=not ranks.distributed)
    return time.perf_counter() - began


def hash_own_files(folder: Path, rank: int) -> float:
    """Seconds to sha256 the shards this rank wrote, as the checkpointer does after the write."""
    mine = [n for n in ck.file_names(str(folder)) if n.startswith(f"__{rank}_")]
    began = time.perf_counter()
    ck.hash_files(str(folder), mine)
    return time.perf_counter() - began


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def filesystem_of(path: Path) -> dict[str, Any]:
    """The mount that holds `path` (the longest mount point above it in /proc/self/mounts)."""
    real = os.path.realpath(path)
    source, mount, fstype, options = "?", "/", "?", "?"
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                point = fields[1]
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(mount):
                    source, mount, fstype, options = fields[:4]
    except OSError:
        pass
    info: dict[str, Any] = {
        "dir": real,
        "mount": mount,
        "source": source,
        "fstype": fstype,
        "options": options,
    }
    rotational = Path(f"/sys/class/block/{Path(source).name}/queue/rotational")
    if source.startswith("/dev/") and rotational.exists():
        info["rotational"] = rotational.read_text().strip() == "1"
    info["free_gb"] = round(shutil.disk_usage(real).free / GB, 1)
    return info


def describe_machine(device: torch.device, dir_: Path) -> dict[str, Any]:
    info = machine_info()
    info["torch"] = torch.__version__
    info["device"] = device.type
    info["gpu"] = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        info["memory_gb"] = round(kib * 1024 / GB, 1)
    except (OSError, StopIteration, ValueError):
        pass
    info["filesystem"] = filesystem_of(dir_)
    return info


def measure(args: argparse.Namespace, ranks: Ranks, work: Path) -> dict[str, Any]:
    device = resolve_device(args.device)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    training = build_training(args.size_gb, device)
    model, optimizer, scheduler = training.model, training.optimizer, training.scheduler
    if ranks.is_coordinator:
        print(
            f"state: {training.layers} x (Linear + LayerNorm) of width {training.dim}, "
            f"{training.params / 1e6:.0f} M params, {training.state_bytes / GB:.2f} GB "
            f"with AdamW's moments, on {device}; {args.repeats} repeats into {work}",
            flush=True,
        )
    ckpts = {
        name: Checkpointer(
            str(work / name),
            rank=ranks.rank,
            world_size=ranks.world_size,
            async_save=name == "async",
            keep_last=10**6,
        )
        for name in ("async", "sync")
    }
    # Random: a compressing file system gains nothing.
    block = np.frombuffer(bytearray(os.urandom(BLOCK)), dtype=np.uint8)

    def state(step: int) -> dict[str, Any]:
        return state_to_save(TrainState(step, None), model, optimizer, scheduler, rank=ranks.rank)

    def async_save(step: int) -> tuple[float, float]:
        ranks.barrier()
        blocking = ckpts["async"].save(step, TrainState(step, None), model, optimizer, scheduler)
        began = time.perf_counter()
        ckpts["async"].wait()
        return ranks.slowest(blocking), ranks.slowest(time.perf_counter() - began)

    def committed(name: str, step: int) -> Any:
        failures = ckpts[name].failures
        if failures:
            raise SystemExit(f"the {name} save of step {step} failed: {failures[-1][1]}")
        return ckpts[name].records[-1] if ranks.is_coordinator else None

    first_blocking, _ = async_save(0)  # allocates the staging buffers
    warm_up = committed("async", 0)
    disk_bytes: int = ranks.from_coordinator(warm_up.bytes if warm_up else None)

    methods: dict[str, Callable[[int, dict[str, Any]], None]] = {}

    def run_async(step: int, row: dict[str, Any]) -> None:
        blocking, waited = async_save(step)
        record = committed("async", step)
        row["async_blocking_s"], row["async_wait_s"] = blocking, waited
        if record is not None:
            row["async_background_s"], row["async_bytes"] = record.background_s, record.bytes

    def run_sync(step: int, row: dict[str, Any]) -> None:
        ranks.barrier()
        seconds = ckpts["sync"].save(step, TrainState(step, None), model, optimizer, scheduler)
        record = committed("sync", step)
        row["sync_s"] = ranks.slowest(seconds)
        if record is not None:
            row["sync_bytes"] = record.bytes

    def run_dcp(threads: int) -> Callable[[int, dict[str, Any]], None]:
        def run(step: int, row: dict[str, Any]) -> None:
            folder = work / f"dcp-x{threads}-{step}"
            seconds = dcp_write(folder, state(step), threads, ranks)
            row.setdefault("dcp_write_s", {})[str(threads)] = ranks.slowest(seconds)
            if threads == 1:
                # Right after the write, as the checkpointer hashes: from the page cache.
                row["hash_s"] = ranks.slowest(hash_own_files(folder, ranks.rank))
            ranks.barrier()
            if ranks.is_coordinator:
                row.setdefault("dcp_bytes", {})[str(threads)] = folder_bytes(folder)

        return run

    def run_torch_save(step: int, row: dict[str, Any]) -> None:
        ranks.barrier()
        if ranks.is_coordinator:
            path = work / f"torch-save-{step}.pt"
            row["torch_save_s"] = torch_save(path, training)
            row["torch_save_bytes"] = path.stat().st_size
        ranks.barrier()

    def run_disk(step: int, row: dict[str, Any]) -> None:
        # As many bytes as the checkpoint, split over the ranks as DCP splits them.
        nbytes = -(-disk_bytes // ranks.world_size)
        ranks.barrier()
        seconds = write_like_dd(work / f"disk-{step}-rank{ranks.rank}", nbytes, block)
        row["disk_s"] = ranks.slowest(seconds)
        row["disk_bytes"] = nbytes * ranks.world_size

    methods["async"] = run_async
    methods["sync"] = run_sync
    for threads in args.writer_threads:
        methods[f"dcp x{threads}"] = run_dcp(threads)
    methods["torch.save"] = run_torch_save
    methods["disk"] = run_disk

    def clean(step: int) -> None:
        """Delete what a method wrote before the next one runs, so that every method
        writes to the disk and the page cache in the same state. On this project's
        VM 1 GB took 0.6 s right after a delete and 2-4 s after 1-2 GB written
        without one (likely the page cache growing into memory the VM had not
        used yet, which the host must back first)."""
        ranks.barrier()
        if ranks.is_coordinator:
            for path in work.iterdir():
                if path.is_dir() and path.name not in ckpts:
                    shutil.rmtree(path)
                elif path.is_file():
                    path.unlink()
            for c in ckpts.values():
                if ck.exists(c.url_for(step)):
                    ck.remove(c.url_for(step))
            os.sync()
        ranks.barrier()

    clean(0)
    rows: list[dict[str, Any]] = []
    names = list(methods)
    for repeat in range(args.repeats):
        step = repeat + 1
        order = names[repeat % len(names) :] + names[: repeat % len(names)]
        row: dict[str, Any] = {"repeat": repeat, "order": order, "load_1m": os.getloadavg()[0]}
        for name in order:
            methods[name](step, row)
            clean(step)
        rows.append(row)
        if ranks.is_coordinator:
            print(f"  repeat {repeat}: {format_row(row)}", flush=True)
    for c in ckpts.values():
        c.close()
    return {
        "device": device,
        "training": training,
        "first_async_blocking_s": first_blocking,
        "rows": rows,
    }


def resolve_device(asked: str) -> torch.device:
    if asked == "auto":
        asked = "cuda" if torch.cuda.is_available() else "cpu"
    if asked == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no GPU here; use --device cpu")
        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def format_row(row: dict[str, Any]) -> str:
    dcp = " ".join(f"x{t} {s:.2f}" for t, s in row["dcp_write_s"].items())
    return (
        f"async blocking {row['async_blocking_s']:.3f} s + wait {row['async_wait_s']:.2f} s, "
        f"sync {row['sync_s']:.2f} s, dcp write {dcp} s, sha256 {row['hash_s']:.2f} s, "
        f"torch.save {row['torch_save_s']:.2f} s, disk {row['disk_s']:.2f} s"
    )


def summarize(rows: list[dict[str, Any]], threads: list[int]) -> dict[str, Any]:
    """Medians of the times, throughputs and per-repeat ratios."""

    def med(values: list[float]) -> float:
        return float(statistics.median(values))

    def gbps(nbytes: int, seconds: float) -> float:
        return nbytes / seconds / GB

    seconds = {
        "async_blocking": med([r["async_blocking_s"] for r in rows]),
        "async_background": med([r["async_background_s"] for r in rows]),
        "async_wait": med([r["async_wait_s"] for r in rows]),
        "sync": med([r["sync_s"] for r in rows]),
        **{f"dcp_write_x{t}": med([r["dcp_write_s"][str(t)] for r in rows]) for t in threads},
        "hash": med([r["hash_s"] for r in rows]),
        "torch_save": med([r["torch_save_s"] for r in rows]),
        "disk": med([r["disk_s"] for r in rows]),
    }
    per_repeat: dict[str, list[float]] = {}
    for r in rows:
        disk = gbps(r["disk_bytes"], r["disk_s"])
        values = {
            "disk": disk,
            "committed_sync": gbps(r["sync_bytes"], r["sync_s"]),
            "committed_async": gbps(
                r["async_bytes"], r["async_blocking_s"] + r["async_background_s"]
            ),
            "torch_save": gbps(r["torch_save_bytes"], r["torch_save_s"]),
            "hash": gbps(r["dcp_bytes"]["1"], r["hash_s"]),
            **{
                f"dcp_write_x{t}": gbps(r["dcp_bytes"][str(t)], r["dcp_write_s"][str(t)])
                for t in threads
            },
        }
        ratios = {
            "async_blocking_vs_sync": r["async_blocking_s"] / r["sync_s"],
            "write_vs_disk": values[f"dcp_write_x{WRITER_THREADS}"] / disk,
            "committed_vs_disk": values["committed_sync"] / disk,
            "async_committed_vs_disk": values["committed_async"] / disk,
            **{f"write_x{t}_vs_disk": values[f"dcp_write_x{t}"] / disk for t in threads},
            "torch_save_vs_disk": values["torch_save"] / disk,
            "hash_share_of_sync": r["hash_s"] / r["sync_s"],
            "sync_vs_torch_save": r["sync_s"] / r["torch_save_s"],
            "async_blocking_vs_torch_save": r["async_blocking_s"] / r["torch_save_s"],
        }
        for key, value in {**{f"gbps.{k}": v for k, v in values.items()}, **ratios}.items():
            per_repeat.setdefault(key, []).append(value)
    throughput = {k[5:]: round(med(v), 3) for k, v in per_repeat.items() if k.startswith("gbps.")}
    # The fastest repeat of each: on a machine shared with other work, the least disturbed.
    best = {k[5:]: max(v) for k, v in per_repeat.items() if k.startswith("gbps.")}
    ratios_of_best = {
        "async_blocking_vs_sync": min(r["async_blocking_s"] for r in rows)
        / min(r["sync_s"] for r in rows),
        "write_vs_disk": best[f"dcp_write_x{WRITER_THREADS}"] / best["disk"],
        "committed_vs_disk": best["committed_sync"] / best["disk"],
        **{f"write_x{t}_vs_disk": best[f"dcp_write_x{t}"] / best["disk"] for t in threads},
    }
    ratios = {k: round(med(v), 3) for k, v in per_repeat.items() if not k.startswith("gbps.")}
    ratios_by_repeat = {
        k: [round(x, 3) for x in v] for k, v in per_repeat.items() if not k.startswith("gbps.")
    }
    targets = {
        "async_blocking_vs_sync": {"target": f"< {BLOCKING_TARGET}"},
        "write_vs_disk": {"target": f">= {THROUGHPUT_TARGET}"},
        "committed_vs_disk": {"target": f">= {THROUGHPUT_TARGET}"},
    }
    for name, entry in targets.items():
        value = ratios[name]
        entry["value"] = value
        entry["met"] = (
            value < BLOCKING_TARGET
            if name == "async_blocking_vs_sync"
            else value >= THROUGHPUT_TARGET
        )
    return {
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        "gbps": throughput,
        "ratios": ratios,
        "ratios_by_repeat": ratios_by_repeat,
        "gbps_best": {k: round(v, 3) for k, v in best.items()},
        "ratios_of_best": {k: round(v, 3) for k, v in ratios_of_best.items()},
        "targets": targets,
    }


def print_summary(result: dict[str, Any]) -> None:
    s, g, r = result["seconds"], result["gbps"], result["ratios"]
    best, of_best = result["gbps_best"], result["ratios_of_best"]
    size = result["bytes"]["checkpoint"] / GB
    print(
        f"\ncheckpoint of {size:.2f} GB, {result['config']['repeats']} repeats "
        "(GB/s = 1e9 bytes/s; median: of the repeats, ratios of the same repeat; "
        "best: of the fastest repeats)"
    )
    print(f"  {'':<38} {'median s':>9} {'GB/s':>7} {'best GB/s':>10}")
    lines = [
        ("async save: blocking", "async_blocking", None),
        ("async save: background to the commit", "async_background", "committed_async"),
        ("sync save (committed)", "sync", "committed_sync"),
        *[
            (f"DCP write alone, thread_count={t}", f"dcp_write_x{t}", f"dcp_write_x{t}")
            for t in result["config"]["writer_threads"]
        ],
        ("sha256 of the shards (page cache)", "hash", "hash"),
        ("torch.save + fsync", "torch_save", "torch_save"),
        ("disk: 64 MiB writes + fsync", "disk", "disk"),
    ]
    for name, time_key, rate_key in lines:
        rates = f"{g[rate_key]:7.3f} {best[rate_key]:10.3f}" if rate_key else ""
        print(f"  {name:<38} {s[time_key]:9.3f} {rates}")
    print(
        "  (async GB/s: over blocking + background; first async save's blocking, which "
        f"allocates the staging buffers: {result['first_async_blocking_s']:.3f} s)"
    )
    print(f"  {'ratio':<38} {'median':>9} {'best':>7} target")
    for name, entry in result["targets"].items():
        mark = "met" if entry["met"] else "MISSED"
        print(f"  {name:<38} {entry['value']:9.3f} {of_best[name]:7.3f} {entry['target']}: {mark}")
    print(
        f"  sync save / torch.save {r['sync_vs_torch_save']:.2f}, async blocking / torch.save "
        f"{r['async_blocking_vs_torch_save']:.3f}, sha256 share of the sync save "
        f"{r['hash_share_of_sync']:.2f}"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").splitlines()[0],
        epilog="See the module docstring of benchmarks/checkpoint.py for what each figure is.",
    )
    parser.add_argument(
        "--size-gb",
        type=float,
        default=1.0,
        help="weights + AdamW moments, decimal GB (default 1.0; keep it well "
        "above the disk's write cache)",
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs of every method (default 5)")
    parser.add_argument(
        "--dir",
        type=Path,
        default=REPO,
        help="folder on the disk to measure; a temporary folder is made in it "
        "and removed (default: this checkout)",
    )
    parser.add_argument(
        "--writer-threads",
        default="1,4",
        help="thread_count values of the plain DCP write, comma-separated; "
        "1 is stoker's writer (default 1,4)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch.set_num_threads for the run (default: torch's own, one per core)",
    )
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="ranks on this machine (torch.distributed.run, gloo; default 1)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "benchmarks" / "results",
        help="where the result JSON goes (default benchmarks/results)",
    )
    args = parser.parse_args(argv)
    try:
        args.writer_threads = sorted({int(t) for t in args.writer_threads.split(",")})
    except ValueError:
        parser.error(f"--writer-threads {args.writer_threads!r}: give integers such as 1,4")
    if {1, WRITER_THREADS} - set(args.writer_threads) or min(args.writer_threads) < 1:
        parser.error(
            f"--writer-threads {args.writer_threads}: include 1 and {WRITER_THREADS} "
            "(stoker's writer)"
        )
    if args.size_gb <= 0 or args.repeats < 1 or args.nproc < 1:
        parser.error("--size-gb, --repeats and --nproc must be positive")
    return args


STATUS_ENV = "STOKER_CHECKPOINT_BENCH_STATUS"
"""Set for the ranks of --nproc: the file where rank 0 leaves the exit status
(a rank's non-zero exit would make torch.distributed.run stop the others)."""


def launch_ranks(args: argparse.Namespace) -> int:
    """Run this benchmark on args.nproc ranks under torch.distributed.run."""
    with tempfile.TemporaryDirectory() as tmp:
        status = Path(tmp) / "status"
        env = {**os.environ, STATUS_ENV: str(status)}
        # torch.distributed.run would set 1 (and say so); share the cores instead.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
        launch = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={args.nproc}", str(Path(__file__).resolve()),
            # Not argv: torch.distributed.run takes --nproc for its own --nproc-per-node.
            "--size-gb", str(args.size_gb), "--repeats", str(args.repeats),
            "--dir", str(args.dir), "--out", str(args.out), "--device", args.device,
            "--writer-threads", ",".join(map(str, args.writer_threads)),
            *(["--torch-threads", str(args.torch_threads)] if args.torch_threads else []),
        ]  # fmt: skip
        code = subprocess.run(launch, env=env, check=False).returncode
        return code if code or not status.exists() else int(status.read_text())


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.nproc > 1 and "TORCHELASTIC_RUN_ID" not in os.environ:
        return launch_ranks(args)
    code = run(args)
    if STATUS_ENV in os.environ:
        if code is not None:
            Path(os.environ[STATUS_ENV]).write_text(str(code))
        return 0
    return code or 0


def run(args: argparse.Namespace) -> int | None:
    """The benchmark on this rank; the exit status on rank 0, None on the others."""
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    ranks = Ranks()
    load_before = os.getloadavg()
    work: Path | None = None
    try:
        if ranks.is_coordinator:
            args.dir.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=".checkpoint-bench-", dir=args.dir))
        work = Path(ranks.from_coordinator(str(work)))
        measured = measure(args, ranks, work)
    finally:
        ranks.barrier()
        if ranks.is_coordinator and work is not None:
            shutil.rmtree(work, ignore_errors=True)
    ranks.close()
    if not ranks.is_coordinator:
        return None

    training: Training = measured["training"]
    device: torch.device = measured["device"]
    rows = measured["rows"]
    summary = summarize(rows, args.writer_threads)
    machine = describe_machine(device, args.dir)
    first = rows[0]
    result: dict[str, Any] = {
        "benchmark": "checkpoint",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "config": {
            "size_gb": args.size_gb,
            "repeats": args.repeats,
            "nproc": ranks.world_size,
            "device": str(device),
            "writer_threads": args.writer_threads,
            "torch_threads": torch.get_num_threads(),
            "disk_block_bytes": BLOCK,
            "model": f"{training.layers} x (Linear({training.dim}, {training.dim}) + "
            f"LayerNorm({training.dim})), stoker AdamW + LR schedule, one step in",
            "layers": training.layers,
            "dim": training.dim,
            "params": training.params,
        },
        "bytes": {
            "state": training.state_bytes,
            "checkpoint": first["async_bytes"],
            "async": first["async_bytes"],
            "sync": first["sync_bytes"],
            "dcp": first["dcp_bytes"],
            "torch_save": first["torch_save_bytes"],
            "disk": first["disk_bytes"],
        },
        "first_async_blocking_s": round(measured["first_async_blocking_s"], 4),
        **summary,
        "meets_targets": {k: v["met"] for k, v in summary["targets"].items()},
        "runs": rows,
    }
    print_summary(result)
    args.out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    name = machine["host"] + (f"-{slug(machine['gpu'])}" if machine["gpu"] else "")
    path = args.out / f"checkpoint-{name}-{now:%Y-%m-%d}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0 if all(result["meets_targets"].values()) else 1


def slug(gpu: str) -> str:
    from stoker.kernels.bench.run import slug_of_name

    return slug_of_name(gpu)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
