"""Can the model be built for the data, and does its forward keep the contract? Asked
before `stoker run` writes a data set or starts a rank: the runtime builds the model
on the meta device and runs its forward on a meta batch, in a child process
(stoker/runtime/preflight.py; it imports torch, which this layer does not), and a
refusal becomes a StokerError naming the setting, where its value came from, and the
fix. A sweep's tasks are checked in one child process. A pass is kept while the
settings and every file the check imported or read stay the same, and not checked again
(stoker/launcher/launch/model_check_cache.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from stoker.config import ResolvedConfig, freeze_config
from stoker.errors import StokerError
from stoker.launcher.launch.model_check_cache import check_key, passed_before, remember
from stoker.protocol import PREFLIGHT_MODULE, PREFLIGHT_REFUSED

TIMEOUT_S = 300  # importing torch on a loaded login node


def check_model_fits(
    resolved: ResolvedConfig,
    python: str = sys.executable,
    say: Callable[[str], None] | None = None,
    cwd: Path | None = None,
) -> None:
    """Raise StokerError when the model `resolved` names cannot be built for its data
    or its forward breaks the contract; `say` gets the check's notes (a forward that
    could not run on the meta device). `cwd`: where the job's code is (a plugin model
    imports from there)."""
    check_all_models_fit([resolved], python, say, cwd)


def check_all_models_fit(
    configs: Sequence[ResolvedConfig],
    python: str = sys.executable,
    say: Callable[[str], None] | None = None,
    cwd: Path | None = None,
    labels: Sequence[str] = (),
) -> None:
    """`check_model_fits` for several configs (a sweep's tasks) in one child process:
    torch is imported once, not once a config. The first refusal is raised, named by
    its config's label (`labels[i]` for `configs[i]`) when given. The child has the
    first config's job.env (a job array's tasks share their job.* keys)."""
    # The job's environment (job.env: a PYTHONPATH where the model is installed).
    env = {**os.environ, **configs[0].config.job.env}
    key = check_key(configs, python, env)
    notes = passed_before(key, cwd or Path.cwd()) if key is not None else None
    if notes is None:
        notes = _check_in_child(configs, python, cwd, env, labels, key)
    if say is not None:
        for note in notes:
            say(note)


def _check_in_child(
    configs: Sequence[ResolvedConfig],
    python: str,
    cwd: Path | None,
    env: dict[str, str],
    labels: Sequence[str],
    key: str | None,
) -> list[str]:
    """The check in a child process: its notes when every model passed (kept under
    `key`, with the files it imported or read); a StokerError naming the first refusal."""
    with tempfile.TemporaryDirectory(prefix="stoker-preflight-") as tmp:
        imported = Path(tmp) / "imported.json"
        argv = [python, "-m", PREFLIGHT_MODULE, "--imported", str(imported)]
        for index, resolved in enumerate(configs):
            frozen = Path(tmp) / f"config-{index}.yaml"
            frozen.write_text(freeze_config(resolved))
            argv += ["--config", str(frozen)]
        try:
            result = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
                cwd=cwd,
                env=env,
            )
        except subprocess.TimeoutExpired as exc:
            raise StokerError(
                f"the model check ({' '.join(argv[1:3])}) took more than {TIMEOUT_S} s",
                fix="try again when the machine is less busy",
            ) from exc
        if result.returncode == 0:
            notes = [
                line.removeprefix("stoker: ")
                for line in result.stderr.splitlines()
                if line.startswith("stoker: ")
            ]
            if key is not None:
                with contextlib.suppress(OSError, ValueError):
                    remember(key, json.loads(imported.read_text()), notes)
            return notes
    if result.returncode == PREFLIGHT_REFUSED:
        refusal = json.loads(result.stdout.strip().splitlines()[-1])
        setting, index = refusal["key"], refusal["index"]
        source = configs[index].source_of(tuple(setting.split(".")))
        label = f"{labels[index]}: " if labels else ""
        raise StokerError(
            f"{label}{refusal['message']} ({setting} from {source}); nothing was started",
            fix=refusal["fix"],
        )
    raise StokerError(
        f"the model check ({' '.join(argv[:3])}) failed with exit {result.returncode}: "
        f"{result.stderr.strip()[-2000:]}",
        fix="fix the error above (nothing is started or queued until the model builds), "
        "or skip the check with --no-check",
    )
