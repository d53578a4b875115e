"""The training entry point, as the SLURM template, `stoker submit --local` and
`stoker run` start it in every rank:

    python -m stoker.runtime.train --config RUN_DIR/config.yaml

One process per GPU (or CPU rank). It reads where it stands from the
launcher's variables (stoker/runtime/dist_env.py), builds, trains, closes, and
exits 0 when done, 75 (requeue) after saving on a stop request, 143 when
terminated, 124 when the hang watchdog failed the job, 76 when a collective
lost a peer (a rank or node gone: the batch script may restart the job), 1 on
an error of its own.

With torchrun instead of the launcher:

    torchrun --nproc-per-node 2 -m stoker.runtime.train --config exp-frozen.yaml
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback
from pathlib import Path

from stoker.errors import StokerError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stoker.runtime.train")
    parser.add_argument("--config", required=True, type=Path, help="the frozen experiment YAML")
    args = parser.parse_args(argv)

    from stoker.runtime.stop_request import StopRequest

    # First: a stop asked for while torch imports must not kill the task (it saves at
    # the first step boundary instead).
    stop = StopRequest()
    stop.install(term=False)

    import torch

    from stoker.config import load_frozen
    from stoker.kernels import KernelBackendError
    from stoker.protocol import ENV_RESTART, ENV_RUN_DIR, EXIT_HANG, EXIT_PEER_LOST
    from stoker.runtime import dist_env, flight_recorder, rendezvous
    from stoker.runtime.data_lineage import record_lineage
    from stoker.runtime.heartbeat import announce_exit, hang_reported, interval_for, silent_ranks
    from stoker.runtime.rank_tracking import open_tracking
    from stoker.runtime.time_account import log_job_time
    from stoker.runtime.trainer import Trainer

    cfg = load_frozen(args.config)
    env = dist_env.detect()
    device = dist_env.device_for(env)
    if device.type == "cpu":
        torch.set_num_threads(dist_env.cpu_threads(env))
    run_dir = Path(os.environ.get(ENV_RUN_DIR) or args.config.resolve().parent)
    restart = int(os.environ.get(ENV_RESTART) or 0)
    try:
        rendezvous.join(
            env,
            device,
            rendezvous_timeout_s=cfg.train.rendezvous_timeout_s,
            collective_timeout_s=cfg.train.collective_timeout_s,
        )
    except StokerError as exc:
        print(f"stoker: rank {env.rank}: {exc}", file=sys.stderr, flush=True)
        announce_exit(run_dir, restart, env.rank, 1, ())
        return 1
    tracking = open_tracking(cfg, env, device, run_dir, args.config)
    status = "FAILED"

    def ending(code: int, silent: list[int] | None = None) -> int:
        # Said before the slow way out (MLflow, the process group): a rank SLURM kills
        # while it exits is no sign of a bad node (the batch script reads this).
        announce_exit(run_dir, restart, env.rank, code, silent or ())
        return code

    def frozen_peers() -> list[int]:
        # A peer killed outright ends the wait at once (srun, or the closed socket):
        # silent for a heartbeat or two. One silent for half the collective's timeout
        # froze while this rank waited on it.
        if not cfg.train.hang_timeout_s:
            return []  # no heartbeats
        silent_s = max(cfg.train.collective_timeout_s / 2,
                       3 * interval_for(cfg.train.hang_timeout_s))  # fmt: skip
        return [r for r in silent_ranks(run_dir, restart, env.world_size, silent_s)
                if r != env.rank]  # fmt: skip

    try:
        mesh = dist_env.data_parallel_mesh(env, device, cfg.train.sharding)
        trainer = Trainer(
            cfg,
            env,
            device,
            run_dir=run_dir,
            sink=tracking,
            mesh=mesh,
            mlflow_run_id=tracking.run_id,
            stop=stop,
        )
        trainer.build()
        if env.is_main:  # the data lineage, now that the loaders made any synthetic set
            record_lineage(tracking, cfg.data, trainer)
        outcome = trainer.train()
        trainer.checkpointer.close()
        status = outcome.status
        if env.is_main:
            print(f"{outcome.status.lower()} at step {outcome.step}", flush=True)
            if status == "FINISHED":  # the job's last start: its whole time account
                log_job_time(tracking, run_dir, outcome.step)
        return ending(outcome.exit_code)
    except (StokerError, KernelBackendError) as exc:
        # The kernels know nothing of stoker; their user errors read the same.
        print(f"stoker: rank {env.rank}: {exc}", file=sys.stderr, flush=True)
        return ending(1)
    except Exception as exc:
        if hang_reported(run_dir, restart):
            # A peer exited on the watchdog's report: that is this rank's failure too.
            print(f"stoker: rank {env.rank}: stopped by the hang watchdog "
                  "(heartbeat/…/hang.json)", file=sys.stderr, flush=True)  # fmt: skip
            return ending(EXIT_HANG)
        traceback.print_exc()
        if dist_env.lost_peer(exc):
            # Not this rank's bug: the batch script may start the job again (job.max_restarts).
            print(f"stoker: rank {env.rank}: a collective lost a peer (killed, frozen, or its "
                  f"node lost; train.collective_timeout_s={cfg.train.collective_timeout_s:g}); "
                  f"exit {EXIT_PEER_LOST}", file=sys.stderr, flush=True)  # fmt: skip
            flight_recorder.dump(env.rank)
            return ending(EXIT_PEER_LOST, frozen_peers())
        ending(1)  # Python's exit status for the exception raised on
        raise
    finally:
        tracking.close(None if status == "REQUEUE" else status)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        # Python's exit restores SIGUSR2's default action, which would kill a rank that
        # has finished (exit 0) when a stop comes while it exits: the job would fail.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
