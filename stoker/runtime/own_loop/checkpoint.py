"""`run.checkpointer(...)` of `stoker.job`: the built-in trainer's checkpoints
(stoker/checkpoint/checkpointer.py) for a loop stoker did not write.

    save(step)     a collective: every rank's shards of the model and optimizer (DCP,
                   resharded on load), the schedule, the loader's position and each
                   rank's RNG; written in the background with checkpoint.async, and
                   committed (COMMIT.json) only once every rank's files are whole
    restore()      the newest checkpoint that verifies, loaded into the objects; the
                   step to go on from (0 when there is none). When checkpoints exist
                   but none verifies, it stops the job with an error, unless
                   checkpoint.if_none_verifies=start_fresh

`step` is the number of steps done: save(step) after `step` steps, and a restored
loop starts its next step there (`for step in range(ckpt.restore(), total)` with
`save(step + 1)` at the end of the body).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from stoker.checkpoint.train_state import TrainState
from stoker.errors import StokerError
from stoker.runtime.job_checkpointer import checkpointer_for
from stoker.runtime.session import JobSession

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class Checkpoint:
    def __init__(
        self,
        session: JobSession,
        model: nn.Module,
        optim: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None,
        loader: Any,
        *,
        on_restore: Callable[[int], None],
        mesh: DeviceMesh | None,
    ) -> None:
        """`on_restore(step)`: the loop starts at `step` (the run's first heartbeat);
        `mesh`: the one the model is sharded over (resharding on load)."""
        for name in ("state_dict", "load_state_dict"):
            if loader is not None and not callable(getattr(loader, name, None)):
                raise StokerError(
                    f"the loader given to run.checkpointer() ({type(loader).__name__}) "
                    f"has no {name}(): its position cannot be saved",
                    fix="pass run.loader(), a torchdata StatefulDataLoader, or loader=None",
                )
        self._session, self._on_restore = session, on_restore
        self.model, self.optim, self.scheduler, self.loader = model, optim, scheduler, loader
        cfg = session.config.checkpoint
        self.root = cfg.root or str(session.run_dir / "checkpoints")
        self.every = cfg.every
        """checkpoint.every: save when `due(step)`."""
        env = session.env
        self._checkpointer = checkpointer_for(
            session.config,
            self.root,
            rank=env.rank,
            world_size=env.world_size,
            mesh=mesh,
            sink=session.tracking if env.is_main else None,
            run_dir=session.run_dir,
        )

    def restore(self) -> int:
        """Load the newest verified checkpoint (on every rank); the number of steps it
        had done, or 0 without one."""
        state = self._checkpointer.load_latest(self.model, self.optim, self.scheduler)
        step = 0
        if state is not None:
            step = state.step
            if self.loader is not None and state.loader is not None:
                self.loader.load_state_dict(state.loader)
            if self._session.env.is_main:
                print(f"resumed from {self.root}/step-{step}", flush=True)
        self._on_restore(step)
        return step

    def due(self, step: int) -> bool:
        """Whether checkpoint.every asks for a save after `step` steps."""
        return bool(self.every) and step % self.every == 0

    def save(self, step: int, *, wait: bool = False) -> None:
        """Save the state after `step` steps (a collective: every rank). In the
        background with checkpoint.async; `wait`: return once committed (before
        `exit_for_requeue()`). A save that failed raises here (with `wait`) or at
        the next save."""
        loader_state = self.loader.state_dict() if self.loader is not None else None
        tracking = self._session.tracking
        state = TrainState(step, loader_state, tracking.run_id if tracking is not None else None)
        self._raise_failures()
        self._checkpointer.save(step, state, self.model, self.optim, self.scheduler)
        if wait:
            self._checkpointer.wait()
            self._raise_failures()

    def close(self) -> None:
        """Wait for a save in flight; done by `run.finish()` and `exit_for_requeue()`."""
        self._checkpointer.close()

    def _raise_failures(self) -> None:
        if self._checkpointer.failures:
            step, message = self._checkpointer.failures[0]
            self._checkpointer.failures.clear()
            raise StokerError(
                f"the checkpoint of step {step} failed: {message}",
                fix="check that checkpoint.root is writable and has space; the run can "
                "resume from the checkpoint before",
            )
