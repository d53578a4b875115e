"""The built-in models' factories (`model.arch: av_dit` / `audio_ar`, through the same
registry as a user's: stoker/runtime/models/registry.py), their shape checks, and the
data's shapes (`DataShapes`) from the data config.

The data config fixes each clip's shape (the loader crops and resizes to it): T =
round(clip_seconds * fps) frames of resolution [H, W], and N = round(clip_seconds *
sample_rate) samples of `channels` channels; with `data.buckets`, one such shape per
bucket. The av_dit needs T, H, W and N of every shape to divide into its patches; a
config whose shapes do not is refused here, before a job spends anything, with the
setting (the bucket) and the values to use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from stoker.errors import StokerError
from stoker.model import ClipShape, DataShapes
from stoker.runtime.models.audio_ar import AudioAR
from stoker.runtime.models.av_dit import PREDICTIONS, AVDiT, Prediction
from stoker.runtime.models.conditioning import NO_CONDITION, ConditionArgs
from stoker.runtime.models.sizes import audio_ar_size, av_dit_size

if TYPE_CHECKING:  # pydantic stays optional for the benchmarks on GPU nodes
    from stoker.config import DataConfig
    from stoker.config.schema import BucketConfig


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


def data_shapes(data: DataConfig) -> DataShapes:
    """The shapes of a run's clips with these data settings: with `data.buckets`, each
    bucket's, and the largest of each dimension in the single-shape fields. On latents
    (data.modalities [latent]), as the latent data sets' manifests record them."""
    if "latent" in getattr(data, "modalities", ()):
        from stoker.runtime.models.latent_data import latent_data_shapes

        return latent_data_shapes(data)
    base = ClipShape(
        clip_seconds=data.clip_seconds,
        frames=clip_frames(data),
        resolution=_pair(data.resolution),
        channels=data.channels,
        samples=clip_samples(data),
    )
    # stoker bench step's own data settings (no pydantic on a GPU node) have no buckets.
    configured: list[BucketConfig] = getattr(data, "buckets", [])
    buckets = tuple(
        ClipShape(
            clip_seconds=bucket.clip_seconds,
            frames=round(bucket.clip_seconds * data.fps),
            resolution=_pair(bucket.resolution or data.resolution),
            channels=data.channels,
            samples=round(bucket.clip_seconds * data.sample_rate),
        )
        for bucket in configured
    )
    box = _largest(buckets) if buckets else base
    return DataShapes(
        modalities=tuple(data.modalities),
        clip_seconds=box.clip_seconds,
        fps=data.fps,
        frames=box.frames,
        resolution=box.resolution,
        sample_rate=data.sample_rate,
        channels=data.channels,
        samples=box.samples,
        buckets=buckets,
    )


def _pair(resolution: Sequence[int]) -> tuple[int, int]:
    return (resolution[0], resolution[1])


def _largest(shapes: tuple[ClipShape, ...]) -> ClipShape:
    """The box every shape fits in: the largest of each dimension."""
    return ClipShape(
        clip_seconds=max(s.clip_seconds for s in shapes),
        frames=max(s.frames for s in shapes),
        resolution=(max(s.resolution[0] for s in shapes), max(s.resolution[1] for s in shapes)),
        channels=max(s.channels for s in shapes),
        samples=max(s.samples for s in shapes),
    )


def _shapes_of(data: DataConfig | DataShapes) -> DataShapes:
    return data if isinstance(data, DataShapes) else data_shapes(data)


class _Setting:
    """How an error names the setting that fixes a clip shape: data.resolution and
    data.clip_seconds without buckets, data.buckets (bucket `index`) with them."""

    def __init__(self, index: int | None) -> None:
        self.index = index

    def key(self, name: str) -> str:
        return f"data.{name}" if self.index is None else "data.buckets"

    def subject(self, name: str, value: object) -> str:
        """'data.resolution [60, 64]' or 'data.buckets[1]: resolution [60, 64]'."""
        if self.index is None:
            return f"data.{name} {value}"
        return f"data.buckets[{self.index}]: {name} {value}"

    def use(self, name: str, value: object) -> str:
        if self.index is None:
            return f"use data.{name}={value}"
        null = " (a bucket whose resolution is null takes data.resolution)"
        return f"use {name} {value} in data.buckets[{self.index}]" + (
            null if name == "resolution" else ""
        )


def _indexed(data: DataShapes) -> list[tuple[ClipShape, _Setting]]:
    if data.buckets:
        return [(shape, _Setting(i)) for i, shape in enumerate(data.buckets)]
    return [(data.clip_shapes[0], _Setting(None))]


def av_dit(
    data: DataShapes,
    size: str = "tiny",
    *,
    condition: str = "none",
    cond_dropout: float = 0.1,
    class_field: str | None = None,
    classes: Sequence[str] = (),
    text_encoder: str | None = None,
    prediction: str = "velocity",
    time_shift: float = 1.0,
    pixel_patch: Sequence[int] | None = None,
    loss: str = "velocity",
) -> AVDiT:
    """The built-in `model.arch: av_dit` (the factory contract of stoker/model.py);
    `model.args` conditions it on captions or class labels (conditioning.ConditionArgs,
    whose checks name the fix), sets what it predicts, its timestep shift and the space
    its loss is taken in (av_dit.py's docstring), and its pixel video patch (frames,
    height, width) in place of the preset's. Keywords, not a pydantic args class: the models
    build without pydantic (the step benchmark on a bare GPU node)."""
    # The checks of ConditionArgs name a bad value and its fix: the types are theirs.
    args = ConditionArgs(condition, cond_dropout, class_field, tuple(classes), text_encoder)  # type: ignore[arg-type]
    return build_av_dit(
        size, data, args, flow=FlowArgs(prediction, time_shift, loss), pixel_patch=pixel_patch
    )


@dataclass(frozen=True)
class FlowArgs:
    """What an av_dit predicts, its timestep shift and the space its loss is taken in
    (model.args.prediction, time_shift, loss; av_dit.py's docstring)."""

    prediction: str = "velocity"
    time_shift: float = 1.0
    loss: str = "velocity"

    def checked(self) -> tuple[Prediction, float, Prediction]:
        if self.prediction not in PREDICTIONS:
            raise ModelSetupError(
                "model.args.prediction",
                f"model.args.prediction {self.prediction!r} is not one of {', '.join(PREDICTIONS)}",
                fix="use velocity (the network outputs eps - x) or data (it outputs x)",
            )
        if self.loss not in PREDICTIONS:
            raise ModelSetupError(
                "model.args.loss",
                f"model.args.loss {self.loss!r} is not one of {', '.join(PREDICTIONS)}",
                fix="use velocity (the squared error of v) or data (of x)",
            )
        shift = self.time_shift
        if (
            isinstance(shift, bool)
            or not isinstance(shift, int | float)
            or not (math.isfinite(shift) and shift > 0)
        ):
            raise ModelSetupError(
                "model.args.time_shift",
                f"model.args.time_shift {shift!r} is not a number above 0",
                fix="use 1 for no shift, or 3 (SD3's) to spend more steps at high noise",
            )
        prediction: Prediction = self.prediction  # narrowed by the checks above
        loss: Prediction = self.loss
        return prediction, float(shift), loss


def audio_ar(data: DataShapes, size: str = "tiny") -> AudioAR:
    """The built-in `model.arch: audio_ar`."""
    return build_audio_ar(size, data)


def build_av_dit(
    size_name: str,
    data: DataConfig | DataShapes,
    condition: ConditionArgs = NO_CONDITION,
    *,
    flow: FlowArgs = FlowArgs(),
    pixel_patch: Sequence[int] | None = None,
) -> AVDiT:
    """The av_dit preset `size_name` for every clip shape of `data`: refused, naming the
    setting (the bucket) and a value that works, for a shape its patches do not divide,
    or a condition whose sidecar data.modalities leaves out. `flow`: what it predicts
    and its timestep shift; `pixel_patch`: (frames, height, width) of pixel video in
    place of the preset's (latents keep their own patch)."""
    prediction, time_shift, loss = flow.checked()
    shapes = _shapes_of(data)
    needed = condition.modality
    if needed is not None and needed not in shapes.modalities:
        raise DataDoesNotFitModel(
            "data.modalities",
            f"model.args.condition {condition.condition} reads each clip's {needed!r} "
            f"sidecar, but data.modalities {list(shapes.modalities)} leaves it out",
            fix=f"add '{needed}' to data.modalities",
        )
    model = _build_av_dit(size_name, shapes, pixel_patch)
    model.prediction, model.time_shift, model.loss_space = prediction, time_shift, loss
    model.set_condition(condition)
    return model


def _pixel_patch(size_name: str, patch: object) -> tuple[int, int, int]:
    """model.args.pixel_patch checked: three whole numbers, 1 or more."""
    values = list(patch) if isinstance(patch, list | tuple) else []
    if len(values) != 3 or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in values
    ):
        preset = list(av_dit_size(size_name).video_patch)
        raise ModelSetupError(
            "model.args.pixel_patch",
            f"model.args.pixel_patch {patch!r} is not [frames, height, width] of whole "
            "numbers, 1 or more",
            fix=f"e.g. [2, 16, 16]; leave it out for the {size_name} preset's {preset}",
        )
    return (values[0], values[1], values[2])


def _build_av_dit(
    size_name: str, shapes: DataShapes, pixel_patch: Sequence[int] | None = None
) -> AVDiT:
    size = av_dit_size(size_name)
    what = f"the {size_name} av_dit"
    given = ""  # where the patch came from, when not the preset
    if pixel_patch is not None:
        checked = _pixel_patch(size_name, pixel_patch)
        if shapes.latents:  # a pixel patch: latents keep theirs (_latent_av_dit)
            return _latent_av_dit(size_name, shapes)
        size, given = replace(size, video_patch=checked), " (model.args.pixel_patch)"
    if shapes.latents:
        return _latent_av_dit(size_name, shapes)
    has_video, has_audio = "video" in shapes.modalities, "audio" in shapes.modalities
    if not (has_video or has_audio):
        raise DataDoesNotFitModel(
            "data.modalities",
            f"data.modalities {list(shapes.modalities)} has neither 'video' nor 'audio'; "
            f"{what} needs at least one",
            fix="add 'video' and/or 'audio'",
        )
    pt, ph, pw = size.video_patch
    for shape, setting in _indexed(shapes):
        if has_video:
            height, width = shape.resolution
            if height % ph or width % pw:
                # The nearest multiples, halves rounded up.
                fixed = [
                    max(ph, (height + ph // 2) // ph * ph),
                    max(pw, (width + pw // 2) // pw * pw),
                ]
                raise DataDoesNotFitModel(
                    setting.key("resolution"),
                    f"{setting.subject('resolution', [height, width])} is not a multiple of "
                    f"{what}'s patch {ph}x{pw}{given}",
                    fix=setting.use("resolution", fixed),
                )
            if shape.frames < pt or shape.frames % pt:
                fitting = _fitting_clip_seconds(shapes, shape.clip_seconds, size.audio_patch, pt)
                raise DataDoesNotFitModel(
                    setting.key("clip_seconds"),
                    f"{setting.subject('clip_seconds', shape.clip_seconds)} x data.fps "
                    f"{shapes.fps} gives {shape.frames} frames, not a positive multiple of "
                    f"{what}'s temporal patch {pt}{given}",
                    fix=setting.use("clip_seconds", fitting),
                )
        if has_audio and (shape.samples < size.audio_patch or shape.samples % size.audio_patch):
            fitting = _fitting_clip_seconds(shapes, shape.clip_seconds, size.audio_patch, pt)
            raise DataDoesNotFitModel(
                setting.key("clip_seconds"),
                f"{setting.subject('clip_seconds', shape.clip_seconds)} x "
                f"data.sample_rate {shapes.sample_rate} gives {shape.samples} audio samples, "
                f"not a positive multiple of {what}'s audio patch of {size.audio_patch} samples",
                fix=setting.use("clip_seconds", fitting),
            )
    box = _largest(shapes.clip_shapes)  # the model takes every shape that fits in it
    video = (box.frames, *box.resolution) if has_video else None
    audio = (shapes.channels, box.samples) if has_audio else None
    return AVDiT(size, video=video, audio=audio, fps=shapes.fps, sample_rate=shapes.sample_rate)


LATENT_SPATIAL_PATCH = 2
"""Latent pixels per video patch side: 2, as DiT on an image VAE's latents."""
LATENT_AUDIO_PATCH = 4
"""Audio latent frames per audio token."""


def _latent_av_dit(size_name: str, shapes: DataShapes) -> AVDiT:
    """The av_dit preset on latents: video [T, C, h, w] in patches of (the preset's
    frames, 2, 2), audio [A, n] of 4 frames; refused for shapes those do not divide."""
    size = av_dit_size(size_name)
    pt = size.video_patch[0]
    size = replace(
        size,
        video_patch=(pt, LATENT_SPATIAL_PATCH, LATENT_SPATIAL_PATCH),
        audio_patch=LATENT_AUDIO_PATCH,
    )
    names = set(shapes.latents[0].tensors)
    if not names & {"video", "audio"}:
        raise DataDoesNotFitModel(
            "data.url",
            f"the latents are named {sorted(names)}; the av_dit trains on 'video' and/or 'audio'",
            fix="encode with an encoder that returns 'video' and/or 'audio' latents, or "
            "train a model of your own on these (model.arch: package.module:factory)",
        )
    video_boxes, audio_boxes = [], []
    for latent in shapes.latents:
        where = f"latents of bucket {latent.bucket}" if latent.bucket else "the latents"
        video, audio = latent.tensors.get("video"), latent.tensors.get("audio")
        if video is not None:
            if len(video) != 4 or video[0] % pt or video[2] % 2 or video[3] % 2:
                raise DataDoesNotFitModel(
                    "data.url",
                    f"{where}: video {list(video)} is not [T, C, h, w] with T a multiple of "
                    f"{pt} and h, w even (the av_dit's latent patch {size.video_patch})",
                    fix="encode clips whose latent frames and size divide so (data.clip_seconds, "
                    "data.resolution of `stoker data encode`)",
                )
            video_boxes.append(video)
        if audio is not None:
            if len(audio) != 2 or audio[1] % LATENT_AUDIO_PATCH:
                raise DataDoesNotFitModel(
                    "data.url",
                    f"{where}: audio {list(audio)} is not [A, n] with n a multiple of "
                    f"{LATENT_AUDIO_PATCH}",
                    fix="encode clips whose audio latent length divides so",
                )
            audio_boxes.append(audio)
    seconds = max(latent.clip_seconds for latent in shapes.latents)
    video_box = audio_box = None
    fps, rate = float(shapes.fps), float(shapes.sample_rate)
    channels = 3
    if video_boxes:
        channels = video_boxes[0][1]
        video_box = (
            max(v[0] for v in video_boxes),
            max(v[2] for v in video_boxes),
            max(v[3] for v in video_boxes),
        )
        fps = video_box[0] / seconds
    if audio_boxes:
        audio_box = (audio_boxes[0][0], max(a[1] for a in audio_boxes))
        rate = audio_box[1] / seconds
    return AVDiT(
        size,
        video=video_box,
        audio=audio_box,
        fps=fps,
        sample_rate=rate,
        video_channels=channels,
        latent=True,
    )


def build_audio_ar(size_name: str, data: DataConfig | DataShapes) -> AudioAR:
    shapes = _shapes_of(data)
    size = audio_ar_size(size_name)
    if "audio" not in shapes.modalities:
        raise DataDoesNotFitModel(
            "data.modalities",
            f"data.modalities {list(shapes.modalities)} has no 'audio'; the audio_ar models "
            "audio samples",
            fix="add 'audio' to data.modalities, or use model.arch=av_dit",
        )
    for shape, setting in _indexed(shapes):
        if shape.samples < 2:
            raise DataDoesNotFitModel(
                setting.key("clip_seconds"),
                f"{setting.subject('clip_seconds', shape.clip_seconds)} x "
                f"data.sample_rate {shapes.sample_rate} gives {shape.samples} audio samples; "
                "the audio_ar needs at least 2",
                fix=setting.use("clip_seconds", f"{2 / shapes.sample_rate:g} or more"),
            )
    return AudioAR(size, samples=_largest(shapes.clip_shapes).samples)


def _fitting_clip_seconds(
    data: DataShapes, clip_seconds: float, audio_patch: int, pt: int
) -> float:
    """The clip length nearest `clip_seconds` whose frames divide by pt (with video)
    and whose samples divide by audio_patch (with audio)."""
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
            if best is None or abs(seconds - clip_seconds) < abs(best - clip_seconds):
                best = seconds
            if seconds > clip_seconds:
                break
    return best if best is not None else clip_seconds
