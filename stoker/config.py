"""The experiment schema, and how an experiment is resolved from its sources.

One typed schema; every field carries a one-line docstring that `stoker config
show`, `stoker init` and docs/config.md use, so code and docs cannot drift.

Precedence, lowest first: built-in defaults < site profile < experiment YAML <
`a.b=c` overrides < explicit command-line flags. `resolve_config` records where
each value came from; a job reads only the frozen YAML written by
`write_frozen`, never the sources.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from stoker import __version__
from stoker.atomic_write import write_text_atomic
from stoker.config_keys import (
    KeyPath,
    Problem,
    describe_expected,
    dotted,
    field_at,
    is_free_mapping,
    is_section,
    leaf_paths,
    suggest_keys,
)
from stoker.errors import StokerError
from stoker.overrides import parse_override, shown_override
from stoker.profile import PROFILE_KEYS, find_profile
from stoker.redact import (
    has_url_password,
    hide_url_passwords,
    one_line,
    redact_mapping,
    secret_assignments,
    secret_word,
)
from stoker.yaml_source import dump_yaml, read_yaml_mapping

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_SLURM_TIME = re.compile(
    r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED)$"
)
_SLURM_MEM = re.compile(r"^\d+[KMGT]?$")


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        populate_by_name=True,
        validate_default=True,
        # `NCCL_IB_DISABLE: 1` in YAML is an int; environment values and names are text.
        coerce_numbers_to_str=True,
    )


class JobConfig(Section):
    """What SLURM allocates and how the job starts."""

    name: str = "stoker-tiny"
    """Job name in squeue and the run folder; letters, digits, '.', '_', '-'."""
    nodes: Annotated[int, Field(ge=1, le=10_000)] = 1
    """Number of nodes to allocate."""
    ntasks_per_node: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Tasks (ranks) per node; null means one per GPU, or 1 without GPUs."""
    gpus_per_node: Annotated[int, Field(ge=0, le=64)] = 0
    """GPUs per node (sbatch --gpus-per-node); 0 runs on CPUs."""
    cpus_per_task: Annotated[int, Field(ge=1, le=4096)] = 1
    """CPU cores per task, for data-loading workers and the main process."""
    mem: str | None = None
    """Memory per node, e.g. 64G; null takes the partition's default, 0 the whole node."""
    time: str = "01:00:00"
    """Time limit, in a form sbatch accepts: MM, HH:MM:SS or D-HH:MM:SS."""
    partition: str | None = None
    """SLURM partition; null uses the cluster's default partition."""
    account: str | None = None
    """SLURM account charged for the job."""
    qos: str | None = None
    """SLURM quality of service."""
    constraint: str | None = None
    """Node features required (sbatch --constraint), e.g. 'h100&ib'."""
    exclusive: bool = False
    """Allocate whole nodes, sharing them with no other job."""
    container: str | None = None
    """Container image to run the job in; null runs in the current Python environment."""
    env: dict[str, str] = {}
    """Environment variables set for every task (merged with the profile's); no secrets."""
    pass_env: list[str] = []
    """Secrets and other variables passed by name from the submitting shell, e.g. [HF_TOKEN]."""
    setup: list[str] = []
    """Shell lines run before the training command, e.g. 'module load cuda'."""
    template: str = "default"
    """sbatch template: a built-in name or the path of a Jinja2 file."""
    mounts: list[str] = []
    """Container mounts 'host_path:container_path[:ro]' (pyxis and apptainer templates)."""
    max_requeues: Annotated[int, Field(ge=0, le=1000)] = 3
    """How many times a preempted or timed-out job is requeued before it is left failed."""
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 1
    """Restarts after a lost rank or node or a hang, without the failed node; not after errors."""
    stop_grace: Annotated[int, Field(ge=10, le=3600)] = 120
    """Seconds before the time limit at which the job is told to save and stop."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(
                "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        return value

    @field_validator("partition", "account", "qos")
    @classmethod
    def _check_slurm_name(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_NAME.fullmatch(value):
            raise ValueError("use letters, digits, '.', '_' or '-' (a SLURM name)")
        return value

    @field_validator("time", mode="before")
    @classmethod
    def _minutes_as_time(cls, value: Any) -> Any:
        # `time: 30` in YAML is an int; sbatch reads a bare number as minutes.
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("time")
    @classmethod
    def _check_time(cls, value: str) -> str:
        if not _SLURM_TIME.fullmatch(value):
            raise ValueError("use MM, HH:MM:SS or D-HH:MM:SS, e.g. 04:00:00 or 2-00:00:00")
        return value

    @field_validator("mem")
    @classmethod
    def _check_mem(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_MEM.fullmatch(value):
            raise ValueError("use a number with an optional K, M, G or T suffix, e.g. 64G")
        return value

    @field_validator("env")
    @classmethod
    def _check_env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_NAME.fullmatch(key):
                raise ValueError(f"{key!r} is not an environment variable name")
        _refuse_secret_entries(value)
        return value

    @field_validator("pass_env")
    @classmethod
    def _check_pass_env(cls, value: list[str], info: ValidationInfo) -> list[str]:
        for name in value:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        if len(set(value)) != len(value):
            raise ValueError("names a variable twice")
        both = sorted(set(value) & set(info.data.get("env") or {}))
        if both:
            raise ValueError(f"{', '.join(both)} is also set in job.env: keep it in one of the two")
        return value

    @field_validator("constraint", "container")
    @classmethod
    def _check_one_line(cls, value: str | None) -> str | None:
        # An #SBATCH line ends at a newline: the rest would be a line of the script.
        if value is not None and re.search(r"[\x00-\x1f\x7f]", value):
            raise ValueError("use one line of text, without control characters")
        return value

    @field_validator("container")
    @classmethod
    def _check_container(cls, value: str | None) -> str | None:
        # `apptainer exec ... IMAGE`: an image named -x would be read as an option.
        if value is not None and value.startswith("-"):
            raise ValueError("an image name cannot start with '-'")
        return value

    @field_validator("mounts")
    @classmethod
    def _check_mounts(cls, value: list[str]) -> list[str]:
        for mount in value:
            parts = mount.split(":")
            if not 2 <= len(parts) <= 3 or not all(parts[:2]) or "," in mount:
                raise ValueError(
                    f"{mount!r} is not 'host_path:container_path' or 'host_path:container_path:ro'"
                )
            if len(parts) == 3 and parts[2] not in ("ro", "rw"):
                raise ValueError(f"{mount!r}: the third field may be ro or rw, not {parts[2]!r}")
        return value

    @property
    def tasks_per_node(self) -> int:
        """Ranks started on each node."""
        return self.ntasks_per_node or max(self.gpus_per_node, 1)


class ModelConfig(Section):
    """Which network is trained."""

    arch: Literal["av_dit", "audio_ar"] = "av_dit"
    """av_dit: audio-video diffusion transformer; audio_ar: autoregressive audio-token model."""
    size: Literal["tiny", "small", "base", "large", "1b"] = "tiny"
    """Size preset; tiny learns on two CPU cores in minutes, 1b fills one GPU."""
    kernels: Literal["auto", "triton", "reference"] = "auto"
    """Kernel implementation: Triton on CUDA with auto, or force one everywhere."""


class DataConfig(Section):
    """Where samples come from and how they are cut."""

    url: str | None = None
    """fsspec URL of a packed data set (file://, s3://, ...); null uses synthetic data."""
    eval_url: str | None = None
    """Held-out data set for train.eval_every; null: a second synthetic set with url null."""
    batch_size: Annotated[int, Field(ge=1, le=1_000_000)] = 8
    """Global batch size: samples per optimizer step across all ranks."""
    num_workers: Annotated[int, Field(ge=0, le=256)] = 2
    """DataLoader worker processes per rank."""
    clip_seconds: Annotated[float, Field(gt=0, le=3600)] = 1.0
    """Length of each training clip in seconds."""
    fps: Annotated[int, Field(ge=1, le=240)] = 8
    """Video frames per second after resampling."""
    resolution: tuple[Annotated[int, Field(ge=8)], Annotated[int, Field(ge=8)]] = (64, 64)
    """Video frame size [height, width] after resizing."""
    sample_rate: Annotated[int, Field(ge=1000, le=192_000)] = 16_000
    """Audio sample rate in Hz after resampling."""
    channels: Annotated[int, Field(ge=1, le=8)] = 1
    """Audio channels after mixing (mean to fewer, repeat to more)."""
    modalities: list[Literal["video", "audio", "text", "meta"]] = ["video", "audio"]
    """What each sample yields; the data set must have each in every sample."""
    clip_offset: Literal["random", "start"] = "random"
    """Where a clip starts in its sample: random (seeded, resumable) or at 0."""
    shuffle_shards: Annotated[int, Field(ge=1, le=4096)] = 4
    """Shards whose samples are shuffled together; more mixes better, reads wider."""
    prefetch_mb: Annotated[float, Field(gt=0, le=65_536)] = 256
    """Bytes fetched ahead per rank, split over its workers."""
    start_method: Literal["forkserver", "spawn"] = "forkserver"
    """How DataLoader workers start; fork is unsafe with s3fs/gcsfs."""


class OptimConfig(Section):
    """AdamW and its schedule."""

    lr: Annotated[float, Field(gt=0, le=10)] = 3e-4
    """Peak learning rate."""
    weight_decay: Annotated[float, Field(ge=0, le=10)] = 0.1
    """AdamW weight decay."""
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (
        0.9,
        0.95,
    )
    """AdamW betas [beta1, beta2]."""
    warmup_steps: Annotated[int, Field(ge=0)] = 100
    """Linear warm-up steps before the schedule."""
    schedule: Literal["cosine", "constant"] = "cosine"
    """Learning-rate schedule after warm-up."""
    grad_clip: Annotated[float, Field(gt=0)] | None = 1.0
    """Clip the global gradient norm to this value; null disables clipping."""


class TrainConfig(Section):
    """The training loop."""

    steps: Annotated[int, Field(ge=1)] = 1000
    """Optimizer steps to train for."""
    seed: int = 0
    """Seed for weights, data order and noise; equal seeds give equal runs."""
    precision: Literal["bf16", "fp32"] = "bf16"
    """bf16 autocast with fp32 master weights, or plain fp32."""
    grad_accum: Annotated[int, Field(ge=1, le=1024)] = 1
    """Micro-batches accumulated per optimizer step."""
    activation_checkpointing: Literal["none", "selective", "full"] = "none"
    """Recompute activations in backward to save memory."""
    compile: bool = False
    """torch.compile each transformer block."""
    log_every: Annotated[int, Field(ge=1)] = 10
    """Log metrics every this many steps."""
    eval_every: Annotated[int, Field(ge=0)] = 0
    """Evaluate on the held-out split every this many steps; 0 never."""
    eval_batches: Annotated[int, Field(ge=1, le=100_000)] = 4
    """Batches of the held-out split per evaluation (the same ones each time)."""
    hang_timeout_s: Annotated[float, Field(ge=0)] = 900
    """Fail the job when a rank makes no progress for this long (stacks dumped); 0 never."""
    collective_timeout_s: Annotated[float, Field(ge=5, le=86400)] = 120
    """Seconds a collective waits for a lost peer before the rank fails (process group timeout)."""
    profile_steps: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = None
    """[first, last]: record a torch.profiler trace of these steps; null never."""

    @field_validator("profile_steps")
    @classmethod
    def _check_profile_steps(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and value[1] < value[0]:
            raise ValueError("use [first, last] with first <= last, e.g. [10, 15]")
        return value


class CheckpointConfig(Section):
    """Sharded checkpoints."""

    root: str | None = None
    """Folder or fsspec URL for checkpoints; null is <run folder>/checkpoints."""
    every: Annotated[int, Field(ge=0)] = 500
    """Save every this many steps; 0 saves only at the end."""
    keep_last: Annotated[int, Field(ge=1)] = 3
    """Keep the newest this many committed checkpoints."""
    keep_every: Annotated[int, Field(ge=1)] | None = None
    """Also keep every checkpoint whose step is a multiple of this; null keeps none extra."""
    async_save: bool = Field(default=True, alias="async")
    """Save in the background while training goes on."""
    verify: Literal["quick", "full"] = "full"
    """Check before resuming: file sizes (quick), or also every sha256, split over ranks (full)."""
    upload_final: bool = False
    """At the end, upload the consolidated final weights to MLflow as a logged model."""


class TrackingConfig(Section):
    """MLflow."""

    uri: str | None = None
    """MLflow tracking URI; null uses $MLFLOW_TRACKING_URI, else a sqlite store in $STOKER_HOME."""
    experiment: str = "stoker"
    """MLflow experiment name."""
    run_name: str | None = None
    """MLflow run name; null uses the job name."""
    tags: dict[str, str] = {}
    """Extra tags set on the MLflow run; no secrets."""

    @field_validator("tags")
    @classmethod
    def _check_tags(cls, value: dict[str, str]) -> dict[str, str]:
        _refuse_secret_entries(value)
        return value


class ExperimentConfig(Section):
    """A whole experiment: what runs, where, on what data, and where it is recorded."""

    job: JobConfig = Field(default_factory=JobConfig)
    """SLURM resources and job start-up."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The model."""
    data: DataConfig = Field(default_factory=DataConfig)
    """The data set and loader."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """The optimizer."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """The training loop."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    """Checkpoints."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """Experiment tracking."""


def _refuse_secret_entries(mapping: Mapping[str, str]) -> None:
    # resolve_config reports these with their source and no value; this catches a
    # config built in code.
    for key in mapping:
        if secret_word(key):
            raise ValueError(f"{key!r} names a secret; pass it with job.pass_env instead")


SourceKind = Literal["default", "profile", "file", "override", "flag"]


@dataclass(frozen=True)
class Source:
    """Where a value came from: `file examples/tiny.yaml:12`, `override train.steps=10`..."""

    kind: SourceKind
    where: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.where}" if self.where else self.kind


DEFAULT = Source("default")


class ConfigError(StokerError):
    """An experiment that does not validate: every problem, each with its source."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        head = "invalid experiment config" + (f" ({count} problems)" if count > 1 else "")
        body = "\n".join(f"  {p}" for p in self.problems)
        fix = "correct the values above; nothing was run or submitted"
        if any("job.pass_env" in p.message for p in self.problems):
            fix += " (secrets: see Secrets in docs/user-guide.md)"
        super().__init__(f"{head}:\n{body}", fix=fix)


@dataclass(frozen=True)
class ConfigRow:
    key: str
    value: Any
    source: Source
    description: str


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated experiment and the source of each of its values."""

    config: ExperimentConfig
    sources: Mapping[KeyPath, Source]
    profile: Path | None = None
    experiment: Path | None = None

    def source_of(self, key: KeyPath) -> Source:
        for n in range(len(key), 0, -1):
            if key[:n] in self.sources:
                return self.sources[key[:n]]
        return DEFAULT

    def rows(self) -> Iterator[ConfigRow]:
        """One row per leaf, in schema order; mappings such as job.env one row per entry."""
        data = self.config.model_dump(mode="json", by_alias=True)
        for path in leaf_paths(ExperimentConfig):
            value: Any = data
            for part in path:
                value = value[part]
            info = field_at(ExperimentConfig, path)
            description = (info.description if info else None) or ""
            if isinstance(value, dict) and value:
                for sub, subvalue in value.items():
                    key = (*path, sub)
                    yield ConfigRow(dotted(key), subvalue, self.source_of(key), description)
            else:
                yield ConfigRow(dotted(path), value, self.source_of(path), description)


Assignment = tuple[KeyPath, Any, Source]


def resolve_config(
    experiment: Path | None = None,
    overrides: Sequence[str] = (),
    flags: Mapping[str, tuple[Any, str]] | None = None,
    *,
    profile: Path | None = None,
    use_profile: bool = True,
) -> ResolvedConfig:
    """Merge defaults, profile, experiment file, overrides and flags, then validate.

    `flags` maps a dotted key to `(value, flag)`, e.g. `{"job.nodes": (2, "--nodes")}`;
    a None value means the flag was not given. Raises ConfigError listing every problem.
    """
    problems: list[Problem] = []
    assignments: list[Assignment] = []

    profile_path = find_profile(profile) if use_profile else None
    if profile_path is not None:
        doc = read_yaml_mapping(profile_path, what="site profile")
        for key, value in doc.data.items():
            target = PROFILE_KEYS.get(str(key))
            where = doc.where((str(key),))
            if target is None:
                problems.append(
                    Problem(
                        where,
                        str(key),
                        "is not a site profile key",
                        suggest_keys(str(key), list(PROFILE_KEYS)),
                    )
                )
                continue
            # Lines are those of the profile's own keys (env.X for job.env.X).
            where_of = functools.partial(_profile_where, doc.where, str(key), target)
            assignments += _flatten(target, value, Source("profile", where), problems, where_of)

    if experiment is not None:
        doc = read_yaml_mapping(experiment, what="experiment file")
        for key, value in doc.data.items():
            path: KeyPath = (str(key),)
            assignments += _flatten(
                path, value, Source("file", doc.where(path)), problems, doc.where
            )

    for text in overrides:
        key_path, value, raw = parse_override(text)
        # A string key takes the text as written: job.env.N=1e5 is "1e5", not 100000.0.
        if _takes_text(key_path) and raw not in ("null", "~"):
            value = raw
        source = Source("override", shown_override(text))
        assignments += _flatten(key_path, value, source, problems, None)

    for key, (value, flag) in (flags or {}).items():
        if value is not None:
            flag_path = tuple(key.split("."))
            assignments += _flatten(flag_path, value, Source("flag", flag), problems, None)

    # Before validation: a refused value must not reach pydantic, whose errors quote it.
    assignments = _refuse_unsafe_values(assignments, problems)
    data: dict[str, Any] = {}
    sources: dict[KeyPath, Source] = {}
    for path, value, source in assignments:
        node: dict[str, Any] = data
        for part in path[:-1]:
            # A later key inside what an earlier source set to a scalar (job.env=x, then
            # job.env.A=1): the later one wins, and validation judges the result.
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
        sources[path] = source

    # Unknown keys were left out of `data`; validate the rest too so one run
    # of `config show` reports every problem, not the first.
    try:
        config = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        problems += _problems_from(exc, sources)
    if problems:
        raise ConfigError(problems)
    return ResolvedConfig(config, sources, profile_path, experiment)


def _flatten(
    path: KeyPath,
    value: Any,
    source: Source,
    problems: list[Problem],
    where_of: Callable[[KeyPath], str] | None,
) -> list[Assignment]:
    """Split a value into leaf assignments, checking each key against the schema.

    Sections recurse; free mappings such as job.env merge key by key, so a profile's
    NCCL settings and an experiment's own variables add up; anything else replaces.
    """
    where = where_of(path) if where_of else str(source)
    field = field_at(ExperimentConfig, path)
    if field is None:
        if len(path) > 1 and is_free_mapping(field_at(ExperimentConfig, path[:-1])):
            return [(path, value, source)]
        problems.append(
            Problem(where, dotted(path), "is not a config key", suggest_keys(dotted(path)))
        )
        return []
    if is_section(field):
        if not isinstance(value, dict):
            problems.append(
                Problem(
                    where,
                    dotted(path),
                    f"is a section, not a value ({value!r}); set its keys, e.g. "
                    f"{dotted(path)}.{next(_section_keys(path))}=...",
                )
            )
            return []
        result: list[Assignment] = []
        for key, sub in value.items():
            sub_path = (*path, str(key))
            sub_source = Source(source.kind, where_of(sub_path)) if where_of else source
            result += _flatten(sub_path, sub, sub_source, problems, where_of)
        return result
    if is_free_mapping(field) and isinstance(value, dict):
        return [
            (
                (*path, str(k)),
                v,
                Source(source.kind, where_of((*path, str(k)))) if where_of else source,
            )
            for k, v in value.items()
        ] or [(path, {}, source)]
    return [(path, value, source)]


def _refuse_unsafe_values(
    assignments: list[Assignment], problems: list[Problem]
) -> list[Assignment]:
    """Drop, and report without their values, the secrets (stoker/redact.py) and the
    text no environment, argument or script can hold (NUL, invalid UTF-8)."""
    kept = []
    for path, value, source in assignments:
        reason = _unsafe_reason(path, value)
        if reason is None:
            kept.append((path, value, source))
            continue
        where = source.where if source.kind in ("file", "profile") else str(source)
        problems.append(Problem(where, _shown_key(path), reason))
    return kept


def _unsafe_reason(path: KeyPath, value: Any) -> str | None:
    copied = "would be copied into the frozen config, the job script, MLflow and the console"
    word = secret_word(path[-1])
    if len(path) > 1 and word and is_free_mapping(field_at(ExperimentConfig, path[:-1])):
        why = "an AWS_* variable" if word == "AWS_" else f"{word} in its name"
        if path[:-1] != ("job", "env"):
            return f"holds a secret ({why}), whose value {copied}: leave it out"
        return (
            f"holds a secret ({why}), whose value {copied}: remove it, export {path[-1]} "
            f"in the shell you submit from and list it in job.pass_env: [{path[-1]}]"
        )
    for text in _strings_in(value):
        if "\x00" in text:
            return "contains a NUL character, which no variable, argument or script line can hold"
        if not _is_utf8(text):
            return "is not UTF-8 text (bytes of another encoding, or a \\uD800-\\uDFFF escape)"
        if has_url_password(text):
            return (
                f"holds a password in a URL ({hide_url_passwords(text)!r}), which {copied}: "
                "drop it from the URL and give the credentials in variables listed in "
                "job.pass_env (MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, AWS_*)"
            )
    if path == ("job", "setup"):
        lines = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for number, line in enumerate(lines, 1):
            names = secret_assignments(line) if isinstance(line, str) else []
            if names:
                return (
                    f"line {number} sets the secret {names[0]} to a value, which {copied}: "
                    f"export {names[0]} in the shell you submit from and list it in "
                    f"job.pass_env: [{names[0]}] instead"
                )
    return None


def _strings_in(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings_in(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings_in(item)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown_key(path: KeyPath) -> str:
    # A key can be as hostile as a value (job.env."\0"): show it printable.
    return one_line(dotted(path))


def _profile_where(
    where: Callable[[KeyPath], str], key: str, target: KeyPath, path: KeyPath
) -> str:
    return where((key, *path[len(target) :]))


def _takes_text(path: KeyPath) -> bool:
    info = field_at(ExperimentConfig, path)
    if info is None and len(path) > 1:
        parent = field_at(ExperimentConfig, path[:-1])
        return is_free_mapping(parent) and typing.get_args(parent.annotation)[1:] == (str,)  # type: ignore[union-attr]
    return info is not None and info.annotation in (str, str | None)


def _section_keys(path: KeyPath) -> Iterator[str]:
    for leaf in leaf_paths(ExperimentConfig):
        if leaf[: len(path)] == path:
            yield leaf[len(path)]


def _problems_from(exc: ValidationError, sources: Mapping[KeyPath, Source]) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        loc = tuple(str(part) for part in error["loc"])
        # Errors inside a list or tuple name the element: report the field.
        field_path = loc
        while (
            field_path
            and field_at(ExperimentConfig, field_path) is None
            and not (
                len(field_path) > 1 and is_free_mapping(field_at(ExperimentConfig, field_path[:-1]))
            )
        ):
            field_path = field_path[:-1]
        message = str(error["msg"]).removeprefix("Value error, ")
        source = _source_for(loc, message, sources)
        where = source.where if source.kind in ("file", "profile") else str(source)
        field = field_at(ExperimentConfig, field_path)
        if field is None and field_path:
            field = field_at(ExperimentConfig, field_path[:-1])
        expected = describe_expected(field) if field is not None else ""
        got = error.get("input")
        if isinstance(got, dict):  # a free mapping: never quote a secret's value
            got = redact_mapping(got)
        key = (
            dotted(loc)
            if len(loc) == len(field_path) or is_free_mapping(field_at(ExperimentConfig, loc[:-1]))
            else f"{dotted(field_path)}[{loc[-1]}]"
        )
        if error["type"] == "value_error":
            # Our validators say what form is expected; the type is not the issue.
            text = f"got {got!r}: {message}"
        elif isinstance(got, dict):
            text = f"expected {expected} ({message})"
        else:
            text = f"got {got!r}; expected {expected} ({message})"
        problems.append(Problem(where, key, text))
    return problems


def _source_for(loc: KeyPath, message: str, sources: Mapping[KeyPath, Source]) -> Source:
    for n in range(len(loc), 0, -1):
        if loc[:n] in sources:
            return sources[loc[:n]]
    # An error on a whole mapping (job.env): the entry the message names set it.
    children = [(path, src) for path, src in sources.items() if path[: len(loc)] == loc]
    for path, src in children:
        if repr(path[-1]) in message:
            return src
    return children[-1][1] if children else DEFAULT


def freeze_config(resolved: ResolvedConfig) -> str:
    """The YAML a job reads: every value resolved, no profile or overrides left to apply."""
    # The file name on one comment line: a newline in it would start a line of YAML.
    origin = one_line(str(resolved.experiment or "the built-in defaults"))
    header = (
        f"# Frozen by stoker {__version__} at {dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ}"
        f" from {origin}.\n"
        "# This file is the job's only input; edit the experiment file, not this one.\n"
    )
    body = dump_yaml(
        resolved.config.model_dump(mode="json", by_alias=True), sort_keys=False, allow_unicode=True
    )
    return header + body


def write_frozen(resolved: ResolvedConfig, path: Path) -> Path:
    """Write the frozen config atomically: a job never reads a half-written file."""
    return write_text_atomic(path, freeze_config(resolved))


def load_frozen(path: Path) -> ExperimentConfig:
    """Read a frozen config as a job does: no profile, no overrides, strict validation."""
    return resolve_config(path, use_profile=False).config


# The sections that decide what a checkpoint holds; job resources, tracking and
# checkpoint placement can change between a save and a resume.
_STATE_SECTIONS = ("model", "data", "train", "optim")


def config_hash(cfg: ExperimentConfig) -> str:
    """A short hash of the config sections a checkpoint's state depends on
    (recorded in COMMIT.json, to tell which config wrote a checkpoint)."""
    import hashlib
    import json

    data = cfg.model_dump(mode="json", by_alias=True, include=set(_STATE_SECTIONS))
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
