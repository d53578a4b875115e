"""`stoker run`: train on this machine, with the same launch as a SLURM job."""

from __future__ import annotations

from pathlib import Path

import typer


def run(
    args: list[str] = typer.Argument(
        None,
        metavar="[EXP.yaml] [KEY=VALUE ...] [-- CMD ...]",
        help="Experiment file (default: the built-in tiny experiment), overrides, and after "
        "`--` the command each rank runs (default: the training runtime).",
    ),
    nproc: int = typer.Option(
        0, "--nproc", min=0, help="Local ranks (default: one per GPU, 2 on a CPU machine)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help='Print {"job_id", "run_id", "run_dir", "state", ...} last.'
    ),
    profile: Path = typer.Option(None, "--profile", help="Site profile to use."),
    no_profile: bool = typer.Option(False, "--no-profile", help="Use no site profile."),
) -> None:
    """Train an experiment here: N local ranks, logs followed, MLflow recorded.

    With no file, trains the built-in tiny audio-video diffusion transformer on
    a synthetic data set made on first use under $STOKER_HOME. The ranks run as
    `stoker submit --local` runs them (same variables, run folder and ledger
    entry), so `stoker status`, `logs` and `why` work on it. After `--`, each rank
    runs your command instead, e.g. a script of your own loop using `stoker.job`.

    Examples: stoker run ; stoker run train.steps=50 ; stoker run exp.yaml --nproc 4 ;
    stoker run exp.yaml train.steps=40 -- python train.py
    """
    import json
    import sys

    from stoker.cli.config import split_experiment_args
    from stoker.cli.live_echo import LiveEcho
    from stoker.cli.output import note
    from stoker.cli.trailing import trailing_command
    from stoker.launcher.run_local import run_here

    experiment, overrides = split_experiment_args(args or [])
    echo = LiveEcho(sys.stdout)

    def say(message: str) -> None:
        echo.close()  # a message on stderr starts below the live line, not inside it
        note(message)

    try:
        result = run_here(
            experiment,
            overrides,
            nproc=nproc or None,
            command=trailing_command(),
            profile=profile,
            use_profile=not no_profile,
            say=say,
            echo=echo,
        )
    finally:
        echo.close()
    if result.diagnosis is not None:
        from stoker.cli.output import err
        from stoker.cli.why import print_diagnosis

        print_diagnosis(result.diagnosis, err())
    if as_json:
        print(json.dumps(result.as_json()))
    if result.exit_code:
        raise typer.Exit(result.exit_code)
