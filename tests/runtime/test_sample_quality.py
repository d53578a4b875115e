"""The measures [6/8]'s demo is held to (tests/runtime/sample_quality.py): the synthetic
data's own clips, encoded as the trainer's samples are (mp4: H.264 and AAC), look and
sound like the data; an untrained tiny av_dit's samples, and noise, do not."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import torch

from stoker.config import resolve_config
from stoker.data.synthetic.shapes import clip_arrays
from stoker.runtime.models import build_model
from stoker.runtime.sampling.draw import sample_model
from stoker.runtime.sampling.files import write_samples
from tests.runtime.sample_quality import frame_measures, measure_clip

TINY = Path(str(resources.files("stoker.runtime") / "tiny.yaml"))


def test_the_datas_clips_pass_and_an_untrained_models_samples_fail(tmp_path: Path) -> None:
    cfg = resolve_config(TINY, use_profile=False).config
    data = cfg.data
    # The data's clips as samples are written: [B, T, 3, H, W] uint8, audio [B, C, S].
    clips = [clip_arrays(i, seconds=data.clip_seconds, size=tuple(data.resolution),
                         fps=data.fps, sample_rate=data.sample_rate) for i in range(3)]  # fmt: skip
    video = torch.from_numpy(np.stack([c.video for c in clips])).permute(0, 1, 4, 2, 3)
    audio = torch.from_numpy(np.stack([c.audio.T for c in clips])).float()
    write_samples({"video": video, "audio": audio}, [0, 1, 2], tmp_path / "data",
                  fps=data.fps, sample_rate=data.sample_rate)  # fmt: skip
    measured = [measure_clip(tmp_path / "data" / f"seed-{i}.mp4") for i in range(3)]
    assert all(m.looks_like_the_data() and m.sounds_like_the_data() for m in measured), measured

    torch.manual_seed(0)
    untrained = build_model(cfg.model, cfg.data)
    samples = sample_model(untrained, seeds=[0, 1], steps=4, method="euler")
    write_samples(samples, [0, 1], tmp_path / "untrained", fps=data.fps,
                  sample_rate=data.sample_rate)  # fmt: skip
    for seed in (0, 1):
        drawn = measure_clip(tmp_path / "untrained" / f"seed-{seed}.mp4")
        assert not drawn.looks_like_the_data() and not drawn.sounds_like_the_data(), drawn

    noise = np.random.default_rng(0).integers(0, 256, (8, 64, 64, 3), dtype=np.uint8)
    background, foreground, _ = frame_measures(noise)
    assert background < 0.2 and foreground > 0.5
