"""Rendering the sbatch script from a job spec and a Jinja2 template.

Every value a template prints with `{{ ... }}` goes through `_shell_finalize`, which
quotes it for bash: a job name, an env value, a path or a command argument that
holds `$(...)`, backticks, quotes, `;` or a newline reaches the script as inert
text. That holds for a user's own template too. Only `Shell` values (the
`job.setup` lines, lines the renderer built itself) are printed as written.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.errors import StokerError
from stoker.launcher.script.spec import LaunchSpec
from stoker.protocol import EXIT_PEER_LOST, EXIT_REQUEUE, runs_the_runtime
from stoker.redact import printable_line
from stoker.version import __version__

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "slurm_templates"
BUILTIN_TEMPLATES = ("default", "pyxis", "apptainer")
CONTAINER_TEMPLATES = ("pyxis", "apptainer")

# Defaults for every task; an exported variable of the same name wins, and so does job.env.
ENV_DEFAULTS: tuple[tuple[str, str], ...] = (
    # Task output reaches the rank logs as it is written, so `stoker logs -f` is live.
    ("PYTHONUNBUFFERED", "1"),
    ("NCCL_DEBUG", "WARN"),
    # A failed collective aborts the process instead of hanging until the time limit.
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"),
)


class Shell(str):
    """Text that is shell on purpose: printed into the script as written."""

    __slots__ = ()


@dataclass(frozen=True)
class Directive:
    """One `#SBATCH` option and the source of its value (for `--explain`)."""

    option: str
    source: str

    def render(self, explain: bool) -> str:
        line = f"#SBATCH {self.option}"
        # A source names a file or an override as given: keep it on this comment line.
        return f"{line}  # {printable_line(self.source)}" if explain else line


@dataclass(frozen=True)
class RenderedScript:
    text: str
    template: str
    directives: tuple[Directive, ...]


def _shell_finalize(value: Any) -> Any:
    if isinstance(value, Shell):
        return value
    if value is None:
        return "''"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list | tuple):
        return " ".join(
            item if isinstance(item, Shell) else shlex.quote(str(item)) for item in value
        )
    if isinstance(value, Path):
        return shlex.quote(str(value))
    if isinstance(value, str):
        return shlex.quote(value)
    from jinja2 import Undefined

    if isinstance(value, Undefined):
        return str(value)  # StrictUndefined raises here, naming the missing value
    raise TypeError(f"template value of type {type(value).__name__} cannot be put in a script")


def _directive_value(value: str) -> str:
    # sbatch strips shell quotes from #SBATCH values. A newline would end the #SBATCH
    # line and make the rest a command of the script (the config refuses them first).
    if re.search(r"[\x00-\x1f\x7f]", value):
        raise StokerError(
            f"#SBATCH value {printable_line(value)!r} holds a control character",
            fix="use one line of text",
        )
    return shlex.quote(value)


def sbatch_directives(spec: LaunchSpec) -> list[Directive]:
    """The `#SBATCH` options of a job, each with where its value came from."""
    job = spec.config.job
    src = spec.source_of
    lines: list[Directive] = [
        Directive(f"--job-name={_directive_value(job.name)}", src("job.name")),
        Directive(
            f"--nodes={job.nodes + job.spare_nodes}",
            src("job.nodes")
            if not job.spare_nodes
            else f"job.nodes ({src('job.nodes')}) + job.spare_nodes ({src('job.spare_nodes')})",
        ),
        Directive(
            f"--ntasks-per-node={job.tasks_per_node}",
            src("job.ntasks_per_node")
            if job.ntasks_per_node is not None
            else f"one per GPU: job.gpus_per_node ({src('job.gpus_per_node')})",
        ),
    ]
    if job.gpus_per_node:
        lines.append(Directive(f"--gpus-per-node={job.gpus_per_node}", src("job.gpus_per_node")))
    lines.append(Directive(f"--cpus-per-task={job.cpus_per_task}", src("job.cpus_per_task")))
    if job.mem is not None:
        lines.append(Directive(f"--mem={job.mem}", src("job.mem")))
    lines.append(Directive(f"--time={job.time}", src("job.time")))
    for key in ("partition", "account", "qos", "constraint", "exclude"):
        value = getattr(job, key)
        if value is not None:
            lines.append(Directive(f"--{key}={_directive_value(value)}", src(f"job.{key}")))
    if job.exclusive:
        lines.append(Directive("--exclusive", src("job.exclusive")))
    if spec.array_size:
        throttle = f"%{spec.max_parallel}" if spec.max_parallel else ""
        lines.append(
            Directive(
                f"--array=0-{spec.array_size - 1}{throttle}",
                f"sweep: {spec.array_size} tasks"
                + (f", --max-parallel {spec.max_parallel}" if spec.max_parallel else ""),
            )
        )
    if spec.after:
        lines.append(Directive(f"--dependency=afterok:{spec.after}", "flag --after"))
    # sbatch reads '%' in file names as a pattern (%j, %a ...); '%%' is a literal '%'.
    run_dir = str(spec.run_dir).replace("%", "%%")
    if spec.array_size:
        batch_log = f"{run_dir}/tasks/%a/logs/batch.log"
    else:
        batch_log = f"{run_dir}/logs/batch.log"
    lines += [
        Directive(f"--output={_directive_value(batch_log)}", "stoker: the run folder"),
        # Requeued jobs append to their logs instead of truncating them.
        Directive("--open-mode=append", "stoker: logs survive requeues"),
        Directive("--requeue", "stoker: preempted or timed-out jobs resume"),
        # A node going down would end the whole job; the script restarts without it.
        Directive("--no-kill", "stoker: a failed node is replaced inside the job"),
        Directive(
            f"--signal=B:USR2@{spec.grace_seconds}",
            f"job.stop_grace ({src('job.stop_grace')})",
        ),
    ]
    return lines


def template_name(spec: LaunchSpec) -> str:
    """The template a job uses; a container image needs a container template."""
    job = spec.config.job
    name = job.template
    if job.container and name == "default":
        raise StokerError(
            f"job.container is {job.container!r} ({spec.source_of('job.container')}) but "
            f"job.template is 'default' ({spec.source_of('job.template')}), "
            "which runs no container",
            fix="set job.template to pyxis (enroot) or apptainer, e.g. in the site profile",
        )
    if name in CONTAINER_TEMPLATES and not job.container:
        raise StokerError(
            f"job.template is {name!r} ({spec.source_of('job.template')}) but job.container "
            "is not set",
            fix="set job.container to an image (job.container=nvcr.io/nvidia/pytorch:25.01-py3)",
        )
    return name


def render_sbatch(spec: LaunchSpec, *, explain: bool = False) -> RenderedScript:
    """The exact script `sbatch` gets. Raises StokerError for an unusable template."""
    import jinja2

    name = template_name(spec)
    if name in BUILTIN_TEMPLATES:
        search = [str(TEMPLATES_DIR)]
        file_name = f"{name}.sbatch.j2"
        label = name
    else:
        path = Path(name).expanduser()
        if not path.is_absolute() and spec.experiment_dir is not None:
            path = spec.experiment_dir / path
        if not path.is_file():
            raise StokerError(
                f"job.template {name!r} ({spec.source_of('job.template')}) is neither a "
                f"built-in template ({', '.join(BUILTIN_TEMPLATES)}) nor a file ({path})",
                fix="name a built-in template or the path of a Jinja2 file "
                "(relative paths are relative to the experiment file)",
            )
        # A user's template may `{% extends "base.sbatch.j2" %}` and override `launch`.
        search = [str(path.parent), str(TEMPLATES_DIR)]
        file_name = path.name
        label = str(path)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(search),
        undefined=jinja2.StrictUndefined,
        finalize=_shell_finalize,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    directives = sbatch_directives(spec)
    try:
        template = env.get_template(file_name)
        text = template.render(_context(spec, directives, explain))
    except jinja2.TemplateError as exc:
        where = f"{getattr(exc, 'filename', None) or label}"
        line = getattr(exc, "lineno", None)
        raise StokerError(
            f"sbatch template {where}{f':{line}' if line else ''}: {exc}",
            fix="fix the template; the names it may use are listed in docs/user-guide.md",
        ) from exc
    if spec.config.job.spare_nodes and '"${STOKER_STEP[@]}"' not in text:
        raise StokerError(
            f"job.spare_nodes is {spec.config.job.spare_nodes} "
            f"({spec.source_of('job.spare_nodes')}) but template {label}'s launch block "
            'starts srun without "${STOKER_STEP[@]}": its step would run on the spares too',
            fix='start the step with srun "${STOKER_STEP[@]}" ... (docs/jobs.md, Templates), '
            "or set job.spare_nodes to 0",
        )
    # The setup block alone first: an unclosed quote there could pair with a quote
    # further down and still give a script that parses.
    if spec.config.job.setup:
        _check_syntax("\n".join(spec.config.job.setup) + "\n", "job.setup lines")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        near = printable_line(exc.object[max(0, exc.start - 40) : exc.end])
        raise StokerError(
            f"the script would hold bytes that are not UTF-8 text (at ...{near}): a file "
            "name, a folder or an argument in another encoding",
            fix="rename it, or run from a folder whose path is UTF-8",
        ) from None
    _check_syntax(text, f"the script rendered from template {label}")
    return RenderedScript(text, label, tuple(directives))


def _context(spec: LaunchSpec, directives: Sequence[Directive], explain: bool) -> dict[str, Any]:
    job = spec.config.job
    env_defaults = [
        Shell(f'export {name}="${{{name}-{_in_double_quotes(value)}}}"')
        for name, value in ENV_DEFAULTS
        if name not in job.env
    ]
    mounts = [*job.mounts, f"{spec.run_dir}:{spec.run_dir}"]
    return {
        "version": __version__,
        "directives": [{"line": Shell(d.render(explain))} for d in directives],
        "run_dir": spec.run_dir,
        "run_dir_comment": Shell(re.sub(r"[\x00-\x1f]", "?", str(spec.run_dir))),
        "array_size": spec.array_size or 0,
        "max_requeues": job.max_requeues,
        "max_restarts": job.max_restarts,
        "step_nodes": job.nodes,
        "tasks_per_node": job.tasks_per_node,
        "exit_requeue": EXIT_REQUEUE,
        "exit_peer_lost": EXIT_PEER_LOST,
        "grace": spec.grace_seconds,
        "env_defaults": env_defaults,
        "env": sorted(job.env.items()),
        "pass_env": list(job.pass_env),
        "tracking_uri": spec.tracking_uri,
        "mlflow_run_ids": list(spec.mlflow_run_ids),
        "parent_run_id": spec.parent_run_id,
        "stoker_python": spec.stoker_python,
        "setup": [Shell(line) for line in job.setup],
        "workdir": spec.workdir,
        "command": list(spec.command),
        "runtime_task": runs_the_runtime(list(spec.command)),
        "container": job.container,
        "container_mounts": ",".join(mounts),
        "gpus_per_node": job.gpus_per_node,
        "job": job,
    }


def _in_double_quotes(value: str) -> str:
    # Inside "${NAME-value}": escape what double quotes would expand.
    return re.sub(r'([\\"$`])', r"\\\1", value)


def _check_syntax(text: str, label: str) -> None:
    """`bash -n`: a template or setup line that breaks the script fails here, not on the cluster."""
    result = subprocess.run(
        ["bash", "-n"], input=text, capture_output=True, text=True, timeout=30, check=False
    )
    if result.returncode != 0:
        raise StokerError(
            f"{label} is not valid bash:\n{result.stderr.strip()}",
            fix="check the job.setup lines and the template; "
            "`stoker submit --dry-run` prints the script",
        )
