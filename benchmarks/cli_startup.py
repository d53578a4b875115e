"""How long `stoker --help` takes on a login node, against bare Python start-up.

    python benchmarks/cli_startup.py [--repeats 30] [--out benchmarks/results]

Runs `python -c pass` (the floor), `stoker --help` and each sub-command's `--help`,
interleaved so load on the machine affects all alike; reports the median wall time
of each, its ratio to the floor, and the 100 ms target for `stoker --help`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.machine import machine_info

TARGET_MS = 100.0
STOKER = str(Path(sys.executable).with_name("stoker"))
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "stoker --help": [STOKER, "--help"],
    "stoker --version": [STOKER, "--version"],
    "stoker init --help": [STOKER, "init", "--help"],
    "stoker config show --help": [STOKER, "config", "show", "--help"],
}


def wall_ms(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - start) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    for cmd in CASES.values():  # warm the page cache and .pyc files
        wall_ms(cmd)
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name, cmd in CASES.items():
            samples[name].append(wall_ms(cmd))

    floor = statistics.median(samples["python -c pass"])
    rows = []
    print(f"{'command':<28} {'median ms':>10} {'p90 ms':>8} {'x python':>9}")
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
        print(f"{name:<28} {median:>10.1f} {p90:>8.1f} {median / floor:>9.2f}")
    help_ms = statistics.median(samples["stoker --help"])
    verdict = "meets" if help_ms <= TARGET_MS else "MISSES"
    print(f"stoker --help: {help_ms:.1f} ms, {verdict} the {TARGET_MS:.0f} ms target")

    now = dt.datetime.now(dt.timezone.utc)
    result = {
        "benchmark": "cli_startup",
        "date": now.isoformat(timespec="seconds"),
        "machine": machine_info(),
        "repeats": args.repeats,
        "baseline": "python -c pass",
        "target_ms": TARGET_MS,
        "meets_target": help_ms <= TARGET_MS,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"cli_startup-{result['machine']['host']}-{now:%Y-%m-%d}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0 if help_ms <= TARGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
