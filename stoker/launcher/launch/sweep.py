"""Sweep axes: `optim.lr=1e-4,3e-4 train.seed=1,2` → one override set per job-array task."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stoker.errors import StokerError

if TYPE_CHECKING:
    from stoker.config import ResolvedConfig
    from stoker.launcher.launch.submit import SubmitOptions, Submitted

MAX_TASKS = 10_000  # far below SLURM's MaxArraySize on any cluster we know; a typo guard


@dataclass(frozen=True)
class SweepPlan:
    fixed: list[str]  # overrides every task shares
    axes: dict[str, list[str]]  # key -> values, in the order given
    tasks: list[dict[str, str]]  # one {key: value} per array task, last axis fastest

    def overrides(self, index: int) -> list[str]:
        return [*self.fixed, *(f"{k}={v}" for k, v in self.tasks[index].items())]

    def describe(self, index: int) -> str:
        """Task `index` in words: `model.args.width=32 optim.lr=1e-4`."""
        return " ".join(f"{k}={v}" for k, v in self.tasks[index].items())


def _split_values(text: str) -> list[str]:
    """The values of an axis, split on its top-level commas: `1e-4,3e-4` → two values,
    `[0.9,0.95],[0.9,0.99]` → two lists; a comma inside brackets, braces or quotes
    belongs to its value (`[32,32]` stays one)."""
    values: list[str] = []
    depth, quote, start = 0, "", 0
    for index, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'" and text[start:index].rstrip()[-1:] in ("", "[", "{", ",", ":"):
            quote = char  # as in YAML, only where a scalar starts: `it's` holds no quote
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            values.append(text[start:index])
            start = index + 1
    return [*values, text[start:]]


def plan_sweep(args: Sequence[str]) -> SweepPlan:
    fixed: list[str] = []
    axes: dict[str, list[str]] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or not key:
            raise StokerError(
                f"sweep argument {arg!r} is not KEY=V1,V2,...",
                fix="e.g. `stoker sweep exp.yaml optim.lr=1e-4,3e-4 train.seed=1,2`",
            )
        values = _split_values(value)
        if len(values) == 1:
            fixed.append(arg)
            continue
        if "" in values:
            raise StokerError(
                f"sweep axis {arg!r} has an empty value", fix="remove the stray comma"
            )
        if key in axes:
            raise StokerError(f"sweep axis {key} is given twice", fix="give each key once")
        axes[key] = values
    if not axes:
        raise StokerError(
            "no sweep axis: give at least one KEY=V1,V2 with two or more values",
            fix="e.g. `stoker sweep exp.yaml optim.lr=1e-4,3e-4`; for one job use `stoker submit`",
        )
    combos = list(itertools.product(*axes.values()))
    if len(combos) > MAX_TASKS:
        raise StokerError(
            f"the sweep has {len(combos)} tasks, more than {MAX_TASKS}",
            fix="sweep fewer values per key",
        )
    tasks = [dict(zip(axes, combo, strict=True)) for combo in combos]
    return SweepPlan(fixed, axes, tasks)


def check_task_models(
    plan: SweepPlan, configs: Sequence[ResolvedConfig], options: SubmitOptions
) -> None:
    """Every task's model checked (stoker/launcher/launch/model_fit.py) before anything is
    written, a dry run included: one config per distinct model and data settings (a
    sweep over model.args.width checks each value, one over optim.lr once), all in one
    child process. A refusal names the task and its values. As `submit` decides: only
    for the training runtime, and not in a container (whose Python imports the model)."""
    from stoker.launcher.launch.model_fit import check_all_models_fit
    from stoker.launcher.launch.submit import task_command
    from stoker.protocol import runs_the_runtime

    if not runs_the_runtime(task_command(configs[0], options)) or configs[0].config.job.container:
        return
    first_of: dict[str, int] = {}
    for index, resolved in enumerate(configs):
        cfg = resolved.config
        first_of.setdefault(cfg.model.model_dump_json() + cfg.data.model_dump_json(), index)
    tasks = list(first_of.values())
    check_all_models_fit(
        [configs[i] for i in tasks],
        cwd=options.cwd,
        labels=[f"sweep task {i} ({plan.describe(i)})" for i in tasks],
    )


def submit_sweep(
    experiment: Path | None,
    args: Sequence[str],
    flags: Mapping[str, tuple[Any, str]],
    options: SubmitOptions,
    *,
    profile: Path | None,
    use_profile: bool,
) -> tuple[SweepPlan, Submitted]:
    """`stoker sweep` and `stoker.sweep`: the plan of `args` (axes KEY=V1,V2 and fixed
    KEY=V), one resolved config per task, every task's model checked unless
    `options.check` is false, then one job array (nothing with a dry run)."""
    from dataclasses import replace

    from stoker.config import resolve_config
    from stoker.launcher.launch.submit import submit

    plan = plan_sweep(args)
    configs = [
        resolve_config(
            experiment, plan.overrides(i), flags, profile=profile, use_profile=use_profile
        )
        for i in range(len(plan.tasks))
    ]
    if options.check:
        check_task_models(plan, configs, options)
    # Checked above, every task; submit() would check the first alone.
    result = submit(configs, replace(options, check=False), sweep_params=plan.tasks)
    return plan, result
