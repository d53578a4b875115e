"""`stoker check`: what a job of this experiment needs, checked before it is queued."""

from __future__ import annotations

from pathlib import Path

import typer


def check(
    args: list[str] = typer.Argument(
        None,
        metavar="EXP.yaml KEY=VALUE",
        help="Experiment file (default: the built-in experiment), then overrides.",
    ),
    as_json: bool = typer.Option(
        False, "--json", help='Print a JSON list of {"check", "status", "detail", "fix"}.'
    ),
    profile: Path = typer.Option(
        None, "--profile", help="Site profile to use instead of $STOKER_PROFILE / the default."
    ),
    no_profile: bool = typer.Option(False, "--no-profile", help="Ignore the site profile."),
) -> None:
    """Check an experiment before submitting it: the config, the model (its factory
    imported, its arguments, a forward on the meta device with the data's shapes), the
    data sets' manifests, the checkpoint root, the MLflow store.

    A config error stops at once (exit 2); else one line per check, ok or fail with
    the fix, and exit 1 when one failed. The model check imports torch in a child
    process (seconds).

    Example: stoker check my-exp.yaml model.args.width=256
    """
    from stoker.cli.config import split_experiment_args
    from stoker.cli.doctor import print_findings
    from stoker.cli.output import note, print_json
    from stoker.config import resolve_config
    from stoker.launcher.launch.experiment_check import check_experiment

    experiment, overrides = split_experiment_args(args or [])
    resolved = resolve_config(experiment, overrides, profile=profile, use_profile=not no_profile)
    findings = check_experiment(resolved)
    if as_json:
        print_json([f.as_dict() for f in findings])
    else:
        print_findings(findings)
    failed = sum(f.status == "fail" for f in findings)
    note(f"{len(findings)} checks: {failed} failed")
    if failed:
        raise typer.Exit(1)
