"""Does a sampled clip look like the synthetic data (one shape moving over a dark
background, a tone whose pitch follows its height)? The measures of [6/8]'s demo:

- per frame, each pixel's distance (RGB in [0, 1], Euclidean) to the frame's median
  colour: the background share (within BACKGROUND_DISTANCE) and the foreground share
  (farther than FOREGROUND_DISTANCE), averaged over the frames;
- compactness: of the foreground pixels, the share within NEAR_PX (on each axis) of
  their frame's centroid;
- the audio's energy inside the data's tone range (FREQ_RANGE_HZ).

A clip is like the data when its background share is at least 0.85, its foreground share
between 0.003 and 0.15 and at least 80% of its foreground near the centroid; its audio
when at least 80% of its energy lies in the tone range. The data's own clips measure
about 0.94, 0.05, 100% (64 px frames).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from stoker.data.synthetic.shapes import FREQ_RANGE_HZ

BACKGROUND_DISTANCE = 0.15
FOREGROUND_DISTANCE = 0.3
NEAR_PX = 10
# A clip like the data's: at least this background share, a foreground share in this
# range, at least this share of it near its centroid; audio at least this share in band.
MIN_BACKGROUND = 0.85
FOREGROUND_RANGE = (0.003, 0.15)
MIN_NEAR = 0.8
MIN_IN_BAND = 0.8


@dataclass(frozen=True)
class ClipMeasures:
    background: float
    foreground: float
    near: float
    in_band: float | None
    """The audio's energy share in FREQ_RANGE_HZ; None for a clip without audio."""

    def looks_like_the_data(self) -> bool:
        low, high = FOREGROUND_RANGE
        return (
            self.background >= MIN_BACKGROUND
            and low <= self.foreground <= high
            and self.near >= MIN_NEAR
        )

    def sounds_like_the_data(self) -> bool:
        return self.in_band is not None and self.in_band >= MIN_IN_BAND


def frame_measures(frames: npt.NDArray[np.uint8]) -> tuple[float, float, float]:
    """(background share, foreground share, share of the foreground near its
    centroid) of frames [T, H, W, 3]."""
    rgb = frames.astype(np.float64) / 255.0
    backgrounds, foregrounds, near, total = [], [], 0, 0
    for frame in rgb:
        median = np.median(frame.reshape(-1, 3), axis=0)
        distance = np.linalg.norm(frame - median, axis=-1)
        backgrounds.append(float(np.mean(distance <= BACKGROUND_DISTANCE)))
        fore = distance > FOREGROUND_DISTANCE
        foregrounds.append(float(np.mean(fore)))
        ys, xs = np.nonzero(fore)
        if len(xs):
            cy, cx = ys.mean(), xs.mean()
            near += int(np.sum((np.abs(ys - cy) <= NEAR_PX) & (np.abs(xs - cx) <= NEAR_PX)))
            total += len(xs)
    return float(np.mean(backgrounds)), float(np.mean(foregrounds)), near / total if total else 0.0


def in_band_share(wave: npt.NDArray[np.floating], sample_rate: int) -> float:
    """The share of the waveform's energy (mono mix, [samples] or [samples, channels])
    between FREQ_RANGE_HZ's ends."""
    mono = wave.mean(axis=1) if wave.ndim == 2 else wave
    power = np.abs(np.fft.rfft(mono.astype(np.float64))) ** 2
    freqs = np.fft.rfftfreq(len(mono), 1.0 / sample_rate)
    low, high = FREQ_RANGE_HZ
    total = float(power[1:].sum())  # the DC term is no tone
    return float(power[(freqs >= low) & (freqs <= high)].sum()) / total if total else 0.0


def measure_clip(path: Path) -> ClipMeasures:
    """The measures of a sampled mp4 (H.264 video, AAC audio), at the model's own size:
    an mp4 enlarged for viewing (its folder's samples.json `mp4_scale`) is read at each
    block's centre pixel."""
    import json

    import av

    record = path.with_name("samples.json")
    scale = json.loads(record.read_text()).get("mp4_scale", 1) if record.is_file() else 1
    with av.open(str(path)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    frames = frames[:, scale // 2 :: scale, scale // 2 :: scale]
    background, foreground, near = frame_measures(frames)
    in_band = None
    with av.open(str(path)) as container:
        if container.streams.audio:
            stream = container.streams.audio[0]
            chunks = [f.to_ndarray() for f in container.decode(audio=0)]
            if chunks:
                wave = np.concatenate(chunks, axis=-1).T  # [samples, channels] (planar)
                in_band = in_band_share(wave, stream.rate)
    return ClipMeasures(background, foreground, near, in_band)
