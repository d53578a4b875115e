"""Every `stoker` command: where it is defined and the first sentence of its help, in
the order `--help` lists them. A group's help lists its commands from here, so
`stoker --help` imports no command's module (stoker/cli/lazy_group.py);
tests/cli/test_command_table.py checks each line against the command it names.

Each group's table, by the group's name ("stoker" for the root): command name ->
(where: "module:attribute", a command's function or a group's typer.Typer;
 the first sentence of its help: its docstring's, or the group's `help=`).
"""

from __future__ import annotations

COMMANDS: dict[str, dict[str, tuple[str, str]]] = {
    # In the order of a user's day: write, check, submit, watch, diagnose, control,
    # probe; typer lists a group's commands before its sub-groups.
    "stoker": {
        "init": (
            "stoker.cli.init:init",
            "Write a commented example experiment file, every key at its default; or, with "
            "--plugin NAME, a model package of your own to start from.",
        ),
        "run": (
            "stoker.cli.run:run",
            "Train an experiment here: N local ranks, logs followed, MLflow recorded.",
        ),
        "check": (
            "stoker.cli.check:check",
            "Check an experiment before submitting it: the config, the model (its factory "
            "imported, its arguments, a forward on the meta device with the data's shapes), "
            "the data sets' manifests, the checkpoint root, the MLflow store.",
        ),
        "plan": (
            "stoker.cli.plan:plan",
            "Plan an experiment's parallelism and memory before it is queued: on this "
            "machine, without a GPU, each candidate (FSDP2 or HSDP, activation checkpointing "
            "none / selective / full, bf16 or fp32, micro-batch x gradient accumulation "
            "reaching the global batch) is traced on fake tensors as one rank of the target "
            "would run it, and timed by a roofline of its FLOPs and collectives.",
        ),
        "submit": (
            "stoker.cli.submit:submit",
            "Submit an experiment, or any command, as a SLURM job and return at once.",
        ),
        "sweep": (
            "stoker.cli.sweep:sweep",
            "Submit every combination of the sweep axes as one job array.",
        ),
        "status": (
            "stoker.cli.status:status",
            "Show state, nodes, elapsed time, restarts, progress and MLflow run of your jobs.",
        ),
        "logs": (
            "stoker.cli.logs:logs",
            "Print the logs of every rank of a job, each line prefixed with its rank.",
        ),
        "why": (
            "stoker.cli.why:why",
            "Say why a job failed, timed out, hung, ran out of memory, was cancelled or is "
            "still pending: the cause in one line, the evidence, and the fix.",
        ),
        "ui": (
            "stoker.cli.ui:ui",
            "Start the MLflow UI on stoker's tracking store (Ctrl-C stops it).",
        ),
        "cancel": (
            "stoker.cli.control:cancel",
            "Cancel jobs stoker submitted (SLURM or --local).",
        ),
        "requeue": (
            "stoker.cli.control:requeue",
            "Requeue jobs: they stop and start again, resuming from their last checkpoint.",
        ),
        "sample": (
            "stoker.cli.sample:sample",
            "Draw clips from a checkpoint of any world size: an mp4 (H.264 + AAC) or a WAV "
            "per seed, a contact sheet and samples.json, into OUT.",
        ),
        "insights": (
            "stoker.cli.insights:insights",
            "Goodput, the hours lost by cause, failure classes and failing nodes over your jobs.",
        ),
        "doctor": (
            "stoker.cli.doctor:doctor",
            "Check that jobs can be submitted from here and will run: SLURM (version, "
            "controller, partitions, GRES, accounting, requeue, containers), the MLflow "
            "store, the run folder, GPUs and NCCL variables.",
        ),
        "config": (
            "stoker.cli.config:app",
            "Inspect experiment configs: resolved values and where they came from.",
        ),
        "data": (
            "stoker.cli.data:app",
            "AV data sets: synthesize, pack media into shards, encode latents, inspect, "
            "benchmark the loader.",
        ),
        "bench": (
            "stoker.cli.bench:app",
            "Benchmarks: Triton kernels against torch eager, torch.compile and Liger-Kernel.",
        ),
        "ckpt": (
            "stoker.cli.ckpt:app",
            "Checkpoints: list, verify against COMMIT.json, export weights, prune old ones.",
        ),
    },
    "data": {
        "synth": (
            "stoker.cli.data_synth:synth",
            "Write a synthetic AV data set a model can learn from, for demos and tests.",
        ),
        "pack": (
            "stoker.cli.data_pack:pack",
            "Pack a folder of video and audio files into WebDataset shards with indexes and "
            "a manifest.",
        ),
        "encode": (
            "stoker.cli.data_encode:encode",
            "Encode a data set with your encoder (a video VAE, an audio codec, a text "
            "encoder) into a latent data set that training streams without decoding.",
        ),
        "inspect": (
            "stoker.cli.data_inspect:inspect",
            "Shards, samples, durations, codecs, sizes and rates of a data set, and its "
            "digest; a few frames as PNG, into --frames-dir or a new temporary folder (never "
            "the current folder unasked), whose name it prints.",
        ),
        "bench": (
            "stoker.cli.data_bench:bench",
            "Time the streaming loader: samples/s, frames/s per core, bytes/s, headroom.",
        ),
    },
    "bench": {
        "kernels": (
            "stoker.cli.bench_kernels:kernels",
            "Time every kernel in fwd, bwd and fwd+bwd against its baselines.",
        ),
        "step": (
            "stoker.cli.bench_step:step",
            "Time full training steps (forward, backward, AdamW) in bf16 autocast.",
        ),
    },
    "ckpt": {
        "ls": (
            "stoker.cli.ckpt_ls:ls",
            "Every step-<N> folder under PATH, newest first: step, committed, bytes, path.",
        ),
        "verify": (
            "stoker.cli.ckpt_verify:verify",
            "Check every file listed in COMMIT.json: it exists, with its size and sha256.",
        ),
        "export": (
            "stoker.cli.ckpt_export:export",
            "Write the model weights of a committed checkpoint as one file, unsharded.",
        ),
        "prune": (
            "stoker.cli.ckpt_prune:prune",
            "Delete old checkpoints under PATH: all but the newest --keep-last verified ones "
            "and the multiples of --keep-every, as a running job does after each save.",
        ),
    },
}
