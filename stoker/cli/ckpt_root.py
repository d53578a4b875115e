"""PATH of the `stoker ckpt` commands: a checkpoint path, or a job id of the ledger,
which stands for that job's checkpoint root (checkpoint.root of its frozen config,
default <run folder>/checkpoints)."""

from __future__ import annotations

from pathlib import Path


def checkpoint_path(path: str) -> str:
    """`path` itself when it is a URL or exists; else, when the ledger knows a job of
    that id, its checkpoint root; else `path` (the command says it does not exist)."""
    if "://" in path or Path(path).exists():
        return path
    from stoker.config.frozen import load_frozen
    from stoker.launcher.jobs.ledger import Ledger

    record = Ledger().get(path)
    if record is None:
        return path
    run_dir = Path(record.run_dir)
    config = load_frozen(run_dir / "config.yaml")
    return config.checkpoint.root or str(run_dir / "checkpoints")
