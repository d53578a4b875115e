"""What a checkpoint holds, as one DCP state dict:

    model     the model's state dict by plain FQN (FSDP, compile and activation
              checkpointing wrappers stripped by get_state_dict): sharded
              DTensors on many ranks, resharded by DCP on load
    optim     the optimizer's state, keyed by the same FQNs
    train     one JSON string: step, loader position, MLflow run id, schedule
    rng       {"rank-<r>": this rank's RNG states}: each rank saves its own key
    <extra>   tensors by FQN kept beside the model, e.g. `ema` (the weights' moving
              average, sharded as the model): saved when given, loaded when both
              the caller and the checkpoint have them

The small non-tensor state is one JSON string: DCP stores a string as one
object (the same on every rank, saved once), where a nested dict would become
keys that change with the content. `stoker ckpt export` reads only `model.*`.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

MODEL_KEY = "model"


@dataclass
class TrainState:
    step: int
    loader: dict[str, Any] | None
    mlflow_run_id: str | None = None
    extra_loaded: frozenset[str] = frozenset()
    """The `extra` state dicts the checkpoint had and the load filled (their names)."""


Extra = dict[str, dict[str, torch.Tensor]]
"""Named state dicts of tensors saved beside the model: {"ema": {fqn: tensor}}."""
RESERVED = frozenset({MODEL_KEY, "optim", "train", "rng"})


def _rng_blob() -> torch.Tensor:
    """This rank's CPU, CUDA and Python (`random`) RNG states as one uint8 tensor (DCP saves tensors
    per rank by key; a pickled dict would need an object per rank)."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state()
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _restore_rng(blob: torch.Tensor) -> None:
    state = torch.load(io.BytesIO(blob.numpy().tobytes()), weights_only=True)
    torch.set_rng_state(state["cpu"])
    if "python" in state:  # saved since stoker 0.2
        random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def state_to_save(
    state: TrainState,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    *,
    rank: int,
    extra: Extra | None = None,
) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _check_extra(extra)
    model_state, optim_state = get_state_dict(model, optimizer)
    train = json.dumps(
        {
            "step": state.step,
            "loader": state.loader,
            "mlflow_run_id": state.mlflow_run_id,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
        }
    )
    return {
        MODEL_KEY: model_state,
        "optim": optim_state,
        "train": train,
        "rng": {f"rank-{rank}": _rng_blob()},
        **(extra or {}),
    }


def _check_extra(extra: Extra | None) -> None:
    clash = RESERVED & set(extra or {})
    if clash:
        raise ValueError(f"extra state {sorted(clash)} would replace the checkpoint's own keys")


def state_to_load(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    saved_keys: set[str],
    rng_sizes: dict[str, Any],
    *,
    rank: int,
    extra: Extra | None = None,
) -> dict[str, Any]:
    """The state dict DCP loads into: this rank's RNG only when the checkpoint
    has it (a resume on more ranks than saved has none for the new ranks), and each
    `extra` state dict whose every key the checkpoint has (loaded in place)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    _check_extra(extra)
    model_state, optim_state = get_state_dict(model, optimizer)
    out: dict[str, Any] = {MODEL_KEY: model_state, "optim": optim_state, "train": ""}
    for name, tensors in (extra or {}).items():
        if tensors and all(f"{name}.{fqn}" in saved_keys for fqn in tensors):
            out[name] = tensors
    key = f"rank-{rank}"
    if f"rng.{key}" in saved_keys:
        out["rng"] = {key: torch.empty(rng_sizes[f"rng.{key}"], dtype=torch.uint8)}
    return out


def apply_loaded(
    loaded: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
) -> TrainState:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(
        model, optimizer, model_state_dict=loaded[MODEL_KEY], optim_state_dict=loaded["optim"]
    )
    train = json.loads(loaded["train"])
    if scheduler is not None and train.get("scheduler") is not None:
        scheduler.load_state_dict(train["scheduler"])
    for blob in loaded.get("rng", {}).values():
        _restore_rng(blob)
    extra = frozenset(loaded) - RESERVED
    return TrainState(int(train["step"]), train["loader"], train.get("mlflow_run_id"), extra)
