"""What a generated sample's arrays must be before stoker/data/media/sample_media.py encodes
them: video uint8 [T, 3, H, W] RGB and audio float [C, N] in [-1, 1], as stoker's
decoders return them, from numpy arrays or torch tensors on any device. Each check's
error names the bad value and the fix.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt


def video_frames(video: Any) -> npt.NDArray[np.uint8]:
    """`video` uint8 [T, 3, H, W] (numpy or torch), checked, as [T, H, W, 3] numpy."""
    array = as_numpy(video)
    if array.ndim != 4 or array.shape[1] != 3 or 0 in array.shape:
        raise ValueError(
            f"video must be shaped [T, 3, H, W] (RGB, channels second, as stoker's "
            f"decoder returns), got shape {tuple(array.shape)}; fix: frames shaped "
            "[T, H, W, 3] become [T, 3, H, W] with video.permute(0, 3, 1, 2) "
            "(torch) or video.transpose(0, 3, 1, 2) (numpy)"
        )
    if array.dtype != np.uint8:
        raise ValueError(
            f"video dtype must be uint8 (0-255), got {array.dtype}; fix: floats in "
            "[0, 1] become uint8 with (video.clamp(0, 1) * 255).round().to(torch.uint8)"
            " (torch) or (np.clip(video, 0, 1) * 255).round().astype(np.uint8) (numpy)"
        )
    return np.ascontiguousarray(array.transpose(0, 2, 3, 1))


def audio_samples(audio: Any) -> npt.NDArray[np.float32]:
    """`audio` float [C, N] (numpy or torch; C = 1 or 2), checked, as float32 numpy
    clipped to [-1, 1] with NaN as 0."""
    array = as_numpy(audio)
    if array.ndim != 2 or array.shape[0] not in (1, 2) or array.shape[1] == 0:
        raise ValueError(
            f"audio must be shaped [C, N] with C = 1 or 2 channels and N >= 1 samples, "
            f"got shape {tuple(array.shape)}; fix: a mono [N] waveform is audio[None], "
            "[N, C] is audio.T, more channels must be mixed down"
        )
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(
            f"audio dtype must be float (samples in [-1, 1]), got {array.dtype}; fix: "
            "int16 samples become float with audio.astype(np.float32) / 32768"
        )
    out = np.nan_to_num(array.astype(np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
    return np.ascontiguousarray(np.clip(out, -1.0, 1.0))


def as_numpy(value: Any) -> np.ndarray[Any, Any]:
    """A numpy array from a numpy array or a torch tensor (on any device; bfloat16,
    which numpy lacks, becomes float32)."""
    if hasattr(value, "detach"):  # torch, without importing it
        value = value.detach().cpu()
        try:
            return np.asarray(value.numpy())
        except TypeError:  # "Got unsupported ScalarType BFloat16"
            return np.asarray(value.float().numpy())
    return np.asarray(value)


def frame_rate(fps: float | Fraction) -> Fraction:
    """`fps` as a Fraction; a float becomes the nearest ratio with a denominator up to
    1001 (29.97 becomes 2997/100: pass Fraction(30000, 1001) for NTSC's rate)."""
    rate = Fraction(fps).limit_denominator(1001) if isinstance(fps, float) else Fraction(fps)
    if rate <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    return rate
