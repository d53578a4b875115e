"""A model's samples as files in one folder, for training's samples/step-<N>/ and for
`stoker sample`:

    seed-<s>.mp4     per sample with video: H.264, and AAC of its audio muxed in
                     (where AAC has the data's sample rate; else the audio is
                     seed-<s>.wav beside a silent mp4); frames whose short side is
                     under MIN_SHORT_SIDE are enlarged by a whole factor, each pixel
                     a block (nearest neighbour: nothing made up, the model's pixels
                     stay sharp), so a 64 px clip plays legibly in MLflow's viewer
    seed-<s>.wav     per sample of an audio-only model: 16-bit PCM
    contact.png      every sample in a row: frames and a spectrogram (sample_media.py)
    latents.safetensors   a latent model's samples as the encoder gives them (no
                     decoder runs here: decode them with your encoder's own)
    samples.json     what made them: seeds, solver, steps, weights, step, files

The folder appears whole or not at all: files are written into a temporary sibling,
renamed into place at the end.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from stoker.data.media.sample_media import (
    AAC_SAMPLE_RATES,
    contact_sheet,
    encode_av_clip,
    encode_wav,
)

RECORD = "samples.json"
CONTACT_SHEET = "contact.png"
MIN_SHORT_SIDE = 256
"""Pixels on the short side of an mp4's frames, at least: smaller frames are enlarged."""


def display_factor(height: int, width: int) -> int:
    """The whole factor that brings a frame's short side to MIN_SHORT_SIDE or more; 1
    for frames already as large."""
    return max(1, -(-MIN_SHORT_SIDE // max(1, min(height, width))))


def enlarged(video: torch.Tensor, factor: int) -> torch.Tensor:
    """[T, C, H, W] frames with each pixel a factor x factor block."""
    if factor == 1:
        return video
    return video.repeat_interleave(factor, dim=-2).repeat_interleave(factor, dim=-1)


def write_samples(
    samples: Mapping[str, torch.Tensor],
    seeds: Sequence[int],
    folder: Path,
    *,
    fps: float,
    sample_rate: int,
    about: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write `samples` (sampling.py's layouts: uint8 "video" [B, T, 3, H, W], float
    "audio" [B, C, N]; float "video" means latents), one per seed, into `folder`,
    replacing it; `about` goes into samples.json. Returns the files written."""
    if not seeds or any(t.shape[0] != len(seeds) for t in samples.values()):
        shapes = {k: tuple(v.shape) for k, v in samples.items()}
        raise ValueError(f"samples {shapes} do not have one row per seed ({len(seeds)})")
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        names = _write_files(samples, seeds, tmp, fps=fps, sample_rate=sample_rate)
        record = {
            **(about or {}),
            "seeds": [int(s) for s in seeds],
            "files": names,
            "fps": fps,
            "sample_rate": sample_rate,
        }
        video = samples.get("video")
        if video is not None and video.dtype == torch.uint8:  # the mp4s' enlargement
            record["mp4_scale"] = display_factor(video.shape[-2], video.shape[-1])
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [folder / name for name in [*names, RECORD]]


def _write_files(
    samples: Mapping[str, torch.Tensor],
    seeds: Sequence[int],
    folder: Path,
    *,
    fps: float,
    sample_rate: int,
) -> list[str]:
    video, audio = samples.get("video"), samples.get("audio")
    if video is not None and video.dtype != torch.uint8:
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous().cpu() for k, v in samples.items()},
            str(folder / "latents.safetensors"),
        )
        return ["latents.safetensors"]
    names: list[str] = []
    muxable = audio is not None and sample_rate in AAC_SAMPLE_RATES
    factor = display_factor(video.shape[-2], video.shape[-1]) if video is not None else 1
    for row, seed in enumerate(seeds):
        clip_audio = audio[row] if audio is not None else None
        if video is not None:
            mp4 = encode_av_clip(
                enlarged(video[row], factor),
                clip_audio if muxable else None,
                fps=fps,
                sample_rate=sample_rate if muxable else None,
            )
            names.append(_put(folder, f"seed-{seed}.mp4", mp4))
        if clip_audio is not None and not (video is not None and muxable):
            names.append(
                _put(folder, f"seed-{seed}.wav", encode_wav(clip_audio, sample_rate=sample_rate))
            )
    if video is not None or audio is not None:
        clips = [
            (video[r] if video is not None else None, audio[r] if audio is not None else None)
            for r in range(len(seeds))
        ]
        sheet = contact_sheet(clips, fps=fps, sample_rate=sample_rate)
        names.append(_put(folder, CONTACT_SHEET, sheet))
    return names


def _put(folder: Path, name: str, data: bytes) -> str:
    (folder / name).write_bytes(data)
    return name
