"""Part b: `stoker plan` against the measurement. The step of part c (the 1b av_dit,
batch 8 of 2 s 256x256 clips, one rank as the runtime runs one process: no FSDP) is
planned for this GPU with 80 GiB of memory (an H100's: what the plan would choose
there), then the chosen candidate is trained for real here: planned against measured
peak memory (`max_memory_allocated`) and step time, and the allowances the plan
assumes (CUDA context, allocator reserve) against what the driver and the caching
allocator show.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check.result import PartResult
from stoker.config import resolve_config
from stoker.gpus import gpu_spec
from stoker.planning import search
from stoker.planning.plan import make_plan
from stoker.planning.search import GIB, Candidate, Target
from stoker.planning.trace import random_batch, train_step
from stoker.runtime.dist.parallelize import apply_activation_checkpointing
from stoker.runtime.models import build_model
from stoker.runtime.optim import build_optimizer

PLANNED_MEMORY_GIB = 80.0
TARGET_MEMORY_ERROR = 0.10
STEPS = 6


def overrides(dry_run: bool) -> list[str]:
    if dry_run:
        return [
            "model.size=tiny",
            "data.batch_size=2",
            "data.resolution=[64,64]",
            "data.clip_seconds=1.0",
            "train.precision=fp32",
        ]
    return [
        "model.size=1b",
        "data.batch_size=8",
        "data.resolution=[256,256]",
        "data.clip_seconds=2.0",
        "train.precision=bf16",
    ]


def measure(cfg: Any, c: Candidate, device: torch.device, steps: int) -> dict[str, Any]:
    """The candidate's real steps: peaks of the allocator, the driver's view, times."""
    torch.manual_seed(0)
    cuda = device.type == "cuda"
    model = build_model(cfg.model, cfg.data).to(device)
    apply_activation_checkpointing(model, c.activation_checkpointing)
    optimizer = build_optimizer(model, cfg.optim, device)
    params = [p for p in model.parameters() if p.requires_grad]
    micro = [random_batch(cfg, c.micro_batches[0], device) for _ in range(c.grad_accum)]
    times, allocated, reserved, driver_used = [], 0, 0, 0
    for step in range(steps):
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        began = time.perf_counter()
        train_step(model, optimizer, micro, params, cfg.optim.grad_clip, c.precision == "bf16")
        if cuda:
            torch.cuda.synchronize(device)
            allocated = max(allocated, torch.cuda.max_memory_allocated(device))
            reserved = max(reserved, torch.cuda.max_memory_reserved(device))
            free, total = torch.cuda.mem_get_info(device)
            driver_used = max(driver_used, total - free)
        if step:  # the first step allocates and compiles
            times.append(time.perf_counter() - began)
    out: dict[str, Any] = {"step_s": statistics.median(times), "allocated_peak": allocated}
    if cuda:
        # What the driver shows in use beyond the allocator's reserve: the CUDA context,
        # cuBLAS workspaces and Triton's modules.
        out.update(
            reserved_peak=reserved,
            driver_used=driver_used,
            outside_allocator=driver_used - torch.cuda.memory_reserved(device),
        )
    del model, optimizer, micro
    return out


def main(out_dir: Path, *, dry_run: bool) -> None:
    result = PartResult(out_dir, "plan", dry_run=dry_run)
    device = torch.device("cpu" if dry_run else "cuda")
    cfg = resolve_config(None, overrides(dry_run), use_profile=False).config
    if dry_run:
        target = Target(1, 1, None, 64 * GIB, "cpu (dry run)")
    else:
        name = torch.cuda.get_device_name(device)
        spec = gpu_spec(name)
        if spec is None:
            raise SystemExit(f"{name} is not in stoker/gpus.py's table: add it")
        memory = min(PLANNED_MEMORY_GIB, torch.cuda.mem_get_info(device)[1] / GIB)
        target = Target(
            1, 1, spec.with_memory(memory), int(memory * GIB), f"{name} as {memory:.0f} GiB"
        )
    began = time.perf_counter()
    plan = make_plan(cfg, target)
    plan_s = time.perf_counter() - began
    chosen = plan.chosen
    if chosen is None:
        raise SystemExit(f"the plan chose nothing for {target.source}: {plan.to_json()}")
    print(
        f"planned in {plan_s:.1f} s: {chosen.describe()}, peak {chosen.peak[0] / GIB:.2f} GiB, "
        f"step {chosen.mean_step_s:.3f} s",
        flush=True,
    )
    result.set(
        overrides=overrides(dry_run),
        plan_seconds=round(plan_s, 1),
        chosen=chosen.describe(),
        plan=plan.to_json(),
    )
    got = measure(cfg, chosen, device, 2 if dry_run else STEPS)
    planned_peak = chosen.peak[0]
    assert planned_peak is not None
    memory_error = (
        (planned_peak - got["allocated_peak"]) / got["allocated_peak"]
        if got["allocated_peak"]
        else None
    )
    step_error = (chosen.mean_step_s - got["step_s"]) / got["step_s"]
    row: dict[str, Any] = {
        "candidate": chosen.describe(),
        "planned_peak_bytes": planned_peak,
        "planned_step_s": round(chosen.mean_step_s, 4),
        **got,
        "memory_error": memory_error,
        "step_time_error": round(step_error, 3),
    }
    if device.type == "cuda":
        assumed_reserve = search.ALLOCATOR_SLACK * got["allocated_peak"]
        row["allowances"] = {
            "cuda_context_assumed": search.CUDA_CONTEXT_BYTES,
            "cuda_context_measured": got["outside_allocator"],
            "allocator_reserve_assumed": int(assumed_reserve),
            "allocator_reserve_measured": got["reserved_peak"] - got["allocated_peak"],
        }
        need = search.need_bytes(planned_peak, target, chosen.replicate)
        row["plan_need_bytes"] = need
        row["measured_need_bytes"] = got["driver_used"]
    result.add_row(row)
    print(row, flush=True)
    summary = {
        "chosen": chosen.describe(),
        "step s planned/measured": f"{chosen.mean_step_s:.3f}/{got['step_s']:.3f}",
    }
    if memory_error is not None:
        summary["peak GiB planned/measured"] = (
            f"{planned_peak / GIB:.2f}/{got['allocated_peak'] / GIB:.2f}"
        )
        result.check(
            "plan peak within 10%",
            f"|planned - measured| / measured <= {TARGET_MEMORY_ERROR:.0%}",
            f"{memory_error:+.1%}",
            abs(memory_error) <= TARGET_MEMORY_ERROR,
        )
    result.set(summary=summary)
    result.finish()
