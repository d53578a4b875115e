"""One rank of a multi-rank checkpoint test, as torchrun (or tests/local_ranks.py, which
sets the same variables) starts it:

    python tests/local_ranks.py --nproc-per-node N --master-port P tests/checkpoint/rank_main.py \\
        --config exp.yaml --run-dir RUN --out OUT.json [--stop-at S] [--hold-step K]

The real Trainer and Checkpointer over gloo, with a recording sink. Rank 0
writes OUT.json: the start step, the loss of every step, the global sample
positions each step consumed (from every rank), and the full model and
optimizer state at the end (OUT.pt) and, on a resume, right after loading
(OUT.loaded.pt). --stop-at asks for a stop after step S (saved, exit 75), as a
preemption would. --hold-step makes rank 1 announce itself in
RUN/held-<pid> and stall inside the DCP write of step K, for the test to
SIGKILL it mid-save.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from stoker.checkpoint import checkpointer
from stoker.config import load_frozen
from stoker.runtime.dist import dist_env, rendezvous
from stoker.runtime.observe.metrics_sink import MetricsOnlySink
from stoker.runtime.trainer import Trainer


class Sink(MetricsOnlySink):
    def __init__(self, stop_file: Path | None, stop_at: int | None) -> None:
        self.losses: dict[int, float] = {}
        self.stop_file, self.stop_at = stop_file, stop_at

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if "loss" in metrics:
            self.losses[step] = metrics["loss"]
        if step == self.stop_at and self.stop_file is not None:
            self.stop_file.touch()


class RecordingTrainer(Trainer):
    """Records the stream positions of every micro-batch this rank trains on."""

    positions: list[int]

    def _batches(self) -> Iterator[dict[str, Any]]:
        self.positions = []
        for batch in super()._batches():
            self.positions.extend(int(p) for p in batch["position"].tolist())
            yield batch


def hold_writes(step: int, run_dir: Path) -> None:
    """Rank 1 stalls inside the write of step-<step>: the test kills it there."""
    make_writer = checkpointer.storage_writer

    def storage_writer(url: str, fs_options: dict[str, Any] | None = None) -> Any:
        writer = make_writer(url, fs_options)
        if url.rstrip("/").endswith(f"step-{step}"):
            write_data = writer.write_data

            def stalled(plan: Any, planner: Any) -> Any:
                (run_dir / f"held-{os.getpid()}").touch()
                time.sleep(600)
                return write_data(plan, planner)

            writer.write_data = stalled
        return writer

    checkpointer.storage_writer = storage_writer  # type: ignore[assignment]


def full_state(trainer: Trainer) -> dict[str, Any]:
    """The whole model and optimizer state, unsharded, on rank 0 (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model, optim = get_state_dict(trainer.model, trainer.optimizer, options=options)
    return {"model": model, "optim": optim}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stop-at", type=int)
    parser.add_argument("--hold-step", type=int)
    args = parser.parse_args()

    torch.set_num_threads(1)
    cfg = load_frozen(args.config)
    env = dist_env.detect()
    device = torch.device("cpu")
    rendezvous.join(env, device, rendezvous_timeout_s=300, collective_timeout_s=300)
    if args.hold_step is not None and env.rank == 1:
        hold_writes(args.hold_step, args.run_dir)
    stop_file = args.run_dir / "stop-requested"
    os.environ["STOKER_STOP_FILE"] = str(stop_file)
    sink = Sink(stop_file if env.is_main else None, args.stop_at)
    mesh = dist_env.data_parallel_mesh(env, device)
    trainer = RecordingTrainer(cfg, env, device, run_dir=args.run_dir, sink=sink, mesh=mesh)
    trainer.build()
    if trainer.start_step:
        loaded = full_state(trainer)
        if env.is_main:
            torch.save(loaded, args.out.with_suffix(".loaded.pt"))
    outcome = trainer.train()
    trainer.checkpointer.close()
    weights = full_state(trainer)
    positions: list[Any] = [trainer.positions]
    if env.distributed:
        positions = [None] * env.world_size
        torch.distributed.all_gather_object(positions, trainer.positions)
    if env.is_main:
        torch.save(weights, args.out.with_suffix(".pt"))
        accum, micro = cfg.train.grad_accum, trainer.micro_batch // env.world_size
        per_step = micro * accum  # positions one rank takes per step
        steps: dict[int, list[int]] = {}
        for rank_positions in positions:
            for i in range(0, len(rank_positions), per_step):
                step = trainer.start_step + i // per_step + 1
                steps.setdefault(step, []).extend(rank_positions[i : i + per_step])
        args.out.write_text(json.dumps({
            "start_step": trainer.start_step,
            "exit_code": outcome.exit_code,
            "losses": sink.losses,
            "positions": {s: sorted(p) for s, p in steps.items()},
        }))  # fmt: skip
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0  # the outcome is in OUT.json: the launcher stops every rank when one exits non-zero


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Past the interpreter's finalization, as the runtime's own entry point ends
    # (stoker.runtime.train.run): gloo's threads torn down there aborted a rank now and
    # then with "terminate called without an active exception".
    os._exit(code)
