"""A job's name where no source named it: from its command (`stoker submit -- python
train.py` is `train` in squeue, its run folder and MLflow), else from its experiment
file (`sound-small.yaml` is `sound-small`) or, without one, from a model of the user's
own (`model.arch=own_model.denoiser:build` is `own_model`), not job.name's default."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import PurePosixPath

from stoker.config import ResolvedConfig
from stoker.config.resolve import DEFAULT, Source

# Programs that run the one named after them: the job is named after that one.
_LAUNCHERS = re.compile(r"^(python[0-9.]*|bash|sh|zsh|env|torchrun|uv|uvx)$")
COMMAND_SOURCE = Source("flag", "the command after --")
EXPERIMENT_SOURCE = Source("default", "the experiment file's name")
MODEL_SOURCE = Source("default", "the package of model.arch")


def name_from_command(argv: Sequence[str]) -> str | None:
    """`python train.py` -> train, `torchrun --nproc-per-node 8 -m pkg.fit` -> fit,
    `./run.sh` -> run, `sleep 60` -> sleep, `python -c ...` -> python; None where
    nothing usable is left."""
    words = [str(word) for word in argv]
    for word in words:
        if word in ("-m", "-c"):
            break
        # The script a command runs names it, past the values of options before it
        # (`python -X dev train.py`, `uv run python fit.py`, `torchrun --rdzv-backend c10d x.py`).
        if word.endswith((".py", ".sh")) and not word.startswith("-") and "=" not in word:
            return _cleaned(PurePosixPath(word).stem)
    name = None
    for index, word in enumerate(words):
        if word == "-m" and index + 1 < len(words):
            name = words[index + 1].rsplit(".", 1)[-1]
            break
        if word == "-c":
            break  # inline code: named after its interpreter
        # Options, their numbers (`--nproc-per-node 8`) and VAR=value are no program.
        if word.startswith("-") or word.isdigit() or "=" in word:
            continue
        base = PurePosixPath(word).name
        if _LAUNCHERS.match(base):
            name = name or base
            continue
        name = PurePosixPath(base).stem or base
        break
    return _cleaned(name or "")


def _cleaned(name: str) -> str | None:
    """`name` as a job name: letters, digits, '.', '_', '-'; None when nothing is left."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", name).strip("-.")[:64] or None


def named_after_command(
    configs: Sequence[ResolvedConfig], command: Sequence[str]
) -> tuple[ResolvedConfig, ...]:
    """`configs` with job.name taken from `command` where job.name is left at its
    default (a profile, file, override or --name wins)."""
    name = name_from_command(command)
    if name is None or configs[0].source_of(("job", "name")) is not DEFAULT:
        return tuple(configs)
    return _renamed(configs, name, COMMAND_SOURCE)


def _renamed(
    configs: Sequence[ResolvedConfig], name: str, source: Source
) -> tuple[ResolvedConfig, ...]:
    """`configs` with job.name `name`, said to come from `source`."""
    renamed = []
    for resolved in configs:
        job = resolved.config.job.model_copy(update={"name": name})
        renamed.append(
            dataclasses.replace(
                resolved,
                config=resolved.config.model_copy(update={"job": job}),
                sources={**resolved.sources, ("job", "name"): source},
            )
        )
    return tuple(renamed)


def model_package(arch: str) -> str | None:
    """The top package of a model.arch import path (`own_model.denoiser:build` ->
    `own_model`); None for a built-in model."""
    return arch.split(":", 1)[0].split(".", 1)[0] if ":" in arch else None


def named_after_experiment(configs: Sequence[ResolvedConfig]) -> tuple[ResolvedConfig, ...]:
    """`configs` with job.name taken from the experiment file's name, or without a file
    from the package of a model.arch the user set, where job.name is still at its default
    (a profile, file, override, --name or the command wins)."""
    first = configs[0]
    if first.source_of(("job", "name")) is not DEFAULT:
        return tuple(configs)
    if first.experiment is not None:
        name, source = first.experiment.stem, EXPERIMENT_SOURCE
    elif first.source_of(("model", "arch")) is not DEFAULT:
        name, source = model_package(first.config.model.arch) or "", MODEL_SOURCE
    else:
        return tuple(configs)
    cleaned = _cleaned(name)
    return _renamed(configs, cleaned, source) if cleaned else tuple(configs)
