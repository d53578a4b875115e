"""The model a config names, built on the meta device before a job starts, and its
forward run on a meta batch of the loader's shapes: a data config the model cannot
take, a plugin that does not import, a wrong argument or a forward that breaks the
contract is refused in seconds, before a data set is written or a rank is started
(`stoker run`; docs/runtime.md, docs/bring-your-own.md). A forward that reads values
(`.item()`, a branch on a tensor), which meta tensors lack, is run again for real on
the CPU: one sample of the data's shapes with random values, within 60 s.

Run by the launcher as a child process (it imports torch, which the login node's
commands do not): `python -m stoker.runtime.preflight --config FROZEN [--config ...]`,
several configs for a sweep's tasks (torch imported once, not once a task)
[--imported FILE]. Exit 0 when every model builds, with FILE (when given) the files the
check imported or read ({"files": {path: [size, mtime_ns]}, "top", "cwd"}): a pass is
kept while they stay the same (stoker/launcher/launch/model_check_cache.py); else
exit PREFLIGHT_REFUSED (stoker/protocol.py) at the first refusal with one JSON object on
stdout: {"key", "message", "fix"}, the setting to change first and the values to use,
and "index", the refused config's place in the arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stoker.process.gc_pause import pause_collector, resume_collector
from stoker.protocol import PREFLIGHT_REFUSED

if TYPE_CHECKING:
    from stoker.config import ExperimentConfig
    from stoker.model import ClipShape, DataShapes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stoker.runtime.preflight")
    parser.add_argument(
        "--config", type=Path, action="append", required=True, help="a frozen config (repeatable)"
    )
    parser.add_argument("--imported", type=Path, help="write the files the check read (JSON)")
    args = parser.parse_args(argv)
    opened: set[str] = set()
    if args.imported is not None:
        sys.addaudithook(_recording_opens(opened))

    # The collector paused for the whole check, a short process: it imports torch and the
    # model's code, builds and runs it on the meta device (for real on the CPU only where
    # meta tensors cannot) and ends (stoker/process/gc_pause.py).
    pause_collector()
    try:
        from stoker.config import load_frozen
        from stoker.runtime.models.build import ModelSetupError

        for index, path in enumerate(args.config):
            try:
                check_model(load_frozen(path))
            except ModelSetupError as exc:
                refusal = {"key": exc.key, "message": exc.message, "fix": exc.fix, "index": index}
                print(json.dumps(refusal))
                return PREFLIGHT_REFUSED
    finally:
        resume_collector()
    if args.imported is not None:
        ours = {str(path.resolve().parent) for path in args.config}
        args.imported.write_text(json.dumps(files_read(opened, ours)))
    return 0


def _recording_opens(opened: set[str]) -> Callable[[str, tuple[Any, ...]], None]:
    """An audit hook that adds the path of every file opened by name to `opened`: a
    model may read more than its modules as it is built (a file named in model.args)."""

    def hook(event: str, hook_args: tuple[Any, ...]) -> None:
        if event == "open" and isinstance(hook_args[0], str):
            opened.add(os.path.abspath(hook_args[0]))

    return hook


def files_read(opened: set[str], ours: set[str]) -> dict[str, Any]:
    """What the check's verdict depends on: each module file this process imported and
    each other file it opened (but its own configs, in the folders `ours`), with its size
    and modification time in ns ("files"); the top-level names of the modules ("top": a
    module of such a name in another folder would be imported instead); and the folder
    it ran in, which Python searched first ("cwd")."""
    names = [getattr(module, "__file__", None) for module in list(sys.modules.values())]
    names += sorted(opened)
    files: dict[str, list[int]] = {}
    for name in names:
        if not isinstance(name, str) or name in files or os.path.dirname(name) in ours:
            continue
        try:
            found = os.stat(name)
        except OSError:
            continue
        if stat.S_ISREG(found.st_mode) and not name.startswith(("/proc/", "/sys/", "/dev/")):
            files[name] = [found.st_size, found.st_mtime_ns]
    top = sorted({name.split(".", 1)[0] for name in sys.modules})
    return {"files": files, "top": top, "cwd": str(Path.cwd().resolve())}


def check_model(cfg: ExperimentConfig) -> None:
    """Build the model on the meta device and run its forward on a meta batch of the
    loader's shapes (with data.buckets, of each bucket's shape): a ModelSetupError for
    a factory, argument or contract mistake, naming the bucket whose shape the model
    refuses. A forward that reads values (`.item()`, a data-dependent branch) cannot run
    on meta tensors: that part is then left to the ranks, and said on stderr."""
    import torch

    from stoker.runtime.models import build_model, data_shapes
    from stoker.runtime.models.context_parallel import SharesOnly, context_parallel_as

    shapes = data_shapes(cfg.data)
    rows = min(2, cfg.data.batch_size)
    clips: list[ClipShape | None] = list(shapes.buckets) or [None]
    notes: list[str] = []
    needs_values: list[ClipShape | None] = []
    train = cfg.train
    # Do each bucket's tokens and the heads split over train.context_parallel?
    cp = train.context_parallel
    shares = SharesOnly(cp, train.ulysses_degree()) if cp > 1 else None
    with torch.device("meta"), context_parallel_as(shares):  # shapes only: nothing allocated
        model = build_model(cfg.model, cfg.data)
        parameters = sum(p.numel() for p in model.parameters())
        for clip in clips:
            with _naming_the_bucket(shapes, clip):
                note, values = _check_forward(cfg.model.arch, model, meta_batch(shapes, rows, clip))
            notes.append(note)
            if values:
                needs_values.append(clip)
    del model
    for clip in needs_values:  # what meta tensors cannot run: for real, on the CPU
        with _naming_the_bucket(shapes, clip):
            notes.append(_check_forward_with_values(cfg, shapes, clip, parameters))
    for note in dict.fromkeys(n for n in notes if n):  # once each, in order
        print(f"stoker: {cfg.model.arch}: {note}", file=sys.stderr)


# The forward on values (a model that reads them: `.item()`, a branch on a tensor):
# bounded in time, and only for a model whose fp32 weights a login node can hold.
VALUES_FORWARD_S = 60
VALUES_FORWARD_MAX_BYTES = 4 << 30


@contextlib.contextmanager
def _naming_the_bucket(shapes: DataShapes, clip: ClipShape | None) -> Iterator[None]:
    """A refusal for one of data.buckets' shapes names that bucket and its shape."""
    from stoker.runtime.models.build import ModelSetupError

    try:
        yield
    except ModelSetupError as exc:
        if clip is None:
            raise
        index = shapes.buckets.index(clip)
        raise ModelSetupError(
            "data.buckets",
            f"data.buckets[{index}] ({_described(shapes, clip)}): {exc.message}",
            fix=f"{exc.fix}; or change or drop data.buckets[{index}]",
        ) from exc


class _TookTooLong(Exception):
    pass


def _check_forward_with_values(
    cfg: ExperimentConfig, shapes: DataShapes, clip: ClipShape | None, parameters: int
) -> str:
    """The forward of a model the meta device cannot run, for real on the CPU: built
    under the run's seed, on one sample of the data's shapes with random values, in at
    most VALUES_FORWARD_S. A ModelSetupError as on the meta device (a loss that is not a
    scalar, a wrong key, a dtype error); a note when it was not run."""
    import signal

    import torch

    from stoker.runtime.models import build_model

    if parameters * 4 > VALUES_FORWARD_MAX_BYTES:
        return (
            f"forward not checked: the meta device cannot run it, and its "
            f"{parameters / 1e9:.1f} B parameters are too many to run it here; the ranks "
            "will run it"
        )

    def took_too_long(signum: int, frame: object) -> None:
        raise _TookTooLong

    before = signal.signal(signal.SIGALRM, took_too_long)
    signal.alarm(VALUES_FORWARD_S)
    try:
        torch.manual_seed(cfg.train.seed)
        with torch.device("cpu"):
            model = build_model(cfg.model, cfg.data)
        with torch.no_grad():
            note, _ = _check_forward(cfg.model.arch, model, batch_with_values(shapes, 1, clip))
    except _TookTooLong:
        return (
            f"forward not checked: the meta device cannot run it, and on the CPU it took "
            f"more than {VALUES_FORWARD_S} s; the ranks will run it"
        )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    return note


def _check_forward(arch: str, model: Any, batch: dict[str, Any]) -> tuple[str, bool]:
    """Run forward on `batch`: a ModelSetupError when it breaks the contract; else a
    note ('' when none) and whether the forward needs values (it could not run on meta
    tensors)."""
    from stoker.errors import StokerError
    from stoker.runtime.models import contract
    from stoker.runtime.models.build import ModelSetupError
    from stoker.runtime.models.context_parallel import DoesNotSplit

    try:
        contract.loss_and_metrics(model, batch)
    except DoesNotSplit as exc:
        raise ModelSetupError(exc.key, f"{arch}: {exc}", fix=exc.fix) from exc
    except StokerError as exc:
        raise ModelSetupError("model.arch", exc.message, fix=exc.fix or "") from exc
    except KeyError as exc:
        key = exc.args[0] if exc.args else None
        if key in _MODALITIES:
            raise _forward_failed(arch, exc, _missing_modality_fix(key)) from exc
        # A member of the data set's own (.npy, .safetensors) or one data.transform
        # adds: the data set says whether it is there, not the config.
        return (
            f"forward not checked (it reads batch[{key!r}], which the data set's members "
            "or data.transform give); the ranks will run it"
        ), False
    except (NotImplementedError, RuntimeError) as exc:
        if 'missing the required "forward"' in str(exc):
            fix = "define forward(self, batch) returning the loss (stoker/model.py)"
            raise _forward_failed(arch, exc, fix) from exc
        if "meta" not in str(exc):
            raise _forward_failed(arch, exc) from exc
        return "", True
    except Exception as exc:
        raise _forward_failed(arch, exc) from exc
    return "", False


def meta_batch(shapes: DataShapes, rows: int, clip: ClipShape | None = None) -> dict[str, Any]:
    """What the loader gives a model, as meta tensors: the modalities it decodes, in the
    shape of `clip` (a bucket's; None: the data's single shape), `valid`, `position`,
    `key` and `skipped`; no generators (there is no meta RNG: the global one serves)."""
    import torch

    video_shape = clip.video_shape if clip is not None else shapes.video_shape
    audio_shape = clip.audio_shape if clip is not None else shapes.audio_shape
    batch: dict[str, Any] = {
        "key": [f"meta-{row}" for row in range(rows)],
        "valid": torch.ones(rows, dtype=torch.bool),
        "position": torch.zeros(rows, dtype=torch.int64),
        "skipped": [],
    }
    if "video" in shapes.modalities:
        batch["video"] = torch.empty((rows, *video_shape), dtype=torch.uint8)
    if "audio" in shapes.modalities:
        batch["audio"] = torch.empty((rows, *audio_shape), dtype=torch.float32)
    if "text" in shapes.modalities:
        batch["text"] = [""] * rows
    if "meta" in shapes.modalities:
        batch["meta"] = [{} for _ in range(rows)]
    if shapes.latents:
        at = shapes.clip_shapes.index(clip) if clip is not None else 0
        latent = shapes.latents[at]
        batch["latent"] = {
            name: torch.empty((rows, *shape), dtype=getattr(torch, latent.dtypes[name]))
            for name, shape in latent.tensors.items()
        }
    return batch


def batch_with_values(
    shapes: DataShapes, rows: int, clip: ClipShape | None = None, device: Any = "cpu"
) -> dict[str, Any]:
    """`meta_batch` with values, on `device` (fake tensors under a FakeTensorMode):
    random uint8 video, audio and latents in [-1, 1], every row valid."""
    import torch

    def filled(value: Any) -> Any:
        if isinstance(value, dict):  # latents, a .safetensors member
            return {k: filled(v) for k, v in value.items()}
        if not isinstance(value, torch.Tensor):
            return value
        if value.dtype == torch.uint8:
            return torch.randint(0, 256, value.shape, dtype=torch.uint8, device=device)
        if value.dtype == torch.bool:
            return torch.ones(value.shape, dtype=torch.bool, device=device)
        if value.dtype.is_floating_point:
            return (torch.rand(value.shape, device=device) * 2 - 1).to(value.dtype)
        return torch.zeros(value.shape, dtype=value.dtype, device=device)

    return {key: filled(value) for key, value in meta_batch(shapes, rows, clip).items()}


def _described(shapes: DataShapes, clip: ClipShape) -> str:
    """'video [16, 3, 256, 448], audio [1, 32000]': a bucket's sample shapes."""
    parts = []
    if "video" in shapes.modalities:
        parts.append(f"video {list(clip.video_shape)}")
    if "audio" in shapes.modalities:
        parts.append(f"audio {list(clip.audio_shape)}")
    if shapes.latents:
        latent = shapes.latents[shapes.clip_shapes.index(clip)]
        parts += [f"latent {name} {list(shape)}" for name, shape in latent.tensors.items()]
    return ", ".join(parts) or f"clip_seconds {clip.clip_seconds:g}"


# What data.modalities decides is in the batch (stoker/model.py).
_MODALITIES = ("video", "audio", "text", "meta", "latent")


def _missing_modality_fix(key: str) -> str:
    return (
        f"add {key} to data.modalities (the data set must hold it: `stoker data inspect`), "
        f"or do not read batch[{key!r}] in forward"
    )


def _forward_failed(arch: str, exc: BaseException, fix: str | None = None) -> Exception:
    import traceback

    from stoker.runtime.models.build import ModelSetupError

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" [{frames[-1].filename}:{frames[-1].lineno}]" if frames else ""
    return ModelSetupError(
        "model.arch",
        f"{arch}: forward(batch) on a batch of the data's shapes raised "
        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}{where}",
        fix=fix or "fix forward for the batch stoker gives (docs/bring-your-own.md: the batch)",
    )


if __name__ == "__main__":
    sys.exit(main())
