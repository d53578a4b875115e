"""The GPU check's driver: the parts in priority order, each in a process of its own
with its deadline, their output in `gpu-check.log`, a table last.

    scripts/gpu-check OUT_DIR [--dry-run] [--parts a,c,...]
    scripts/gpu-check --prepare

OUT_DIR gets one `<part>.json` per part (written as the part goes) and
`gpu-check.log`: eight files, what the device tool brings back from `$OUT`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

from benchmarks.gpu_check import wheels
from benchmarks.gpu_check.environment import ENV_VARIABLE, describe
from benchmarks.gpu_check.gpu_tests import BLOCKED_MODULES as GPU_MACHINE_LACKS
from benchmarks.gpu_check.parts import BUDGET_S, PARTS, Part, part_named

REPO = Path(__file__).resolve().parents[2]
BLOCKER = Path(__file__).resolve().parent / "import_blocker"
BLOCKED_MODULES = GPU_MACHINE_LACKS
"""Absent on the GPU machine; blocked in every part, on the GPU and in the dry run,
so that the check's independence from them is tested where they are installed."""
LOG_NAME = "gpu-check.log"
KILL_GRACE_S = 5.0


def _child_env(site: Path | None, dry_run: bool, home: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(p) for p in (site, BLOCKER, REPO) if p is not None]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["STOKER_BLOCK_IMPORTS"] = ",".join(BLOCKED_MODULES)
    env["PYTHONUNBUFFERED"] = "1"
    env["STOKER_HOME"] = str(home)
    if dry_run:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the dry run is the CPU's, GPU or not
        env["TRITON_INTERPRET"] = "1"
    return env


def _read_environment(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check.environment"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise SystemExit(f"gpu-check: reading the environment failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _pump(stream: IO[str], letter: str, log: IO[str], tail: deque[str]) -> None:
    for line in stream:
        log.write(f"[{letter}] {line}")
        log.flush()
        tail.append(line.rstrip("\n"))
        print(f"[{letter}] {line}", end="", flush=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    """The part and every process it started (its own session)."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_part(
    part: Part, out_dir: Path, env: dict[str, str], deadline_s: float, dry_run: bool, log: IO[str]
) -> dict[str, Any]:
    """Run one part; its result document with status, wall time and deadline."""
    log.write(f"\n===== part {part.letter} ({part.name}): deadline {deadline_s:.0f} s =====\n")
    log.flush()
    command = [sys.executable, "-m", "benchmarks.gpu_check.part_main", part.module, str(out_dir)]
    if dry_run:
        command.append("--dry-run")
    began = time.monotonic()
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a deadline stops the part's own children too
    )
    tail: deque[str] = deque(maxlen=60)
    assert proc.stdout is not None
    pump = threading.Thread(target=_pump, args=(proc.stdout, part.letter, log, tail), daemon=True)
    pump.start()
    timed_out = False
    try:
        proc.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(proc)
    pump.join(timeout=10)
    wall = time.monotonic() - began
    path = out_dir / f"{part.name}.json"
    doc: dict[str, Any] = {"part": part.name, "rows": [], "summary": {}, "checks": []}
    if path.exists():
        doc = json.loads(path.read_text())
    if timed_out:
        doc["status"] = "timeout"
    elif proc.returncode != 0:
        doc["status"] = f"failed (exit {proc.returncode})"
    elif doc.get("status") != "ok":
        doc["status"] = "failed (no result)"
    if doc["status"] != "ok":
        doc["log_tail"] = list(tail)[-40:]
    doc.update(letter=part.letter, wall_s=round(wall, 1), deadline_s=round(deadline_s))
    doc.setdefault("environment", json.loads(env[ENV_VARIABLE]))
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(path)
    return doc


def _headline(doc: dict[str, Any]) -> str:
    summary = doc.get("summary") or {}
    text = "; ".join(f"{k} {v}" for k, v in summary.items())
    checks = doc.get("checks") or []
    met = sum(1 for c in checks if c.get("met") is True)
    missed = [c["name"] for c in checks if c.get("met") is False]
    if checks:
        text += f"; targets met {met}/{len(checks)}"
        if missed:
            text += f" (missed: {', '.join(missed)})"
    return text


def print_table(env: dict[str, Any], docs: list[dict[str, Any]], total_s: float) -> None:
    print()
    print(f"GPU check on {describe(env)}: {total_s:.0f} s")
    print(f"{'part':<14} {'status':<18} {'s / deadline':>13}  figures")
    for doc in docs:
        name = f"{doc.get('letter', '?')} {doc['part']}"
        when = f"{doc.get('wall_s', 0):.0f} / {doc.get('deadline_s', 0)}"
        print(f"{name:<14} {doc['status']:<18} {when:>13}  {_headline(doc)}")


def check(
    out_dir: Path, *, dry_run: bool, only: list[Part] | None = None, deadline_scale: float = 1.0
) -> int:
    """Run the parts into out_dir; 0 when every part that ran ended "ok". A dry run's
    deadlines are multiplied by deadline_scale (a loaded machine)."""
    began = time.monotonic()
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.json*"):
        stale.unlink()
    # STOKER_HOME (synthetic data, runs) outside OUT_DIR: the device tool brings back
    # eight files from $OUT, and they must be the results.
    home = Path(tempfile.mkdtemp(prefix="stoker-gpu-check-home-"))
    site = wheels.install_carried()
    try:
        return _check_in(
            out_dir, home, site, began, dry_run=dry_run, only=only, deadline_scale=deadline_scale
        )
    finally:
        for folder in (home, site):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)


def _check_in(
    out_dir: Path,
    home: Path,
    site: Path | None,
    began: float,
    *,
    dry_run: bool,
    only: list[Part] | None,
    deadline_scale: float = 1.0,
) -> int:
    env = _child_env(site, dry_run, home)
    facts = _read_environment(env)
    env[ENV_VARIABLE] = json.dumps(facts)
    print(f"gpu-check: {describe(facts)}", flush=True)
    if not dry_run and not facts.get("gpu"):
        print("gpu-check: no CUDA GPU here; for a CPU rehearsal use --dry-run", file=sys.stderr)
        return 2
    docs = []
    with open(out_dir / LOG_NAME, "w") as log:
        log.write(f"gpu-check on {describe(facts)}\n")
        for part in only or PARTS:
            left = BUDGET_S - (time.monotonic() - began)
            deadline = part.dry_run_deadline_s * deadline_scale if dry_run else part.deadline_s
            if not dry_run:
                # A part that ran short leaves its seconds to the next; none runs
                # past the whole budget.
                deadline = min(deadline + max(0.0, left - _still_owed(part, only)), left)
            if deadline < 5:
                doc = {"part": part.name, "letter": part.letter, "status": "not run (no time)"}
                docs.append(doc)
                continue
            docs.append(run_part(part, out_dir, env, deadline, dry_run, log))
    for stale in out_dir.glob("*.json.tmp"):
        stale.unlink()
    print_table(facts, docs, time.monotonic() - began)
    return 0 if all(d["status"] == "ok" for d in docs) else 1


def _still_owed(part: Part, only: list[Part] | None) -> float:
    """The deadlines of this part and the ones after it."""
    parts = list(only or PARTS)
    return float(sum(p.deadline_s for p in parts[parts.index(part) :]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-check",
        description="Every GPU figure of stoker in one call on a lent GPU (docs/kernels.md).",
    )
    parser.add_argument("out_dir", type=Path, nargs="?", help="where the results go ($OUT)")
    parser.add_argument(
        "--dry-run", action="store_true", help="every part at tiny shapes on the CPU"
    )
    parser.add_argument("--parts", help="a comma-separated subset, by letter or name")
    parser.add_argument(
        "--deadline-scale",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="with --dry-run: multiply each part's deadline (a loaded machine, e.g. the "
        "suite's nice-19 process); the GPU run's deadlines fit the device's lease",
    )
    parser.add_argument(
        "--prepare",
        action="store_true",
        help=f"download the wheels the GPU machine lacks into {wheels.WHEEL_DIR_NAME}/ "
        "and size the upload",
    )
    args = parser.parse_args(argv)
    if args.prepare:
        return wheels.prepare()
    if args.out_dir is None:
        parser.error("OUT_DIR is required (or --prepare)")
    if args.deadline_scale != 1.0 and not args.dry_run:
        parser.error(
            f"--deadline-scale {args.deadline_scale} is for --dry-run only: the GPU run's "
            "deadlines add up to the device's lease (benchmarks/gpu_check/parts.py)"
        )
    if args.deadline_scale <= 0:
        parser.error(f"--deadline-scale {args.deadline_scale}: give a factor above 0, e.g. 3")
    try:
        only = [part_named(p) for p in args.parts.split(",")] if args.parts else None
    except ValueError as exc:
        parser.error(str(exc))
    return check(args.out_dir, dry_run=args.dry_run, only=only, deadline_scale=args.deadline_scale)
