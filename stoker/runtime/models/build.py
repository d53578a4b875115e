"""The built-in models' factories (`model.arch: av_dit` / `audio_ar`, through the same
registry as a user's: stoker/runtime/models/registry.py), and their shape checks.

The data config fixes every clip's shape (the loader crops and resizes to
it): T = round(clip_seconds * fps) frames of resolution [H, W], and
N = round(clip_seconds * sample_rate) samples of `channels` channels. The
av_dit needs T, H, W and N to divide into its patches; a config whose shapes
do not is refused here, before a job spends anything, with the values to use.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from stoker.errors import StokerError
from stoker.runtime.models.audio_ar import AudioAR
from stoker.runtime.models.av_dit import AVDiT
from stoker.runtime.models.sizes import audio_ar_size, av_dit_size

if TYPE_CHECKING:  # pydantic stays optional for the benchmarks on GPU nodes
    from stoker.config import DataConfig
    from stoker.model import DataShapes


class ModelSetupError(StokerError, ValueError):
    """The model cannot be built from the config: `key` is the setting to change
    (`data.resolution`, `model.arch`, `model.args.width`), `fix` what to do. A
    ValueError too, for callers that build models outside stoker's runs (benchmarks)."""

    def __init__(self, key: str, message: str, *, fix: str) -> None:
        super().__init__(message, fix=fix)
        self.key = key


class DataDoesNotFitModel(ModelSetupError):
    """The data's shapes do not fit the model's patches or inputs."""


def clip_frames(data: DataConfig | DataShapes) -> int:
    """Frames per clip, as the loader decodes them."""
    return round(data.clip_seconds * data.fps)


def clip_samples(data: DataConfig | DataShapes) -> int:
    """Audio samples per clip (per channel), as the loader decodes them."""
    return round(data.clip_seconds * data.sample_rate)


def av_dit(data: DataShapes, size: str = "tiny") -> AVDiT:
    """The built-in `model.arch: av_dit` (the factory contract of stoker/model.py)."""
    return build_av_dit(size, data)


def audio_ar(data: DataShapes, size: str = "tiny") -> AudioAR:
    """The built-in `model.arch: audio_ar`."""
    return build_audio_ar(size, data)


def build_av_dit(size_name: str, data: DataConfig | DataShapes) -> AVDiT:
    size = av_dit_size(size_name)
    what = f"the {size_name} av_dit"
    has_video, has_audio = "video" in data.modalities, "audio" in data.modalities
    if not (has_video or has_audio):
        raise DataDoesNotFitModel(
            "data.modalities",
            f"data.modalities {list(data.modalities)} has neither 'video' nor 'audio'; "
            f"{what} needs at least one",
            fix="add 'video' and/or 'audio'",
        )
    pt, ph, pw = size.video_patch
    video = audio = None
    if has_video:
        height, width = data.resolution
        if height % ph or width % pw:
            # The nearest multiples, halves rounded up.
            fixed = [max(ph, (height + ph // 2) // ph * ph), max(pw, (width + pw // 2) // pw * pw)]
            raise DataDoesNotFitModel(
                "data.resolution",
                f"data.resolution {[height, width]} is not a multiple of {what}'s patch {ph}x{pw}",
                fix=f"use data.resolution={fixed}",
            )
        frames = clip_frames(data)
        if frames < pt or frames % pt:
            raise DataDoesNotFitModel(
                "data.clip_seconds",
                f"data.clip_seconds {data.clip_seconds} x data.fps {data.fps} gives {frames} "
                f"frames, not a positive multiple of {what}'s temporal patch {pt}",
                fix=f"use data.clip_seconds={_fitting_clip_seconds(data, size.audio_patch, pt)}",
            )
        video = (frames, height, width)
    if has_audio:
        samples = clip_samples(data)
        if samples < size.audio_patch or samples % size.audio_patch:
            raise DataDoesNotFitModel(
                "data.clip_seconds",
                f"data.clip_seconds {data.clip_seconds} x data.sample_rate {data.sample_rate} "
                f"gives {samples} audio samples, not a positive multiple of {what}'s audio "
                f"patch of {size.audio_patch} samples",
                fix=f"use data.clip_seconds={_fitting_clip_seconds(data, size.audio_patch, pt)}",
            )
        audio = (data.channels, samples)
    return AVDiT(size, video=video, audio=audio, fps=data.fps, sample_rate=data.sample_rate)


def build_audio_ar(size_name: str, data: DataConfig | DataShapes) -> AudioAR:
    size = audio_ar_size(size_name)
    if "audio" not in data.modalities:
        raise DataDoesNotFitModel(
            "data.modalities",
            f"data.modalities {list(data.modalities)} has no 'audio'; the audio_ar models "
            "audio samples",
            fix="add 'audio' to data.modalities, or use model.arch=av_dit",
        )
    samples = clip_samples(data)
    if samples < 2:
        raise DataDoesNotFitModel(
            "data.clip_seconds",
            f"data.clip_seconds {data.clip_seconds} x data.sample_rate {data.sample_rate} "
            f"gives {samples} audio samples; the audio_ar needs at least 2",
            fix=f"use data.clip_seconds={2 / data.sample_rate:g} or more",
        )
    return AudioAR(size, samples=samples)


def _fitting_clip_seconds(data: DataConfig | DataShapes, audio_patch: int, pt: int) -> float:
    """The clip length nearest data.clip_seconds whose frames divide by pt
    (with video) and whose samples divide by audio_patch (with audio)."""
    has_video, has_audio = "video" in data.modalities, "audio" in data.modalities
    # Candidates: multiples of the shorter of one temporal patch and one audio patch.
    step = min(
        pt / data.fps if has_video else math.inf,
        audio_patch / data.sample_rate if has_audio else math.inf,
    )
    best: float | None = None
    for k in range(1, 100_000):
        seconds = round(k * step, 6)
        frames, samples = round(seconds * data.fps), round(seconds * data.sample_rate)
        fits_video = not has_video or (frames >= pt and frames % pt == 0)
        fits_audio = not has_audio or (samples >= audio_patch and samples % audio_patch == 0)
        if fits_video and fits_audio:
            if best is None or abs(seconds - data.clip_seconds) < abs(best - data.clip_seconds):
                best = seconds
            if seconds > data.clip_seconds:
                break
    return best if best is not None else data.clip_seconds
