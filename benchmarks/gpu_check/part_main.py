"""One part of the GPU check in this process: `python -m benchmarks.gpu_check.part_main
MODULE OUT_DIR [--dry-run]` (the orchestrator runs each part so, with its deadline)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", help="the part's module (parts.py)")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    importlib.import_module(args.module).main(args.out_dir, dry_run=args.dry_run)


if __name__ == "__main__":
    main()
