"""The data set behind `data.url: null`: a synthetic AV set (stoker.data.synthetic.shapes:
bouncing shapes with tones that follow them) made on first use under
$STOKER_HOME/data/, one per frame size, fps and sample rate, and reused after.
With `data.modalities: [latent]` it is the same clips as latents instead
(stoker/data/synthetic/shapes_latents.py: no media, no PyAV), one set per frame size, fps,
sample rate, channels and clip length.

Made once even when many ranks or `stoker run` calls start together: the first
holds a lock file while it writes into a temporary folder, then renames it into
place; the others wait on the lock and find it done. On a cluster, STOKER_HOME
must be on a filesystem the nodes share (as the run folders are).
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Callable
from pathlib import Path

from stoker.config import DataConfig
from stoker.home import stoker_home

CLIPS = 256
# Clips twice the training clip (at least 2 s): random offsets then vary.
MIN_SECONDS = 2.0


# The held-out split: other clips (another seed), fewer of them.
SPLITS = {"train": (0, CLIPS), "eval": (1, 32)}


def synthetic_data_path(data: DataConfig, split: str = "train") -> Path:
    height, width = data.resolution
    _, clips = SPLITS[split]
    suffix = "" if split == "train" else f"-{split}"
    name = f"synth-{height}x{width}-{data.fps}fps-{data.sample_rate}hz-{clips}{suffix}"
    if "latent" in data.modalities:
        name = (
            f"synth-latent-{height}x{width}-{data.fps}fps-{data.sample_rate}hz-"
            f"{data.channels}ch-{data.clip_seconds:g}s-{clips}{suffix}"
        )
    return stoker_home() / "data" / name


def ensure_synthetic_data(
    data: DataConfig, progress: Callable[[str], None] | None = None, *, split: str = "train"
) -> Path:
    """The synthetic data set (`split` train or eval) for these data
    settings, written if missing: latents with data.modalities [latent], else media."""
    path = synthetic_data_path(data, split)
    seed, clips = SPLITS[split]
    if (path / "manifest.json").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (path / "manifest.json").is_file():
            return path  # another process made it while this one waited
        if progress:
            progress(f"writing a synthetic data set ({clips} clips) to {path} (first use)")
        tmp = path.with_name(path.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        if "latent" in data.modalities:
            from stoker.data.synthetic.shapes_latents import write_synthetic_latents

            write_synthetic_latents(tmp, data, clips=clips, seed=seed)
        else:
            from stoker.data.synthetic.shapes import synth_dataset

            synth_dataset(
                str(tmp),
                clips=clips,
                seed=seed,
                seconds=max(MIN_SECONDS, 2 * data.clip_seconds),
                size=(data.resolution[0], data.resolution[1]),
                fps=data.fps,
                sample_rate=data.sample_rate,
                workers=2,
            )
        tmp.rename(path)
    return path
