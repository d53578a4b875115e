"""The experiment schema: one pydantic section per concern, each field with its docstring.

Every field carries a one-line docstring that `stoker config show`, `stoker init` and
docs/config.md use, so code and docs cannot drift. The validators here judge one
value at a time; where a value came from is `stoker.config.resolve`'s business.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from stoker import modes
from stoker.redact import secret_word

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_SLURM_TIME = re.compile(
    r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED)$"
)
_SLURM_MEM = re.compile(r"^\d+[KMGT]?$")
# sbatch --exclude: host names with optional [1-3,5] ranges, comma-separated.
_HOST = r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*\][A-Za-z0-9._-]*)?"
_HOST_LIST = re.compile(rf"{_HOST}(,{_HOST})*")


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
    """Job name in squeue and run folder (letters, digits, . _ -); unset: from command or file."""
    nodes: Annotated[int, Field(ge=1, le=10_000)] = 1
    """Number of nodes the job trains on."""
    spare_nodes: Annotated[int, Field(ge=0, le=1_000)] = 0
    """Nodes allocated beyond job.nodes: a failed node is replaced by one, inside the job."""
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
    exclude: str | None = None
    """Nodes never to run on (sbatch --exclude), a SLURM host list, e.g. 'n[3-4],gpu17'."""
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
    """Restarts after a lost rank or node or a hang (in place, else requeued); not after errors."""
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

    @field_validator("exclude")
    @classmethod
    def _check_exclude(cls, value: str | None) -> str | None:
        if value is not None and not _HOST_LIST.fullmatch(value):
            raise ValueError(
                "use a SLURM host list: names of letters, digits, '-', '_' and '.', "
                "with [1-3,5] ranges, separated by commas, e.g. 'n[3-4],gpu17'"
            )
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


BUILTIN_MODELS = ("av_dit", "audio_ar")
# package.module:factory (dotted names only: a file path would not import the same way
# on every rank, and a pickled callable breaks between Python environments).
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_FILE_HINT = " (a module's dotted name, not a file path)"


def _looks_like_a_file(value: str) -> bool:
    return "/" in value or "\\" in value or value.endswith(".py") or ".py:" in value


class ModelConfig(Section):
    """Which network is trained."""

    arch: str = "av_dit"
    """A built-in model (av_dit, audio_ar) or your own factory as package.module:function."""
    size: Literal["tiny", "small", "base", "large", "1b"] = "tiny"
    """Size preset of the built-in models (passed as size= to factories that take it)."""
    args: dict[str, Any] = {}
    """Keyword arguments of the model's factory (docs/bring-your-own.md)."""
    kernels: modes.KernelChoice = "auto"
    """Kernel implementation: Triton on CUDA with auto, or force one everywhere."""

    @field_validator("arch")
    @classmethod
    def _check_arch(cls, value: str) -> str:
        if value in BUILTIN_MODELS or _IMPORT_PATH.fullmatch(value):
            return value
        hint = ""
        if _looks_like_a_file(value):
            hint = _FILE_HINT
        else:
            import difflib

            close = difflib.get_close_matches(value, BUILTIN_MODELS, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(
            f"{value!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) nor an "
            f"import path package.module:factory{hint}"
        )


class SourceConfig(Section):
    """One data set of a mixture (data.sources)."""

    name: str
    """What metrics, MLflow's dataset inputs and messages call it: letters, digits, . _ -;
    left out, the last part of its url (s3://b/sets/speech/ is speech)."""
    url: str
    """fsspec URL of its packed data set."""
    weight: Annotated[float, Field(gt=0, le=1e6)] = 1.0
    """Its share of the samples: weight / the sum of all weights."""

    @model_validator(mode="before")
    @classmethod
    def _name_from_url(cls, value: Any) -> Any:
        if not isinstance(value, Mapping) or value.get("name") is not None:
            return value
        url = value.get("url")
        if not isinstance(url, str):
            return value  # the url's own error says what is wrong
        name = source_name_of(url)
        if not _NAME.match(name):
            raise ValueError(
                f"no name, and the last part of its url {url!r} ({name!r}) cannot be one: "
                "set name (letters, digits, '.', '_' and '-')"
            )
        return {**value, "name": name}

    @field_validator("name")
    @classmethod
    def _check_source_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r}: use letters, digits, '.', '_' and '-' (at most 128)")
        return value


def source_name_of(url: str) -> str:
    """A source's default name: its url's last path segment, without a query or a
    trailing slash (file:///d/speech/ -> speech)."""
    path = url.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    return posixpath.basename(path.split("://", 1)[-1])


class BucketConfig(Section):
    """One bucket (data.buckets): clips of one size and length, batched together."""

    resolution: tuple[Annotated[int, Field(ge=8)], Annotated[int, Field(ge=8)]] | None = None
    """[height, width] of its frames; null: data.resolution (audio-only buckets)."""
    clip_seconds: Annotated[float, Field(gt=0, le=3600)]
    """Length of its clips in seconds."""
    batch_size: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    """Global batch size of its batches; null: as many as data.batch_tokens allows."""


class DataConfig(Section):
    """Where samples come from and how they are cut."""

    url: str | None = None
    """fsspec URL of a packed data set (file://, s3://, ...); null uses synthetic data."""
    sources: list[SourceConfig] = []
    """A mixture of data sets [{name, url, weight}]; a name left out is the url's last part."""
    mixing: modes.Mixing = "random"
    """How sources share the stream: seeded draws by weight, or exact proportions in every batch."""
    buckets: list[BucketConfig] = []
    """Buckets of size and length [{resolution, clip_seconds, batch_size}]; empty: one shape."""
    batch_tokens: Annotated[int, Field(ge=1)] | None = None
    """Token budget of a global batch, for buckets without batch_size (see data.token_patch)."""
    token_patch: tuple[
        Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]
    ] = (1, 16, 16)
    """[frames, height, width] of one video token, for data.batch_tokens."""
    audio_tokens_per_s: Annotated[float, Field(gt=0, le=1e6)] = 50.0
    """Tokens per second of audio-only clips, for data.batch_tokens."""
    batch_multiple: Annotated[int, Field(ge=1, le=65_536)] = 1
    """Batch sizes from data.batch_tokens are rounded down to a multiple of this (use the ranks)."""
    resize: Literal["crop", "stretch"] = "crop"
    """Frames keep their aspect ratio (scaled to cover, centre-cropped) or are stretched."""
    allow_changed_data: bool = False
    """Resume even though a data set's manifest digest changed since the checkpoint."""
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
    modalities: list[Literal["video", "audio", "text", "meta", "latent"]] = ["video", "audio"]
    """What each sample yields (every sample must have each); latent: `data encode`'s tensors."""
    clip_offset: Literal["random", "start"] = "random"
    """Where a clip starts in its sample: random (seeded, resumable) or at 0."""
    shuffle_shards: Annotated[int, Field(ge=1, le=4096)] = 4
    """Shards whose samples are shuffled together; more mixes better, reads wider."""
    prefetch_mb: Annotated[float, Field(gt=0, le=65_536)] = 256
    """Bytes fetched ahead per rank, split over its workers (and 16 samples a fetch thread)."""
    decode_threads: Annotated[int, Field(ge=0, le=64)] = 0
    """Threads decoding in each loader worker; 0: the rank's cores over its workers (at most 4)."""
    start_method: Literal["forkserver", "spawn"] = "forkserver"
    """How DataLoader workers start; fork is unsafe with s3fs/gcsfs."""
    transform: str | None = None
    """Per-sample function package.module:function, run in the loader workers; null: none."""

    @field_validator("sources")
    @classmethod
    def _check_sources(cls, value: list[SourceConfig]) -> list[SourceConfig]:
        seen: dict[str, int] = {}
        for index, source in enumerate(value):
            if source.name in seen:
                first = value[seen[source.name]]
                raise ValueError(
                    f"data.sources[{seen[source.name]}] ({first.url}) and data.sources[{index}] "
                    f"({source.url}) are both named {source.name!r}: give one of them "
                    "another name (name: ...)"
                )
            seen[source.name] = index
        return value

    @field_validator("buckets")
    @classmethod
    def _check_buckets(cls, value: list[BucketConfig]) -> list[BucketConfig]:
        shapes = [(b.resolution, b.clip_seconds) for b in value]
        twice = [s for i, s in enumerate(shapes) if s in shapes[:i]]
        if twice:
            res, seconds = twice[0]
            raise ValueError(f"two buckets share resolution {res} and clip_seconds {seconds:g}")
        return value

    @model_validator(mode="after")
    def _check_mixture_and_budget(self) -> DataConfig:
        if self.sources and self.url is not None:
            raise ValueError(
                "data.url and data.sources are both set: set data.url to null for a mixture, "
                "or drop data.sources"
            )
        if any(b.batch_size is None for b in self.buckets) and self.batch_tokens is None:
            raise ValueError(
                "a bucket without batch_size needs data.batch_tokens (the token budget its "
                "batch size is derived from): set one of them"
            )
        return self

    @field_validator("transform")
    @classmethod
    def _check_transform(cls, value: str | None) -> str | None:
        # Imported by name in every loader worker, as model.arch is on every rank. A
        # module named `py` is legal, but `loader.py:fn` means a file far more often.
        if value is None or (_IMPORT_PATH.fullmatch(value) and ".py:" not in value):
            return value
        hint = _FILE_HINT if _looks_like_a_file(value) else ""
        raise ValueError(f"{value!r} is not an import path package.module:function{hint}")


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
    precision: modes.Precision = "auto"
    """bf16 autocast (fp32 weights) or fp32; auto: bf16 where the device has it natively."""
    grad_accum: Annotated[int, Field(ge=1, le=1024)] = 1
    """Micro-batches accumulated per optimizer step."""
    activation_checkpointing: modes.ActivationCheckpointing = "none"
    """Recompute activations in backward to save memory."""
    compile: bool = False
    """torch.compile each transformer block."""
    sharding: modes.Sharding = "node"
    """FSDP2 shards the weights over one node's ranks (HSDP: replicated across nodes) or all."""
    context_parallel: Annotated[int, Field(ge=1, le=1024)] = 1
    """Ranks that split each sample's tokens (long clips), consecutive ones; 1: none."""
    context_parallel_ulysses: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Of train.context_parallel, the ranks exchanging heads (all-to-all); the rest: a ring."""
    measure_memory: bool = False
    """CPU runs: trace each batch shape's second step for its peak memory (GPU runs always do)."""
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
    rendezvous_timeout_s: Annotated[float, Field(ge=5, le=86400)] = 45
    """Seconds the ranks wait at start for every rank to join before failing, naming the missing."""
    profile_steps: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = None
    """[first, last]: record a torch.profiler trace of these steps; null never."""
    ema_decay: Annotated[float, Field(gt=0, lt=1)] | None = None
    """Keep a moving average of the weights (e.g. 0.999), checkpointed, for samples; null none."""
    sample_every: Annotated[int, Field(ge=0)] = 0
    """Every this many steps and at the end, log clips to MLflow's samples/step-<N>/; 0 never."""
    sample_seeds: Annotated[list[int], Field(min_length=1, max_length=64)] = [0, 1, 2, 3]
    """Seeds of the clips train.sample_every draws: one clip each, the same seeds every time."""
    sample_steps: Annotated[int, Field(ge=1, le=1000)] = 25
    """Solver steps per clip (av_dit's flow ODE); nothing to an autoregressive model."""
    sample_method: Literal["euler", "heun"] = "heun"
    """The av_dit's ODE solver for samples: euler (first order) or heun (second order)."""
    sample_prompts: Annotated[list[str], Field(max_length=64)] = []
    """A conditioned model's caption or class label per seed (cycled); empty: unconditioned."""
    sample_guidance: Annotated[float, Field(ge=0, le=100)] = 1.0
    """Classifier-free guidance weight for samples with prompts; 1: none."""
    register_final: str | None = None
    """At the end, register the final weights (EMA's if kept) as a version of this MLflow model."""

    @field_validator("register_final")
    @classmethod
    def _check_register_final(cls, value: str | None) -> str | None:
        if value is not None and not registered_model_name_ok(value):
            raise ValueError(
                f"{value!r} is not a name MLflow's model registry takes: use 1 to "
                f"{MAX_REGISTERED_MODEL_NAME} characters without '/' or ':', e.g. av-dit-small"
            )
        return value

    @model_validator(mode="after")
    def _check_context_parallel(self) -> TrainConfig:
        ulysses = self.context_parallel_ulysses
        if ulysses is not None and self.context_parallel % ulysses:
            raise ValueError(
                f"train.context_parallel_ulysses {ulysses} does not divide "
                f"train.context_parallel {self.context_parallel}: use a divisor of it "
                "(the rest of the ranks form a ring), or null for Ulysses over all"
            )
        return self

    def ulysses_degree(self) -> int:
        """Of train.context_parallel, the ranks in Ulysses (all of them when not set)."""
        return self.context_parallel_ulysses or self.context_parallel

    @field_validator("profile_steps")
    @classmethod
    def _check_profile_steps(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and value[1] < value[0]:
            raise ValueError("use [first, last] with first <= last, e.g. [10, 15]")
        return value


MAX_REGISTERED_MODEL_NAME = 256
"""The registry's name column (mlflow/store/model_registry/dbmodels/models.py)."""


def registered_model_name_ok(name: str) -> bool:
    """Whether MLflow's model registry takes `name`: not blank, no '/' or ':', not a path
    that normalizes to another ('.', '..', 'a//b')."""
    return (
        bool(name.strip())
        and len(name) <= MAX_REGISTERED_MODEL_NAME
        and not any(c in name for c in "/:")
        and posixpath.normpath(name) == name
        and not name.startswith("..")
    )


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
    if_none_verifies: Literal["fail", "start_fresh"] = "fail"
    """When committed checkpoints exist but none verifies: stop the job, or train from step 0."""
    upload_final: bool = False
    """At the end, upload the consolidated final weights to MLflow as a logged model."""


class TrackingConfig(Section):
    """MLflow."""

    uri: str | None = None
    """MLflow URI; null: $MLFLOW_TRACKING_URI or $STOKER_HOME's sqlite; none: metrics.jsonl only."""
    experiment: str = "stoker"
    """MLflow experiment name."""
    run_name: str | None = None
    """MLflow run name; null uses the job name."""
    tags: dict[str, str] = {}
    """Extra tags set on the MLflow run; no secrets."""

    @field_validator("uri")
    @classmethod
    def _spell_none(cls, value: str | None) -> str | None:
        # `None` and `NONE` are no YAML null: they mean what `none` means.
        if value is not None and value.strip().lower() == "none":
            return "none"
        return value

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
