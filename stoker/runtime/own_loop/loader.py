"""`run.loader()` of `stoker.job`: the built-in trainer's streaming loader for a loop of
one's own, its batches on the run's device exactly as the trainer's are."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from stoker.runtime.session import to_device

if TYPE_CHECKING:
    import torch

    from stoker.data.stream.loader import StreamingLoader


class DataWait:
    """A rank's seconds waiting for batches since it was last taken: the data wait of
    the straggler report (`Run.should_stop()` takes it once per step)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def add(self, seconds: float) -> None:
        self.seconds += seconds

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class JobLoader:
    """stoker's streaming loader of the experiment's `data.*` keys, as `run.loader()`
    gives it: `batches()` is endless and goes on from the loader's position (restored
    by `Checkpoint.restore()`), and the time each rank waits for a batch is its data
    wait in the straggler report."""

    def __init__(self, loader: StreamingLoader, device: torch.device, wait: DataWait) -> None:
        self.loader, self.device, self.wait = loader, device, wait

    def batches(self) -> Iterator[dict[str, Any]]:
        """Batches on the run's device: tensors and dicts of tensors (latents) moved,
        the sample positions and lists as they are (stoker/runtime/session.py)."""
        stream = iter(self.loader.batches())
        while True:
            started = time.perf_counter()
            batch = next(stream)
            self.wait.add(time.perf_counter() - started)
            yield to_device(batch, self.device)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
