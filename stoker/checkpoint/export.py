"""Consolidated model weights from a sharded checkpoint: one safetensors or torch
file for inference, read in one process whatever the world size that saved it.

DCP keys every tensor by its flattened name; the model's are `model.<fqn>` with
the plain model's FQNs (get_state_dict strips FSDP, torch.compile and
activation-checkpoint prefixes), so the file loads into an unwrapped model with
`load_state_dict(strict=True)`. Only the model's tensors are read, never the
optimizer's (twice the model's bytes with AdamW); the whole model is held in
this process's memory once.

Only committed checkpoints that verify are exported (stoker.checkpoint.commit): their
sizes, and the sha256 of every file the export reads (`.metadata` and the shards that
hold the weights), as the runtime checks before it resumes; `full` hashes the rest too.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from stoker.checkpoint import commit as ck
from stoker.checkpoint.storage import storage_reader
from stoker.errors import StokerError

if TYPE_CHECKING:
    import torch

Format = Literal["safetensors", "torch"]
Verify = Literal["quick", "full"]
"""quick: sizes, and the sha256 of the files the export reads; full: every file's sha256."""
FORMATS: tuple[Format, ...] = ("safetensors", "torch")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""--dtype names -> torch dtype names."""
MODEL_PREFIX = "model."
EMA_PREFIX = "ema."
Weights = Literal["model", "ema"]


@dataclass(frozen=True)
class ExportResult:
    step: int
    source: str
    """The checkpoint folder read (the newest verified one when given a root)."""
    out: str
    format: Format
    tensors: int
    bytes: int
    """Tensor bytes written (after the cast), headers left out."""
    dtypes: tuple[str, ...]
    """The written tensors' dtypes, e.g. ('float32',)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _stderr(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")


def export_weights(
    path_url: str,
    out_url: str,
    *,
    fmt: Format = "safetensors",
    dtype: str | None = None,
    verify: Verify = "quick",
    force: bool = False,
    fs_options: dict[str, Any] | None = None,
    warn: Callable[[str], None] = _stderr,
    weights: Weights = "model",
) -> ExportResult:
    """Write the model weights of a committed checkpoint to `out_url`, replaced whole.

    `path_url`: a `step-<N>` folder, or a checkpoint root (then its newest
    checkpoint that verifies; one `warn` per newer broken one). `fmt`:
    safetensors (step and COMMIT format version in its metadata) or torch
    (`torch.save` of the plain state dict). `dtype`: bf16, fp16 or fp32 casts
    floating tensors; None keeps them as saved. `verify`: quick (sizes, and the
    sha256 of the files it reads) or full (every file's sha256). `fs_options` go
    to fsspec, for the checkpoint and for OUT. `weights`: "model" (the trained
    weights) or "ema" (the moving average of train.ema_decay in place of every
    averaged weight; buffers from the model). Raises StokerError for an
    uncommitted or broken checkpoint, one without model tensors (or EMA weights,
    for "ema"), an existing OUT without `force`.
    """
    if fmt not in FORMATS:
        raise StokerError(
            f"export format {fmt!r} is not one of {', '.join(FORMATS)}",
            fix="--format safetensors (for inference libraries) or --format torch",
        )
    if dtype is not None and dtype not in DTYPES:
        raise StokerError(
            f"export dtype {dtype!r} is not one of {', '.join(DTYPES)}",
            fix="--dtype bf16, fp16 or fp32, or leave it out to keep the saved dtypes",
        )
    if verify not in ("quick", "full"):
        raise StokerError(f"verify {verify!r} is not quick or full", fix="verify='quick'")
    out_fs, out_path = ck._open(out_url, fs_options)
    if out_fs.isdir(out_path):
        raise StokerError(
            f"export OUT {out_url!r} is a folder",
            fix="name the file to write, e.g. model.safetensors",
        )
    if out_fs.exists(out_path) and not force:
        raise StokerError(
            f"export OUT {out_url!r} exists", fix="pass --force to replace it, or name another file"
        )

    commit, folder = verified_folder(
        path_url, full=verify == "full", fs_options=fs_options, warn=warn, reads=weights
    )
    tensors = read_weights(folder, fs_options, weights)
    if dtype is not None:
        import torch

        target = getattr(torch, DTYPES[dtype])
        for key, tensor in tensors.items():  # one at a time: the saved copy is freed as we go
            if tensor.is_floating_point():
                tensors[key] = tensor.to(target)

    metadata = {
        "format": "pt",  # what safetensors' torch loaders (transformers) expect
        "step": str(commit.step),
        "stoker_format": str(commit.format_version),
        "weights": weights,
    }
    if commit.state_hash:
        metadata["config_hash"] = commit.state_hash
    _write(tensors, out_fs, out_path, fmt, metadata)
    return ExportResult(
        step=commit.step,
        source=folder,
        out=out_url,
        format=fmt,
        tensors=len(tensors),
        bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
        dtypes=tuple(sorted({str(t.dtype).removeprefix("torch.") for t in tensors.values()})),
    )


def verified_folder(
    path_url: str,
    *,
    full: bool,
    fs_options: dict[str, Any] | None,
    warn: Callable[[str], None],
    reads: Weights | None = None,
) -> tuple[ck.Commit, str]:
    """The commit record and URL of the checkpoint folder to read; refuses any
    folder that is not committed or does not verify. `reads`: also the sha256 of
    the files that reading these weights opens (a root's newer folders that fail it
    are passed over with a warning, as ones that fail on sizes are)."""

    def problems(folder: str) -> list[ck.Problem]:
        found = ck.verify(folder, full=full, fs_options=fs_options)
        if found or full or reads is None:
            return found
        return read_files_problems(folder, fs_options, reads)

    if not ck.exists(path_url, fs_options=fs_options):
        raise StokerError(
            f"no checkpoint at {path_url!r}: the path does not exist",
            fix="pass a step-<N> folder or the run's checkpoint root",
        )
    folder = path_url
    if ck.step_of(path_url) is None:
        warnings_seen: list[str] = []
        row = ck.first_good(
            ck.list_checkpoints(path_url, fs_options=fs_options),
            lambda r: problems(r.path),
            warnings_seen.append,
        )
        if row is None:
            # first_good words these for a resume ("no checkpoint verifies: step-N
            # is broken: ..."): keep the part that names the folder.
            broken = [w.split(": ", 1)[-1] for w in warnings_seen]
            check = f"stoker ckpt verify {path_url}"
            raise StokerError(
                f"no checkpoint under {path_url!r} verifies"
                + (f": {'; '.join(broken)}" if broken else ": it has no step-<N> folder"),
                fix=f"see `{check}`; pass a checkpoint root or a committed step-<N> folder",
            )
        for message in warnings_seen:
            warn(message)
        folder = row.path
    commit = ck.read_commit(folder, fs_options=fs_options)  # a broken record raises
    if commit is None:
        raise StokerError(
            f"checkpoint {folder!r} is not committed: no COMMIT.json; its save may have "
            "been cut short",
            fix="export a committed checkpoint (`stoker ckpt ls` on the root lists them), "
            "or pass the root to take the newest one that verifies",
        )
    if folder == path_url:  # first_good has checked a root's pick
        mismatches = problems(folder)
        if mismatches:
            shown = "; ".join(str(p) for p in mismatches[:3])
            more = f" (and {len(mismatches) - 3} more)" if len(mismatches) > 3 else ""
            raise StokerError(
                f"checkpoint {folder!r} does not verify against its COMMIT.json: {shown}{more}",
                fix=_earlier_step_fix(folder, fs_options),
            )
    return commit, folder


def _earlier_step_fix(folder: str, fs_options: dict[str, Any] | None) -> str:
    """The fix for a broken step-<N> folder: the committed step before it, by name."""
    step = ck.step_of(folder)
    root = folder.rstrip("/").rsplit("/", 1)[0] if "/" in folder.rstrip("/") else "."
    earlier = [
        r
        for r in ck.list_checkpoints(root, fs_options=fs_options)
        if r.committed and step is not None and r.step < step
    ]
    listing = f"`stoker ckpt verify {root}` lists which verify"
    if not earlier:
        return (
            f"no earlier checkpoint under {root}: restore the file from a copy, or export "
            f"another run's checkpoint ({listing})"
        )
    return (
        f"export the earlier step-{earlier[0].step} ({earlier[0].path}), or pass the root "
        f"{root} to take the newest checkpoint that verifies ({listing})"
    )


def read_files_problems(
    folder_url: str, fs_options: dict[str, Any] | None, weights: Weights
) -> list[ck.Problem]:
    """The sha256 of the files `read_weights(folder_url, ..., weights)` opens, against
    COMMIT.json: `.metadata` first (it is unpickled to find the rest), then the shards
    that hold the model's (and EMA's) tensors. Empty: they are the bytes committed."""
    commit = ck.read_commit(folder_url, fs_options=fs_options)
    if commit is None:
        return [ck.Problem(ck.COMMIT_NAME, "not committed: no COMMIT.json")]
    entries = {entry.path: entry for entry in commit.files}
    metadata = entries.get(ck.METADATA_NAME)
    if metadata is None:
        return [ck.Problem(ck.METADATA_NAME, f"{ck.METADATA_NAME}: not listed in COMMIT.json")]
    problems = ck.check_files(folder_url, [metadata], fs_options=fs_options)
    if problems:
        return problems
    prefixes = (MODEL_PREFIX, EMA_PREFIX) if weights == "ema" else (MODEL_PREFIX,)
    storage = storage_reader(folder_url, fs_options).read_metadata().storage_data or {}
    read = sorted(
        {info.relative_path for index, info in storage.items() if index.fqn.startswith(prefixes)}
    )
    unlisted = [name for name in read if name not in entries]
    if unlisted:
        return [ck.Problem(name, f"{name}: not listed in COMMIT.json") for name in unlisted]
    return ck.check_files(folder_url, [entries[name] for name in read], fs_options=fs_options)


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns on a load without a process group: one process is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def read_weights(
    folder_url: str, fs_options: dict[str, Any] | None, weights: Weights = "model"
) -> dict[str, torch.Tensor]:
    """The model's tensors of a DCP checkpoint folder, unsharded, by FQN; for
    weights="ema" with the EMA's average in place of each averaged weight. One
    process, whatever the world size that saved it."""
    import torch
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    if weights not in ("model", "ema"):
        raise StokerError(f"weights {weights!r} is not model or ema", fix="weights='model'")
    reader = storage_reader(folder_url, fs_options)
    entries = reader.read_metadata().state_dict_metadata
    model = {k: m for k, m in entries.items() if k.startswith(MODEL_PREFIX)}
    if not model:
        top = sorted({k.split(".", 1)[0] for k in entries})
        raise StokerError(
            f"checkpoint {folder_url!r} holds no model tensors: no key starts with "
            f"{MODEL_PREFIX!r} (its keys start with {', '.join(top) or 'nothing'})",
            fix="export a checkpoint saved by stoker's runtime, whose state dict has "
            "'model' and 'optim'",
        )
    wanted = dict(model)
    if weights == "ema":
        ema = {k: m for k, m in entries.items() if k.startswith(EMA_PREFIX)}
        if not ema:
            raise StokerError(
                f"checkpoint {folder_url!r} has no EMA weights: its run trained without "
                "train.ema_decay",
                fix="use the trained weights (leave out --ema), or train with "
                "train.ema_decay=0.999",
            )
        wanted.update(ema)
    not_tensors = sorted(k for k, m in wanted.items() if not isinstance(m, TensorStorageMetadata))
    if not_tensors:
        raise StokerError(
            f"checkpoint {folder_url!r}: model entries that are not tensors: "
            f"{', '.join(not_tensors[:5])}",
            fix="weights files hold tensors only: keep other model state out of the "
            "state dict (or in 'train')",
        )
    # Full (unsharded) tensors: DCP reads each one's chunks from every rank's shard.
    state = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in wanted.items()
        if isinstance(meta, TensorStorageMetadata)
    }
    try:
        with _single_process_quiet():
            load(state, storage_reader=reader, no_dist=True)
    except CheckpointException as exc:
        # DCP wraps what a read raised; a file gone since verify is the user's to fix.
        lost = [e for e, _ in exc.failures.values() if isinstance(e, FileNotFoundError)]
        if not lost:
            raise
        raise StokerError(
            f"checkpoint {folder_url!r} lost a file while it was read: {lost[0]}",
            fix="a running job's retention (checkpoint.keep_last) may have deleted it: "
            "export again, from the root for its newest checkpoint",
        ) from None
    out = {k.removeprefix(MODEL_PREFIX): t for k, t in state.items() if k in model}
    for key, tensor in state.items():
        if key.startswith(EMA_PREFIX):
            fqn = key.removeprefix(EMA_PREFIX)
            if fqn not in out:
                raise StokerError(
                    f"checkpoint {folder_url!r}: EMA weight {fqn!r} is not a model weight",
                    fix="the checkpoint was written by another program: export the model "
                    "weights (leave out --ema)",
                )
            out[fqn] = tensor
    return out


def _save(
    tensors: dict[str, torch.Tensor], path: Path, fmt: Format, metadata: dict[str, str]
) -> None:
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file(tensors, str(path), metadata=metadata)
    else:
        import torch

        torch.save(tensors, path)
    # safetensors writes 0600; an exported model is for others to read, as any file the
    # user writes is: the mode a new file gets under the process's umask.
    os.chmod(path, 0o666 & ~_umask())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # on disk before the rename makes it visible
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it back at once
    os.umask(mask)
    return mask


def _write(
    tensors: dict[str, torch.Tensor],
    fs: Any,
    path: str,
    fmt: Format,
    metadata: dict[str, str],
) -> None:
    """The file replaced whole: temp file + rename locally, one PUT on an object store."""
    if ck._is_local(fs):
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            _save(tensors, tmp, fmt, metadata)
            tmp.replace(target)
        finally:
            tmp.unlink(missing_ok=True)
        return
    with tempfile.TemporaryDirectory(prefix="stoker-export-") as tmpdir:
        local = Path(tmpdir) / path.rsplit("/", 1)[-1]
        _save(tensors, local, fmt, metadata)
        fs.put_file(str(local), path)
