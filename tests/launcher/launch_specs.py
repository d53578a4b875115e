"""Launch specs for the renderer's tests: the golden job's run folder, command and store,
with any config override, flag or field changed."""

from __future__ import annotations

from pathlib import Path

from stoker.config import resolve_config
from stoker.launcher.script.spec import LaunchSpec


def make_spec(
    overrides: list[str] | None = None,
    flags: dict[str, tuple[object, str]] | None = None,
    command: list[str] | None = None,
    experiment: Path | None = None,
    **kwargs: object,
) -> LaunchSpec:
    resolved = resolve_config(experiment, overrides or [], flags or {}, use_profile=False)
    fields: dict[str, object] = {
        "run_dir": Path("/shared/stoker/runs/golden-20261121-000000-abcd"),
        "command": command or ["python", "train.py", "--lr", "3e-4"],
        "workdir": Path("/shared/stoker/runs/golden-20261121-000000-abcd/code"),
        "tracking_uri": "sqlite:////shared/stoker/mlflow/mlflow.db",
        "mlflow_run_ids": ["0123456789abcdef0123456789abcdef"],
        "stoker_python": "/shared/stoker/.venv/bin/python",
        **kwargs,
    }
    return LaunchSpec(resolved, **fields)  # type: ignore[arg-type]
