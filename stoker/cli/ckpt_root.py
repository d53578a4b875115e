"""PATH of the `stoker ckpt` commands: a checkpoint path, or a job id of the ledger,
which stands for that job's checkpoint root (checkpoint.root of its frozen config,
default <run folder>/checkpoints); and the experiment a checkpoint outside any run folder
carries (`stoker sample CKPT`, `stoker plan --calibrate CKPT`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stoker.checkpoint.origin import SavedDescription
    from stoker.config import ExperimentConfig


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


def carried_config(described: SavedDescription, *, fix: str) -> ExperimentConfig:
    """The frozen experiment a checkpoint carries (its commit's config.yaml: a root on a
    shared bucket, a copied step-<N> folder), validated as a job reads it; `fix`: what to
    do for a checkpoint that carries none (saved by an older stoker)."""
    import tempfile

    from stoker.checkpoint.commit import CONFIG_NAME
    from stoker.config import resolve_config
    from stoker.errors import StokerError

    if described.config_text is None:
        raise StokerError(
            f"{described.folder} carries no {CONFIG_NAME} (saved by an older stoker or by a "
            "checkpointer given none), and is not in a run folder",
            fix=fix,
        )
    with tempfile.TemporaryDirectory(prefix="stoker-ckpt-config-") as folder:
        frozen = Path(folder) / CONFIG_NAME
        frozen.write_text(described.config_text)
        return resolve_config(frozen, use_profile=False).config
