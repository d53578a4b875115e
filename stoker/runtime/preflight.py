"""The model a config names, built on the meta device before a job starts: a data
config whose shapes the model cannot take is refused in seconds, before a data set is
written or a rank is started (`stoker run`; docs/runtime.md).

Run by the launcher as a child process (it imports torch, which the login node's
commands do not): `python -m stoker.runtime.preflight --config FROZEN`. Exit 0 when
the model builds; else exit PREFLIGHT_REFUSED (stoker/protocol.py) with one JSON
object on stdout: {"key", "message", "fix"}, the setting to change first and the
values to use.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from stoker.protocol import PREFLIGHT_REFUSED


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stoker.runtime.preflight")
    parser.add_argument("--config", type=Path, required=True, help="a frozen config")
    args = parser.parse_args(argv)

    import torch

    from stoker.config import load_frozen
    from stoker.runtime.models import build_model
    from stoker.runtime.models.build import ModelSetupError

    cfg = load_frozen(args.config)
    try:
        with torch.device("meta"):  # the shapes only: nothing allocated
            build_model(cfg.model, cfg.data)
    except ModelSetupError as exc:
        print(json.dumps({"key": exc.key, "message": exc.message, "fix": exc.fix}))
        return PREFLIGHT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main())
