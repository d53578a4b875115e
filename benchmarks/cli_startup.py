"""How long `stoker --help` takes on a login node, against bare Python start-up.

    python benchmarks/cli_startup.py [--repeats 30] [--importtime-runs 5] [--importtime-top 25]
        [--out benchmarks/results]

Runs `python -c pass` (the floor), `stoker --help` and each sub-command's `--help`,
interleaved so load on the machine affects all alike; reports the median wall time
of each, its ratio to the floor, and the 100 ms target for `stoker --help`; then what
each module `stoker --help` imports costs (`python -X importtime`, medians of
--importtime-runs runs): its own time and with what it imports, by module and by
top-level package.

A help is rendered by typer the first time it is asked for, then printed from
stoker/cli/help_cache.py's cache: the rows are the cached ones, what a user sees from the
second time on (the warm-up keeps them, in a STOKER_HOME of the benchmark's own), and
`stoker --help, first time` renders it each run (an empty cache), with its imports.

The warm-up writes the bytecode cache (__pycache__) even where PYTHONDONTWRITEBYTECODE
is set, as pip does at install: without it every module changed since the cache was
last written is compiled again at every start (20 of stoker's modules here, ~20 ms
of `stoker --help`), which a login node's installed stoker never does.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.machine import machine_info

TARGET_MS = 100.0
FIRST_TIME = "stoker --help, first time"
STOKER = str(Path(sys.executable).with_name("stoker"))


def command_paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group under `command` (typer's click), by its words. A group
    lists its commands' names (stoker/cli/lazy_group.py builds each when asked)."""
    import typer

    paths = [prefix]
    if hasattr(command, "list_commands"):
        ctx = typer.Context(command)
        for name in command.list_commands(ctx):
            paths += command_paths(command.get_command(ctx, name), (*prefix, name))
    return paths


def cases() -> dict[str, list[str]]:
    """The floor, `stoker --version`, and `--help` of stoker and of every sub-command."""
    import typer.main

    from stoker.cli.app import app

    out = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "stoker --version": [STOKER, "--version"],
        FIRST_TIME: [STOKER, "--help", FIRST_TIME],
    }
    for path in command_paths(typer.main.get_command(app)):
        out[" ".join(("stoker", *path, "--help"))] = [STOKER, *path, "--help"]
    return out


def wall_ms(cmd: list[str], env: dict[str, str] | None = None) -> float:
    if cmd[-1] == FIRST_TIME:  # the help rendered: no cache kept from an earlier run
        env = {**(env or os.environ), "STOKER_HOME": tempfile.mkdtemp(prefix="stoker-home-")}
        cmd = cmd[:-1]
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
    return (time.perf_counter() - start) * 1000


def import_costs(runs: int, cached: bool) -> dict[str, Any]:
    """What `stoker --help` imports, from `-X importtime`, printed from the cache or
    (`cached` False) rendered: per module its own and its cumulative microseconds
    (medians over `runs`), and the own time by top-level package."""
    own: dict[str, list[int]] = {}
    cumulative: dict[str, list[int]] = {}
    for _ in range(runs):
        home = os.environ["STOKER_HOME"] if cached else tempfile.mkdtemp(prefix="stoker-home-")
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "stoker", "--help"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "STOKER_HOME": home},
        )
        for line in result.stderr.splitlines():
            fields = line.removeprefix("import time:").split("|")
            if len(fields) != 3 or not fields[0].strip().isdigit():
                continue  # the header
            name = fields[2].strip()
            own.setdefault(name, []).append(int(fields[0]))
            cumulative.setdefault(name, []).append(int(fields[1]))
    modules = sorted(
        (
            {
                "module": name,
                "self_us": round(statistics.median(own[name])),
                "cumulative_us": round(statistics.median(cumulative[name])),
            }
            for name in own
        ),
        key=lambda row: -row["self_us"],
    )
    packages: dict[str, int] = {}
    for row in modules:
        top = row["module"].split(".")[0]
        packages[top] = packages.get(top, 0) + row["self_us"]
    return {
        "runs": runs,
        "modules": len(modules),
        "total_self_us": sum(row["self_us"] for row in modules),
        "by_package_us": dict(sorted(packages.items(), key=lambda kv: -kv[1])),
        "by_module": modules,
    }


def print_import_costs(costs: dict[str, Any], top: int, how: str) -> None:
    print(
        f"\nstoker --help {how} imports {costs['modules']} modules, "
        f"{costs['total_self_us'] / 1000:.1f} ms in all (-X importtime, median of "
        f"{costs['runs']} runs)"
    )
    packages = list(costs["by_package_us"].items())
    print(
        "by package (own ms): "
        + ", ".join(f"{name} {us / 1000:.1f}" for name, us in packages[:12])
        + (f", {len(packages) - 12} more" if len(packages) > 12 else "")
    )
    print(f"{'module':<40} {'self ms':>8} {'cumul. ms':>10}")
    for row in costs["by_module"][:top]:
        own, cumulative = row["self_us"] / 1000, row["cumulative_us"] / 1000
        print(f"{row['module']:<40} {own:>8.2f} {cumulative:>10.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--importtime-runs", type=int, default=5)
    parser.add_argument("--importtime-top", type=int, default=25, help="modules printed")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    # The helps this run keeps, apart from the user's own $STOKER_HOME.
    os.environ["STOKER_HOME"] = tempfile.mkdtemp(prefix="stoker-home-")
    writes_bytecode = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    CASES = cases()
    for cmd in CASES.values():  # warm the page cache and the bytecode cache
        wall_ms(cmd, env=writes_bytecode)
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name, cmd in CASES.items():
            samples[name].append(wall_ms(cmd))

    floor = statistics.median(samples["python -c pass"])
    rows = []
    print(f"{'command':<36} {'median ms':>10} {'p90 ms':>8} {'x python':>9}")
    for name, values in samples.items():
        median = statistics.median(values)
        p90 = sorted(values)[int(0.9 * (len(values) - 1))]
        rows.append(
            {
                "command": name,
                "median_ms": round(median, 2),
                "p90_ms": round(p90, 2),
                "ratio_to_python": round(median / floor, 2),
            }
        )
        print(f"{name:<36} {median:>10.1f} {p90:>8.1f} {median / floor:>9.2f}")
    help_ms = statistics.median(samples["stoker --help"])
    verdict = "meets" if help_ms <= TARGET_MS else "MISSES"
    print(
        f"stoker --help: {help_ms:.1f} ms, {help_ms / floor:.2f}x `python -c pass` "
        f"({floor:.1f} ms); {verdict} the {TARGET_MS:.0f} ms target"
    )
    sub = max(
        (statistics.median(v), name)
        for name, v in samples.items()
        if name.endswith("--help") and name != "stoker --help"
    )
    first = statistics.median(samples[FIRST_TIME])
    sub_verdict = "meets" if sub[0] <= TARGET_MS else "MISSES"
    print(
        f"slowest sub-command --help: {sub[1]}, {sub[0]:.1f} ms, {sub[0] / floor:.2f}x; "
        f"{sub_verdict} the target"
    )
    print(
        f"{FIRST_TIME} (rendered by typer, then kept): {first:.1f} ms, {first / floor:.2f}x; "
        f"{'within' if first <= TARGET_MS else 'over'} the target"
    )
    costs = import_costs(args.importtime_runs, cached=False)
    print_import_costs(costs, args.importtime_top, "rendered (first time)")
    cached_costs = import_costs(args.importtime_runs, cached=True)
    print_import_costs(cached_costs, 10, "from the cache")

    now = dt.datetime.now(dt.timezone.utc)
    result = {
        "benchmark": "cli_startup",
        "date": now.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "repeats": args.repeats,
        "baseline": "python -c pass",
        "target_ms": TARGET_MS,
        "meets_target": help_ms <= TARGET_MS and sub[0] <= TARGET_MS,
        "help_ratio_to_python": round(help_ms / floor, 2),
        "rows": rows,
        "first_help_ms": round(first, 2),
        "imports": costs,
        "imports_cached": cached_costs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"cli_startup-{result['machine']['host']}-{now:%Y-%m-%d}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0 if help_ms <= TARGET_MS and sub[0] <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
