"""The models the runtime trains: the audio-video diffusion transformer
(av_dit) and the autoregressive audio-token transformer (audio_ar), their size
presets, and the FLOPs formula MFU is measured against (docs/runtime.md)."""

from stoker.runtime.models.audio_ar import AudioAR
from stoker.runtime.models.av_dit import AVDiT
from stoker.runtime.models.build import clip_frames, clip_samples, data_shapes
from stoker.runtime.models.flops import (
    attention_flops,
    flops_per_token,
    matmul_flops,
    mfu,
    peak_flops,
    peak_flops_of_name,
)
from stoker.runtime.models.registry import build_model
from stoker.runtime.models.sizes import (
    AUDIO_AR_SIZES,
    AV_DIT_SIZES,
    SIZE_NAMES,
    AudioARSize,
    AVDiTSize,
)
from stoker.runtime.models.training_model import Batch, TrainingModel

__all__ = [
    "AUDIO_AR_SIZES",
    "AV_DIT_SIZES",
    "SIZE_NAMES",
    "AVDiT",
    "AVDiTSize",
    "AudioAR",
    "AudioARSize",
    "Batch",
    "TrainingModel",
    "attention_flops",
    "build_model",
    "clip_frames",
    "clip_samples",
    "data_shapes",
    "flops_per_token",
    "matmul_flops",
    "mfu",
    "peak_flops",
    "peak_flops_of_name",
]
