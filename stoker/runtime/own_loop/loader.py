"""`run.loader()` of `stoker.job`: the built-in trainer's streaming loader for a loop of
one's own, its batches on the run's device exactly as the trainer's are."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from stoker.runtime.dist.context_mesh import group_batches, group_state
from stoker.runtime.session import to_device

if TYPE_CHECKING:
    import torch

    from stoker.data.stream.loader import StreamingLoader
    from stoker.runtime.models.context_parallel import GroupContextParallel


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

    def __init__(
        self,
        loader: StreamingLoader,
        device: torch.device,
        wait: DataWait,
        cp: GroupContextParallel | None = None,
    ) -> None:
        self.loader, self.device, self.wait, self.cp = loader, device, wait, cp

    def batches(self) -> Iterator[dict[str, Any]]:
        """Batches on the run's device: tensors and dicts of tensors (latents) moved,
        the sample positions and lists as they are (stoker/runtime/session.py). With
        context parallelism every rank of a CP group gets its group's batch whole (read
        on its CP rank 0), and cuts its tokens with stoker.model.token_slice."""
        stream = iter(self.loader.batches())
        if self.cp is not None:
            stream = group_batches(stream if self.cp.rank == 0 else None, self.cp)
        while True:
            started = time.perf_counter()
            batch = next(stream)
            self.wait.add(time.perf_counter() - started)
            yield to_device(batch, self.device)

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands (with CP: as the CP group's rank 0 has it; a collective
        of the group, which a checkpoint's save is)."""
        state: dict[str, Any] = group_state(self.loader.state_dict(), self.cp)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)
