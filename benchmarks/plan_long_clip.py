"""What `stoker plan` chooses where activations, not weights, fill a GPU: the long-clip
example (examples/long_clip.yaml, the 1b av_dit on 5 s of 720p latents) on one node of
8 x H100 80GB, and Wan 2.2 A14B's dimensions (examples/wan_a14b: 40 blocks of width
5120, 40 heads, 75,600 tokens a clip) on 2 nodes of 8.

    python benchmarks/plan_long_clip.py [--only long-clip|wan-a14b] [--out DIR]

Runs `stoker plan EXPERIMENT --gpu H100 --json` from the experiment's folder (its model
module found there). The target (issue [5/8]): each plan takes a context-parallel
layout and gives every candidate it did not take its reason. The baseline, measured in
the same plan: the fastest candidate without CP that fits, its step time over the
chosen one's (none fits: the clip needs CP). The Wan-sized plan traces a 40-block model
on fake tensors dozens of times: about 15 CPU-minutes here, which is why the suite
plans only the long-clip example (tests/plan/test_plan_cp.py runs this with --only).
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.machine import machine_info

REPO = Path(__file__).resolve().parent.parent
STOKER = str(Path(sys.executable).with_name("stoker"))
CASES = {
    "long-clip": REPO / "examples" / "long_clip.yaml",
    "wan-a14b": REPO / "examples" / "wan_a14b" / "experiment.yaml",
}
GPU = "H100"


def plan(experiment: Path) -> tuple[dict[str, Any], float, float]:
    """`stoker plan --json` of `experiment`, its wall seconds and CPU seconds."""
    folder = experiment.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(REPO)])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    result = subprocess.run(
        [STOKER, "plan", experiment.name, "--gpu", GPU, "--gpus-per-node", "8", "--json"],
        capture_output=True, text=True, cwd=folder, env=env, check=False, timeout=7200,
    )  # fmt: skip
    took = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        sys.exit(f"stoker plan {experiment} failed:\n{result.stderr[-4000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return json.loads(result.stdout), took, cpu


def judge(name: str, document: dict[str, Any], wall_s: float, cpu_s: float) -> dict[str, Any]:
    chosen = document["chosen"]
    candidates = document["candidates"]
    others = [c for c in candidates if c["status"] != "chosen"]
    without = [c for c in others if c["context_parallel"] == 1 and c["status"] == "fits"]
    baseline = min(without, key=lambda c: c["step_s"]) if without else None
    takes_cp = chosen is not None and chosen["context_parallel"] > 1
    reasons = all(c["reason"] for c in others)
    ratio = baseline["step_s"] / chosen["step_s"] if baseline and chosen else None
    what = "none" if chosen is None else _describe(chosen)
    print(f"{name}: {document['target']['world']} x {GPU}, {len(candidates)} candidates, "
          f"{document['traces']} traces, {wall_s:.0f} s ({cpu_s:.0f} CPU-s)")  # fmt: skip
    print(f"  chosen: {what}: {chosen['reason'] if chosen else '-'}")
    if baseline is not None:
        print(f"  without CP (baseline): {_describe(baseline)}: {ratio:.2f}x the chosen step time")
    else:
        print("  without CP (baseline): no candidate fits")
    print(f"  every other candidate has its reason: {reasons}")
    return {
        "experiment": str(CASES[name].relative_to(REPO)),
        "target": document["target"],
        "candidates": len(candidates),
        "traces": document["traces"],
        "seconds": round(wall_s, 1),
        "cpu_seconds": round(cpu_s, 1),
        "chosen": chosen and _layout(chosen),
        "settings": document["settings"],
        "baseline_without_cp": baseline and _layout(baseline),
        "ratios": {"without_cp_over_chosen_step_s": ratio and round(ratio, 3)},
        "statuses": {s: sum(c["status"] == s for c in candidates) for s in _statuses(candidates)},
        "target_met": takes_cp and reasons,
        "every_candidate": [_row(c) for c in candidates],
    }


def _row(c: dict[str, Any]) -> dict[str, Any]:
    micro = [b["micro_batch"] for b in c["buckets"]]
    return {"what": _describe(c), "micro_batch": micro, "status": c["status"],
            "reason": c["reason"], "step_s": c["step_s"]}  # fmt: skip


def _layout(c: dict[str, Any]) -> dict[str, Any]:
    keys = ("layout", "shard", "replicate", "activation_checkpointing", "precision", "grad_accum",
            "context_parallel", "context_parallel_ulysses", "step_s", "reason")  # fmt: skip
    return {k: c[k] for k in keys} | {"peak_bytes": [b["peak_bytes"] for b in c["buckets"]]}


def _describe(c: dict[str, Any]) -> str:
    cp, ulysses = c["context_parallel"], c["context_parallel_ulysses"]
    parts = [f"Ulysses {ulysses}"] if ulysses > 1 else []
    parts += [f"ring {cp // ulysses}"] if cp // ulysses > 1 else []
    where = f"CP {cp} ({' x '.join(parts)})" if cp > 1 else "no CP"
    mode, precision, accum = c["activation_checkpointing"], c["precision"], c["grad_accum"]
    return (f"{c['layout'].upper()} {c['shard']}x{c['replicate']}, {where}, "
            f"AC {mode}, {precision}, accumulation {accum}")  # fmt: skip


def _statuses(candidates: list[dict[str, Any]]) -> list[str]:
    return sorted({c["status"] for c in candidates})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(CASES), default=None)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    results = {}
    for name, experiment in CASES.items():
        if args.only not in (None, name):
            continue
        results[name] = judge(name, *plan(experiment))
    met = all(r["target_met"] for r in results.values())
    print("target met" if met else "target missed")
    document = {
        "benchmark": "plan_long_clip",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(),
        "gpu": GPU,
        "cases": results,
        "target": "a context-parallel layout chosen, every other candidate with its reason",
        "target_met": met,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = f"-{args.only}" if args.only else ""
    path = args.out / f"plan_long_clip{suffix}-{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
