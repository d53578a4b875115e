"""A synthetic AV data set a model can learn from: real H.264 and FLAC whose sound
follows the picture.

Each clip shows one shape (square or circle, of a named colour) bouncing on a dark
background. Its audio is a sine tone whose pitch follows the shape's height in the
frame (log scale, FREQ_RANGE_HZ: higher in the frame is higher in pitch) and whose
stereo pan follows its horizontal position (equal-power). The motion is piecewise
linear and the phase is the integral of the frequency, so the tone glides without
clicks. A caption and a metadata record describe each clip.

Clip `i` draws everything from `numpy.random.default_rng([seed, i])`, so equal
arguments give byte-equal shards (x264 and libFLAC are deterministic) and a clip
does not depend on how many clips come before it or which process encodes it.

    synth_dataset("/data/toy", clips=64)   # 64 x 4 s at 64x64: 1.3 s on one core
    synth_dataset("s3://bucket/toy", clips=10_000, size=(128, 128), workers=8)
"""

from __future__ import annotations

import json
import math
import multiprocessing
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
import numpy.typing as npt

from stoker.data.format.shard_format import (
    MANIFEST_NAME,
    SHARDS_DIR,
    Manifest,
    ShardIndex,
    ShardRecord,
    build_manifest,
    dump,
    join,
    parse_manifest,
    record_for,
    shard_file_name,
)
from stoker.data.media.h264_flac import encode_flac, encode_h264
from stoker.data.media.probe import probe_audio, probe_video
from stoker.data.write.shard_writer import SampleToWrite, write_json_atomic, write_shard
from stoker.errors import StokerError

CREATED_BY = "stoker data synth"
TARGET_SHARD_BYTES = 64 * 1024 * 1024
"""Default shard size: large enough that per-object request cost is amortised."""
FREQ_RANGE_HZ = (200.0, 2000.0)
"""Tone pitch at the bottom and the top of the frame."""
MIN_SIDE = 16
MIN_SAMPLE_RATE = 8000  # Nyquist must stay above the top of FREQ_RANGE_HZ with room.
MAX_SAMPLE_RATE = 192_000
MAX_FPS = 240

# Named colours, so a caption can say what a frame shows. All bright against the
# background (at least one channel >= 200; the background stays below 40).
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 240),
    "yellow": (240, 220, 40),
    "cyan": (40, 220, 230),
    "magenta": (220, 50, 220),
    "orange": (245, 140, 30),
    "white": (235, 235, 235),
}
SHAPES = ("square", "circle")
_AMPLITUDE = 0.5
_FADE_S = 0.005  # a 5 ms fade in and out: no click at the clip's edges


@dataclass(frozen=True)
class _Params:
    """What every clip shares; picklable for worker processes."""

    seed: int
    frames: int
    height: int
    width: int
    fps: int
    sample_rate: int


@dataclass(frozen=True)
class _Motion:
    """One clip's draw: shape, colours and a bouncing path in pixel coordinates."""

    shape: str
    colour: str
    background: tuple[int, int, int]
    radius: float
    """Circle radius, or half the square's side, in pixels."""
    lo: tuple[float, float]
    hi: tuple[float, float]
    """Range of the centre (x, y): the shape touches an edge at either end."""
    start: tuple[float, float]
    velocity: tuple[float, float]
    """Pixels per second, (x, y); y grows downwards as in the image."""

    def centre(self, t: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], ...]:
        """Centre (x, y) at times `t` seconds: straight lines reflected at the edges."""
        return tuple(
            _reflect(self.start[a] + self.velocity[a] * t, self.lo[a], self.hi[a]) for a in (0, 1)
        )


def _reflect(p: npt.NDArray[np.float64], lo: float, hi: float) -> npt.NDArray[np.float64]:
    span = hi - lo
    u = np.mod(p - lo, 2 * span)
    return lo + np.where(u <= span, u, 2 * span - u)


def _draw(params: _Params, index: int) -> _Motion:
    rng = np.random.default_rng([params.seed, index])
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    colour = list(PALETTE)[int(rng.integers(len(PALETTE)))]
    background = tuple(int(c) for c in rng.integers(0, 40, size=3))
    radius = float(min(params.height, params.width) * rng.uniform(0.08, 0.15))
    radius = max(radius, 2.0)
    # Pixel centres sit at 0..W-1; the drawn edge reaches radius + 0.5.
    lo = (radius, radius)
    hi = (params.width - 1 - radius, params.height - 1 - radius)
    start = (float(rng.uniform(lo[0], hi[0])), float(rng.uniform(lo[1], hi[1])))
    # Each axis crosses 0.25 to 0.75 of its range per second, never standing
    # still: every clip moves both across (pan) and up or down (pitch).
    velocity = tuple(
        float(rng.choice((-1.0, 1.0)) * rng.uniform(0.25, 0.75) * (hi[a] - lo[a])) for a in (0, 1)
    )
    return _Motion(
        shape=shape,
        colour=colour,
        background=(background[0], background[1], background[2]),
        radius=radius,
        lo=lo,
        hi=hi,
        start=start,
        velocity=(velocity[0], velocity[1]),
    )


def _frames(params: _Params, motion: _Motion) -> Iterator[npt.NDArray[np.uint8]]:
    """RGB frames; frame k shows the shape at t = k / fps (its presentation time)."""
    yy, xx = np.mgrid[0 : params.height, 0 : params.width].astype(np.float64)
    t = np.arange(params.frames, dtype=np.float64) / params.fps
    cx, cy = motion.centre(t)
    background = np.array(motion.background, dtype=np.float64)
    colour = np.array(PALETTE[motion.colour], dtype=np.float64)
    edge = motion.radius + 0.5
    for k in range(params.frames):
        # Coverage in [0, 1] with a one-pixel soft edge: sub-pixel motion stays smooth.
        if motion.shape == "circle":
            dist = np.hypot(xx - cx[k], yy - cy[k])
            cover = np.clip(edge - dist, 0.0, 1.0)
        else:
            cover = np.clip(edge - np.abs(xx - cx[k]), 0.0, 1.0) * np.clip(
                edge - np.abs(yy - cy[k]), 0.0, 1.0
            )
        rgb = background + cover[..., None] * (colour - background)
        yield np.rint(rgb).astype(np.uint8)


def frequency_for_height(height_fraction: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Tone pitch in Hz for a height in the frame: 0 = bottom, 1 = top (log scale)."""
    low, high = FREQ_RANGE_HZ
    return low * (high / low) ** np.clip(height_fraction, 0.0, 1.0)


def _waveform(params: _Params, motion: _Motion) -> npt.NDArray[np.float64]:
    """Stereo (samples, 2): pitch follows height, equal-power pan follows x."""
    n = round(params.frames * params.sample_rate / params.fps)
    t = np.arange(n, dtype=np.float64) / params.sample_rate
    cx, cy = motion.centre(t)
    up = (motion.hi[1] - cy) / (motion.hi[1] - motion.lo[1])
    right = (cx - motion.lo[0]) / (motion.hi[0] - motion.lo[0])
    freq = frequency_for_height(up)
    # Phase is the running integral of the frequency: no jumps, no clicks.
    phase = 2 * np.pi * np.cumsum(freq) / params.sample_rate
    tone = _AMPLITUDE * np.sin(phase)
    fade = min(n // 2, max(1, round(_FADE_S * params.sample_rate)))
    ramp = np.linspace(0.0, 1.0, fade, endpoint=False)
    tone[:fade] *= ramp
    tone[n - fade :] *= ramp[::-1]
    angle = right * (np.pi / 2)
    return np.stack([tone * np.cos(angle), tone * np.sin(angle)], axis=1)


def _caption(params: _Params, motion: _Motion) -> str:
    vx, vy = motion.velocity
    vertical = "up" if vy < 0 else "down"
    horizontal = "right" if vx > 0 else "left"
    pitch = "rises" if vy < 0 else "falls"
    duration = params.frames / params.fps
    bounces = any(
        not motion.lo[a] <= motion.start[a] + motion.velocity[a] * duration <= motion.hi[a]
        for a in (0, 1)
    )
    motion_text = f"a {motion.colour} {motion.shape} moving {vertical} and to the {horizontal}"
    if bounces:
        motion_text += ", bouncing off the edges"
    return f"{motion_text}; the tone {pitch} and pans {horizontal}"


def _metadata(params: _Params, index: int, motion: _Motion) -> dict[str, Any]:
    return {
        "clip": index,
        "seed": params.seed,
        "shape": motion.shape,
        "colour": motion.colour,
        "rgb": list(PALETTE[motion.colour]),
        "background_rgb": list(motion.background),
        "radius_px": round(motion.radius, 4),
        "start_px": {"x": round(motion.start[0], 4), "y": round(motion.start[1], 4)},
        "velocity_px_s": {"x": round(motion.velocity[0], 4), "y": round(motion.velocity[1], 4)},
        "frequency_hz": {"bottom": FREQ_RANGE_HZ[0], "top": FREQ_RANGE_HZ[1], "scale": "log"},
        "pan": "equal-power, left edge = left channel only",
        "width": params.width,
        "height": params.height,
        "fps": params.fps,
        "frames": params.frames,
        "sample_rate": params.sample_rate,
    }


@dataclass(frozen=True)
class ClipArrays:
    """One synthetic clip as arrays, before any media encoding (no PyAV needed)."""

    video: npt.NDArray[np.uint8]
    """[T, H, W, 3] RGB frames, frame k at t = k / fps."""
    audio: npt.NDArray[np.float64]
    """[N, 2] stereo samples in [-1, 1]."""
    caption: str
    metadata: dict[str, Any]


def clip_arrays(
    index: int,
    *,
    seconds: float,
    size: tuple[int, int] = (64, 64),
    fps: int = 8,
    sample_rate: int = 16000,
    seed: int = 0,
) -> ClipArrays:
    """Clip `index` of `synth_dataset(..., seed=seed)` with these settings, as the
    arrays its mp4 and flac encode (stoker/data/synthetic/shapes_latents.py encodes them
    into latents instead). StokerError for settings `synth_dataset` refuses."""
    params = _check(1, seconds, size, fps, sample_rate, None, 1, seed)
    motion = _draw(params, index)
    return ClipArrays(
        video=np.stack(list(_frames(params, motion))),
        audio=_waveform(params, motion),
        caption=_caption(params, motion),
        metadata=_metadata(params, index, motion),
    )


def _make_sample(params: _Params, index: int) -> SampleToWrite:
    """Clip `index`, encoded and probed: what write_shard takes. Runs in workers."""
    motion = _draw(params, index)
    mp4 = encode_h264(
        _frames(params, motion), fps=params.fps, width=params.width, height=params.height
    )
    flac = encode_flac(_waveform(params, motion), sample_rate=params.sample_rate)
    meta = json.dumps(_metadata(params, index, motion), sort_keys=True).encode()
    return SampleToWrite(
        key=f"clip-{index:06d}",
        members={
            "mp4": mp4,
            "flac": flac,
            "json": meta,
            "txt": _caption(params, motion).encode(),
        },
        # The probe's answer, not the requested values: the index states what a
        # reader will find.
        video=probe_video(mp4, "mp4"),
        audio=probe_audio(flac, "flac"),
    )


def _sample_bytes(sample: SampleToWrite) -> int:
    return sum(len(data) for data in sample.members.values())


def synth_dataset(
    url: str,
    *,
    clips: int = 64,
    seconds: float = 4.0,
    size: tuple[int, int] = (64, 64),
    fps: int = 8,
    sample_rate: int = 16000,
    seed: int = 0,
    samples_per_shard: int | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    workers: int = 1,
) -> Manifest:
    """Write `clips` synthetic clips as a data set at fsspec `url`; return its manifest.

    `size` is (height, width), both even. Each clip lasts round(seconds * fps)
    frames, its audio exactly as long. `samples_per_shard` defaults to what makes
    ~64 MB shards (measured on clip 0). An existing data set (a manifest.json at
    `url`) is an error unless `overwrite`; then its manifest goes first, so a
    rewrite cut short leaves no manifest pointing at changed shards, and its shards
    that the new manifest does not list go last. `progress(n)` is called with the
    number of clips written so far. `workers` > 1 encodes in that many processes
    (spawned, never forked: the caller may hold threads).
    """
    # fsspec ships no type hints; pyproject's mypy overrides may not list it yet.
    from fsspec.core import url_to_fs  # type: ignore[import-untyped, unused-ignore]

    params = _check(clips, seconds, size, fps, sample_rate, samples_per_shard, workers, seed)
    fs, root = url_to_fs(url, **(storage_options or {}))
    manifest_path = join(root, MANIFEST_NAME)
    old_shards: list[ShardRecord] = []
    if fs.exists(manifest_path):
        if not overwrite:
            raise StokerError(
                f"{url} already holds a data set ({MANIFEST_NAME} exists); nothing was written",
                fix="pass --overwrite (overwrite=True) to replace it, or choose another path",
            )
        old_shards = _old_shards(fs, manifest_path)
        fs.rm(manifest_path)

    samples = _samples(params, clips, workers)
    try:
        records, indexes = _write_shards(fs, root, samples, clips, samples_per_shard, progress)
    finally:
        samples.close()  # stops the worker processes if a write failed
    manifest = build_manifest(records, indexes, created_by=CREATED_BY)
    write_json_atomic(fs, manifest_path, dump(manifest))

    kept = {r.path for r in records}
    for old in old_shards:
        if old.path not in kept:
            for path in (old.path, old.index):
                # Only what a data set keeps under shards/: a manifest is user input.
                inside = path.startswith(f"{SHARDS_DIR}/") and ".." not in path.split("/")
                if inside and fs.exists(join(root, path)):
                    fs.rm(join(root, path))
    return manifest


def synth_media_files(
    url: str,
    *,
    clips: int = 64,
    seconds: float = 4.0,
    size: tuple[int, int] = (64, 64),
    fps: int = 8,
    sample_rate: int = 16000,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    workers: int = 1,
) -> int:
    """The same clips as `synth_dataset`, as loose files (`clip-000000.mp4`, `.flac`,
    `.json`, `.txt`) under `url`: raw media for `stoker data pack`. Returns bytes written."""
    from fsspec.core import url_to_fs  # type: ignore[import-untyped, unused-ignore]

    params = _check(clips, seconds, size, fps, sample_rate, None, workers, seed)
    fs, root = url_to_fs(url, **(storage_options or {}))
    fs.makedirs(root, exist_ok=True)
    written = 0
    samples = _samples(params, clips, workers)
    try:
        for done, sample in enumerate(samples, start=1):
            for ext, data in sample.members.items():
                fs.pipe_file(join(root, f"{sample.key}.{ext}"), data)
                written += len(data)
            if progress is not None:
                progress(done)
    finally:
        samples.close()
    return written


def _write_shards(
    fs: Any,
    root: str,
    samples: Iterator[SampleToWrite],
    clips: int,
    samples_per_shard: int | None,
    progress: Callable[[int], None] | None,
) -> tuple[list[ShardRecord], list[ShardIndex]]:
    first = next(samples)
    per_shard = samples_per_shard or max(1, TARGET_SHARD_BYTES // max(1, _sample_bytes(first)))
    pending = _chain_first(first, samples)
    done = 0

    def counted(batch: Iterator[SampleToWrite]) -> Iterator[SampleToWrite]:
        nonlocal done
        for sample in batch:
            yield sample
            done += 1
            if progress is not None:
                progress(done)

    records: list[ShardRecord] = []
    indexes: list[ShardIndex] = []
    for number in range(math.ceil(clips / per_shard)):
        relative = f"{SHARDS_DIR}/{shard_file_name(number)}"
        index = write_shard(fs, join(root, relative), counted(islice(pending, per_shard)))
        records.append(record_for(index, relative))
        indexes.append(index)
    return records, indexes


def _check(
    clips: int,
    seconds: float,
    size: tuple[int, int],
    fps: int,
    sample_rate: int,
    samples_per_shard: int | None,
    workers: int,
    seed: int,
) -> _Params:
    height, width = size
    if height < MIN_SIDE or width < MIN_SIDE:
        raise StokerError(
            f"size {height}x{width} (HxW) is too small to draw a moving shape in",
            fix=f"use at least {MIN_SIDE}x{MIN_SIDE}, e.g. --size 64x64",
        )
    if height % 2 or width % 2:
        raise StokerError(
            f"size {height}x{width} (HxW) has an odd side: H.264 in yuv420p needs both even",
            fix=f"use an even size, e.g. --size {height + height % 2}x{width + width % 2}",
        )
    if clips < 1:
        raise StokerError(f"clips {clips}: a data set needs at least one clip", fix="--clips 1")
    if not 1 <= fps <= MAX_FPS:
        raise StokerError(f"fps {fps} is out of range", fix=f"use 1 to {MAX_FPS}, e.g. --fps 8")
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise StokerError(
            f"sample rate {sample_rate} Hz is out of range: the tone reaches "
            f"{FREQ_RANGE_HZ[1]:g} Hz",
            fix=f"use {MIN_SAMPLE_RATE} to {MAX_SAMPLE_RATE}, e.g. --sample-rate 16000",
        )
    frames = round(seconds * fps) if math.isfinite(seconds) else 0
    if frames < 1:
        raise StokerError(
            f"seconds {seconds} at {fps} fps is less than one frame",
            fix=f"use at least {1 / fps:g} seconds",
        )
    if samples_per_shard is not None and samples_per_shard < 1:
        raise StokerError(
            f"samples per shard {samples_per_shard} must be at least 1",
            fix="leave it unset for ~64 MB shards",
        )
    if workers < 1:
        raise StokerError(f"workers {workers} must be at least 1", fix="--workers 1")
    if seed < 0:
        raise StokerError(f"seed {seed} must be >= 0 (numpy seeds)", fix="--seed 0")
    return _Params(
        seed=seed, frames=frames, height=height, width=width, fps=fps, sample_rate=sample_rate
    )


def _old_shards(fs: Any, manifest_path: str) -> list[ShardRecord]:
    """Shards of the data set being overwritten; none if its manifest is unreadable."""
    try:
        return parse_manifest(fs.cat_file(manifest_path), manifest_path).shards
    except StokerError:
        return []


def _chain_first(first: SampleToWrite, rest: Iterator[SampleToWrite]) -> Iterator[SampleToWrite]:
    yield first
    yield from rest


def _samples(params: _Params, clips: int, workers: int) -> Generator[SampleToWrite, None, None]:
    """Clips 0..clips-1 in order, encoded here or in `workers` spawned processes."""
    if workers == 1 or clips < 2:
        for index in range(clips):
            yield _make_sample(params, index)
        return
    # A bounded window of submitted clips: memory stays flat however many clips,
    # and the encoders keep working while a finished shard uploads.
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=min(workers, clips), mp_context=context)
    try:
        indexes = iter(range(clips))
        window: deque[Future[SampleToWrite]] = deque(
            pool.submit(_make_sample, params, i) for i in islice(indexes, 4 * workers)
        )
        while window:
            sample = window.popleft().result()
            following = next(indexes, None)
            if following is not None:
                window.append(pool.submit(_make_sample, params, following))
            yield sample
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
