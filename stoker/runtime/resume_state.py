"""The training state a stopped job resumes from: model, optimizer, schedule,
loader position, every rank's RNG, and the step, saved synchronously with
torch.distributed.checkpoint (DCP) into <root>/step-<N>/.

A folder is complete when DCP's `.metadata` exists (the coordinator writes it
after every rank's shards): a folder without it is never loaded. This is the
plain form the runtime needs for preemption; stoker.checkpoint ([6/7]) adds
asynchronous saves, verified commits, retention and object stores.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass
class TrainState:
    step: int
    loader: dict[str, Any] | None
    mlflow_run_id: str | None = None


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns on every save and load without a process group ("assuming
    the intent is to save in a single process"): one process is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoint folders under root, newest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / ".metadata").is_file():
            found.append((int(match.group(1)), child))
    return sorted(found, reverse=True)


def save(
    root: Path,
    state: TrainState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    rank: int,
) -> Path:
    """Save on every rank (a collective); returns the folder."""
    from torch.distributed.checkpoint import state_dict_saver
    from torch.distributed.checkpoint.state_dict import get_state_dict

    folder = root / f"step-{state.step}"
    folder.mkdir(parents=True, exist_ok=True)
    # RNG streams differ per rank and are not DCP-shardable: one small file
    # each, written before DCP's .metadata marks the folder complete.
    (folder / "rng").mkdir(exist_ok=True)
    torch.save(_rng_state(), folder / "rng" / f"rank-{rank}.pt")
    model_state, optim_state = get_state_dict(model, optimizer)
    # The small non-tensor state as one JSON string: DCP stores it as one
    # object, where a nested dict would become keys that change with content.
    train = json.dumps(
        {
            "step": state.step,
            "loader": state.loader,
            "mlflow_run_id": state.mlflow_run_id,
            "scheduler": scheduler.state_dict(),
        }
    )
    with _single_process_quiet():
        state_dict_saver.save(
            {"model": model_state, "optim": optim_state, "train": train},
            checkpoint_id=str(folder),
            no_dist=not torch.distributed.is_initialized(),
        )
    return folder


def load_latest(
    root: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    rank: int,
) -> TrainState | None:
    """Load the newest complete checkpoint under root into the model and
    optimizer (resharded onto this world size by DCP); None when there is none."""
    from torch.distributed.checkpoint import state_dict_loader
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    found = step_dirs(root)
    if not found:
        return None
    _, folder = found[0]
    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state, "train": ""}
    with _single_process_quiet():
        state_dict_loader.load(
            state, checkpoint_id=str(folder), no_dist=not torch.distributed.is_initialized()
        )
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    train = json.loads(state["train"])
    scheduler.load_state_dict(train["scheduler"])
    rng = folder / "rng" / f"rank-{rank}.pt"
    if rng.is_file():  # absent when resuming on more ranks than saved
        _set_rng_state(torch.load(rng, weights_only=True))
    return TrainState(int(train["step"]), train["loader"], train.get("mlflow_run_id"))


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete folders (rank 0 only)."""
    for _, folder in step_dirs(root)[keep:]:
        shutil.rmtree(folder, ignore_errors=True)
