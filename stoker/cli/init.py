"""`stoker init`: write a commented example experiment (and site profile)."""

from __future__ import annotations

from pathlib import Path

import typer


def init(
    path: Path = typer.Argument(
        Path("experiment.yaml"), help="Experiment file to write.", show_default=True
    ),
    profile: bool = typer.Option(
        False,
        "--profile",
        help="Also write a commented site profile ($STOKER_PROFILE or "
        "~/.config/stoker/profile.yaml).",
    ),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite existing files."),
) -> None:
    """Write a commented example experiment file, every key at its default.

    Example: stoker init my-exp.yaml --profile
    """
    import os

    from stoker.atomic_write import write_text_atomic
    from stoker.cli.output import note
    from stoker.config.render import render_experiment_template, render_profile_template
    from stoker.errors import StokerError
    from stoker.home import default_profile_path

    targets = [(path, render_experiment_template(), "experiment")]
    if profile:
        env_path = os.environ.get("STOKER_PROFILE")
        profile_path = Path(env_path).expanduser() if env_path else default_profile_path()
        targets.append((profile_path, render_profile_template(), "site profile"))
    existing = [str(p) for p, _, _ in targets if p.exists()]
    if existing and not force:
        raise StokerError(
            f"{', '.join(existing)} already exists; nothing was written",
            fix="choose another path, or pass --force to overwrite",
        )
    for target, text, what in targets:
        write_text_atomic(target, text)
        note(f"wrote {what} {target}")
    note(f"next: stoker config show {path}")
