"""Your own training loop with stoker's guarantees.

Keep your loop; call these. For a script started by `stoker run -- python train.py`
(here) or `stoker submit EXP.yaml -- python train.py` (SLURM), on every rank:

    from stoker import job

    run = job.init()              # rank, world_size, local_rank, device, mesh, config;
                                  # every rank joined (or a named failure in 45 s)
    model = build().to(run.device)
    ...                           # shard it over run.mesh if you like (FSDP2 / HSDP);
                                  # with train.context_parallel, run.cp is the CP group
                                  # and stoker.model's attention/token_slice/cp_sum use it
    loader = run.loader()         # optional: stoker's resumable AV loader of data.*
    ckpt = run.checkpointer(model=model, optim=opt, loader=loader)
    start = ckpt.restore()        # steps done by the newest verified checkpoint, else 0
    batches = loader.batches()
    for step in range(start, run.config.train.steps):
        loss = model(next(batches)); loss.backward(); opt.step(); opt.zero_grad()
        done = step + 1
        run.log({"loss": loss.item()}, step=done)   # rank 0's, into the job's MLflow run
        if run.should_stop():     # preemption / time limit / requeue, agreed by all ranks
            ckpt.save(done, wait=True)
            run.exit_for_requeue()
        if ckpt.due(done):        # checkpoint.every
            ckpt.save(done)
    ckpt.save(run.config.train.steps, wait=True)
    run.finish()

What that gives the loop: verified async checkpoints that reshard onto another
number of ranks, with the loader's position and each rank's RNG (a requeued job
resumes bit-exactly); the job's MLflow run, spooled through outages, each step once
across requeues; the hang watchdog and straggler report (`should_stop()` is the step's
heartbeat and timing point); `stoker status` (step, loss, ETA), `stoker why`; exit
codes the batch script reads (75 requeue, 76 a lost peer, 124 a hang). An uncaught
exception ends the MLflow run FAILED. docs/bring-your-own.md compares it with the
built-in trainer, and examples/own_loop/train.py is a whole script.

Steps are counted as steps done: `save(n)` after n steps, and `restore()` returns n,
the index of the loop's next step. (Saving the index of the step just run would make
a resumed loop run that step twice.)
"""

from __future__ import annotations

from stoker.process.gc_pause import pause_collector, resume_collector

pause_collector()  # while the runtime imports (stoker/process/gc_pause.py)
try:
    from stoker.runtime.own_loop import Checkpoint, JobLoader, Run, init
finally:
    resume_collector(freeze=False)

__all__ = ["Checkpoint", "JobLoader", "Run", "init"]
