"""`stoker plan`'s estimates against one device's real steps (issue 23 on a GPU).

    python benchmarks/plan_measured.py [--device cuda] [--size 1b] [--resolution 256 256]
                                       [--clip-seconds 2] [--batch 8] [--steps 6] [--out DIR]

One rank, no FSDP (as the runtime runs one process). For every candidate of the plan
(activation checkpointing none / selective / full x each gradient accumulation of
`--batch`, in bf16 on a GPU, fp32 on a CPU), the plan's traced peak and step time, then
the same candidate trained for real on the device: `--steps` steps (the first left
out), the peak from `torch.cuda.max_memory_allocated` on a GPU (PyTorch's memory
tracker on a CPU, one step), the median step time. Printed and written as JSON with
the machine: each candidate's memory error, and whether the plan's choice (the fastest
that fits) is within 10% of the fastest candidate measured. A candidate that runs out
of memory on the device is recorded as such.

On a CPU the times are a GPU roofline's against a CPU's: only the memory compares.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import torch

from benchmarks.machine import machine_info
from stoker.config import resolve_config
from stoker.gpus import gpu_spec
from stoker.planning.plan import make_plan
from stoker.planning.search import GIB, Candidate, Target
from stoker.planning.trace import random_batch, train_step
from stoker.runtime.dist.parallelize import apply_activation_checkpointing
from stoker.runtime.models import build_model
from stoker.runtime.observe.step_memory import tracked
from stoker.runtime.optim import build_optimizer


def measure(cfg: Any, c: Candidate, device: torch.device, steps: int) -> dict[str, Any]:
    """One candidate trained for real on `device`: its peak and median step time."""
    from stoker.kernels import use_backend

    torch.manual_seed(0)
    with use_backend("auto"):
        model = build_model(cfg.model, cfg.data).to(device)
        apply_activation_checkpointing(model, c.activation_checkpointing)
        optimizer = build_optimizer(model, cfg.optim, device)
        params = [p for p in model.parameters() if p.requires_grad]
        micro = [random_batch(cfg, c.micro_batches[0], device) for _ in range(c.grad_accum)]
        bf16 = c.precision == "bf16"
        times, peak = [], 0
        try:
            for step in range(steps):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                began = time.perf_counter()
                if device.type == "cpu" and step == 1:
                    with tracked(model, optimizer, micro[:2]) as snapshot:
                        train_step(model, optimizer, micro[:2], params, cfg.optim.grad_clip, bf16)
                    peak = int(snapshot()["Total"])
                    continue
                train_step(model, optimizer, micro, params, cfg.optim.grad_clip, bf16)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                    peak = max(peak, torch.cuda.max_memory_allocated(device))
                if step:
                    times.append(time.perf_counter() - began)
        except torch.OutOfMemoryError:
            return {"out_of_memory": True}
        finally:
            del model, optimizer
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return {"out_of_memory": False, "peak_bytes": peak,
            "step_s": statistics.median(times) if times else None}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default="1b")
    parser.add_argument("--resolution", type=int, nargs=2, default=[256, 256])
    parser.add_argument("--clip-seconds", type=float, default=2.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    overrides = [f"model.size={args.size}", f"data.batch_size={args.batch}",
                 f"data.resolution=[{args.resolution[0]},{args.resolution[1]}]",
                 f"data.clip_seconds={args.clip_seconds}",
                 f"train.precision={'bf16' if gpu else 'fp32'}"]  # fmt: skip
    cfg = resolve_config(None, overrides, use_profile=False).config
    if gpu:
        name = torch.cuda.get_device_name(device)
        spec = gpu_spec(name)
        if spec is None:
            sys.exit(f"{name} is not in stoker/gpus.py's table")
        total = torch.cuda.mem_get_info(device)[1]
        target = Target(1, 1, spec.with_memory(total / GIB), total, name)
    else:
        target = Target(1, 1, None, 64 * GIB, "cpu")
    plan = make_plan(cfg, target, trace_all=True)
    rows = []
    for c in plan.candidates:
        got = measure(cfg, c, device, args.steps)
        planned = c.peak[0]
        error = (planned - got["peak_bytes"]) / got["peak_bytes"] if got.get("peak_bytes") else None
        rows.append({"candidate": c.describe(), "status": c.status,
                     "planned_bytes": planned, "planned_step_s": c.mean_step_s, **got,
                     "memory_error": error})  # fmt: skip
        shown = "out of memory" if got["out_of_memory"] else (
            f"peak {got['peak_bytes'] / GIB:.2f} GiB (plan {planned / GIB:.2f}, "
            f"{100 * (error or 0):+.1f}%), step {got['step_s'] or 0:.3f} s "
            f"(plan {c.mean_step_s:.3f})")  # fmt: skip
        print(f"{c.describe()} [{c.status}]: {shown}", flush=True)
    ran = [r for r in rows if not r["out_of_memory"] and r["step_s"]]
    chosen = next((r for r in rows if r["status"] == "chosen"), None)
    fastest = min(ran, key=lambda r: r["step_s"]) if ran else None
    within = None
    if gpu and chosen and fastest and chosen.get("step_s"):
        within = chosen["step_s"] <= 1.10 * fastest["step_s"]
        print(f"chosen {chosen['candidate']}: {chosen['step_s']:.3f} s; fastest measured "
              f"{fastest['candidate']}: {fastest['step_s']:.3f} s -> "
              f"{'within' if within else 'NOT within'} 10%")  # fmt: skip
    errors = [abs(r["memory_error"]) for r in rows if r["memory_error"] is not None]
    if errors:
        print(f"memory error: max {100 * max(errors):.1f}% over {len(errors)} candidates")
    document = {
        "benchmark": "plan_measured",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "device": target.source,
        "overrides": overrides,
        "candidates": rows,
        "max_memory_error": max(errors) if errors else None,
        "chosen_within_10pct_of_fastest": within,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    slug = "cpu" if not gpu else target.source.lower().replace(" ", "-")
    path = args.out / f"plan-measured-{slug}-{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
