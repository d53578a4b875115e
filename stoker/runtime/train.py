"""The training entry point, as the SLURM template, `stoker submit --local` and
`stoker run` start it in every rank:

    python -m stoker.runtime.train --config RUN_DIR/config.yaml

One process per GPU (or CPU rank). It reads where it stands from the
launcher's variables (stoker/runtime/dist/dist_env.py), builds, trains, closes, and
exits 0 when done, 75 (requeue) after saving on a stop request, 143 when
terminated, 124 when the hang watchdog failed the job, 76 when a collective
lost a peer (a rank or node gone: the batch script may restart the job), 1 on
an error of its own.

With torchrun instead of the launcher:

    torchrun --nproc-per-node 2 -m stoker.runtime.train --config exp-frozen.yaml
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from pathlib import Path
from typing import NoReturn

from stoker.errors import StokerError
from stoker.process.gc_pause import pause_collector, resume_collector

# What the trainer's build and first step import on first use, imported while the
# collector is paused instead: the loader (PyAV, fsspec), the checkpointer (torch's DCP),
# torch._dynamo (FSDP2's DTensors and AdamW call torch's _disable_dynamo wrappers, which
# import it). 2-step runs of the built-in experiment: 5.4 -> 5.0 CPU-s for its 2 ranks.
IMPORTED_PAUSED = (
    "av",
    "fsspec",
    "torch._dynamo",
    "torch.distributed.checkpoint",
    "stoker.data.stream.loader",
    "stoker.runtime.job_checkpointer",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stoker.runtime.train")
    parser.add_argument("--config", required=True, type=Path, help="the frozen experiment YAML")
    args = parser.parse_args(argv)
    # The collector paused while torch, the runtime and mlflow import, the process group
    # joins and the tracking store opens; resumed before the model is built
    # (stoker/process/gc_pause.py).
    pause_collector()
    try:
        from stoker.runtime.stop_request import StopRequest

        # First: a stop asked for while torch imports must not kill the task (it saves
        # at the first step boundary instead).
        stop = StopRequest()
        stop.install(term=False)

        from stoker.model import set_context_parallel
        from stoker.runtime.dist.context_mesh import training_mesh
        from stoker.runtime.observe.data_lineage import record_lineage
        from stoker.runtime.observe.time_account import log_job_time
        from stoker.runtime.session import JobSession
        from stoker.runtime.trainer import Trainer

        for name in IMPORTED_PAUSED:
            # One this install lacks is one this run does not use (the GPU machine of
            # scripts/gpu-check has no PyAV): its own import says so where it is needed.
            with contextlib.suppress(ImportError):
                importlib.import_module(name)

        session = JobSession.start(args.config, stop)
        cfg, env = session.config, session.env
        try:
            session.join()
        except StokerError as exc:
            print(f"stoker: rank {env.rank}: {exc}", file=sys.stderr, flush=True)
            return session.announce(1)
        tracking = session.open_tracking()
    finally:
        resume_collector()
    status = "FAILED"
    try:
        train = cfg.train
        layout = training_mesh(
            env, session.device, train.sharding, train.context_parallel, train.ulysses_degree()
        )
        set_context_parallel(layout.cp)  # the models' attention and token shares
        trainer = Trainer(
            cfg,
            env,
            session.device,
            run_dir=session.run_dir,
            sink=tracking,
            mesh=layout.fsdp,
            mlflow_run_id=tracking.run_id,
            stop=stop,
            marks=session.marks,
            cp=layout.cp,
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
                log_job_time(tracking, session.run_dir, outcome.step)
        return session.announce(outcome.exit_code)
    except Exception as exc:
        return session.announce(session.exit_code_for(exc))
    finally:
        session.close(None if status == "REQUEUE" else status)


def run(argv: list[str] | None = None) -> NoReturn:
    """`python -m stoker.runtime.train`: main(), then the process ends with its code,
    past the interpreter's finalization. By then everything the job keeps is done: the
    exit announced, the MLflow run closed, checkpoints committed (or, after a failure,
    left without COMMIT.json). What finalization would still do is join threads and
    tear down objects that may wait on a lost peer: a rank that exited 76 while its
    async checkpoint save waited in a collective for a frozen rank stayed alive until
    the checkpoint group's 30-minute timeout (its step never ended, and the restart
    waited; tests/runtime/dist/test_exit_path.py), and gloo's threads torn down there
    aborted a rank now and then ("terminate called without an active exception")."""
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
