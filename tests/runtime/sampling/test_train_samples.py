"""Samples while training (train.sample_every), in one CPU process on the real loader
and the tiny av_dit: every N steps and at the end a folder of clips from fixed seeds,
logged as the run's samples/step-<N>/ artifacts, mp4s PyAV decodes to H.264 video and
AAC audio of the data's size, rate and length, and a contact sheet; the same seeds
give the same files in another run; the EMA's weights draw them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import av
import pytest
import torch

from stoker.runtime.train_samples import share_of
from tests.runtime.trainer_runs import Recorder, built_trainer, trainer_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SAMPLING = ["train.sample_every=2", "train.sample_seeds=[5,6,7]", "train.sample_steps=2",
            "train.sample_method=euler", "train.ema_decay=0.9"]  # fmt: skip


@pytest.fixture(scope="module")
def data_url(synthetic_av_set: Callable[..., Path]) -> str:
    return str(synthetic_av_set(clips=8, size=(32, 32), seconds=1.0))


def test_samples_every_n_steps_are_logged_and_decode(tmp_path: Path, data_url: str) -> None:
    cfg = trainer_config(tmp_path, data_url, 3, *SAMPLING)
    sink = Recorder()
    trainer = built_trainer(cfg, tmp_path / "run", sink)
    trainer.train()
    samples = tmp_path / "run" / "samples"
    assert sink.artifacts == [(samples / "step-2", "samples/step-2"),
                              (samples / "step-3", "samples/step-3")]  # fmt: skip
    folder = samples / "step-3"
    assert sorted(p.name for p in folder.iterdir()) == [
        "contact.png", "samples.json", "seed-5.mp4", "seed-6.mp4", "seed-7.mp4"]  # fmt: skip
    record = json.loads((folder / "samples.json").read_text())
    assert record["seeds"] == [5, 6, 7] and record["step"] == 3 and record["weights"] == "ema"
    data = cfg.data
    frames = round(data.clip_seconds * data.fps)
    with av.open(str(folder / "seed-5.mp4")) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert video.codec_context.name == "h264" and audio.codec_context.name == "aac"
        # Enlarged for the viewer, each pixel a block: 32 px frames become 256 px.
        scale = record["mp4_scale"]
        assert scale * min(data.resolution) >= 256 > (scale - 1) * min(data.resolution)
        assert (video.width, video.height) == (
            scale * data.resolution[1],
            scale * data.resolution[0],
        )
        assert audio.rate == data.sample_rate and audio.channels == data.channels
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(decoded) == frames
    assert float(video.duration * video.time_base) == pytest.approx(data.clip_seconds, abs=0.01)
    assert (folder / "contact.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Another run with the same seeds: the same files, byte for byte.
    again = built_trainer(
        trainer_config(tmp_path, data_url, 3, *SAMPLING), tmp_path / "again", Recorder()
    )
    again.train()
    for name in ("seed-5.mp4", "seed-7.mp4", "contact.png"):
        same = (tmp_path / "again/samples/step-3" / name).read_bytes()
        assert same == (folder / name).read_bytes(), name


def test_samples_use_the_ema_weights(tmp_path: Path, data_url: str) -> None:
    """The EMA's clips differ from the trained weights' and the weights are put back."""
    cfg = trainer_config(tmp_path, data_url, 2, *SAMPLING, "train.sample_every=0")
    trainer = built_trainer(cfg, tmp_path / "run", Recorder())
    trainer.train()
    assert trainer.ema is not None
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.sampler.every = 1
    trainer.sampler.draw(trainer.model, 2)
    trainer.sampler.close()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    from stoker.runtime.sampling.draw import sample_model

    own = sample_model(trainer.model, seeds=[5], steps=2, method="euler")
    ema_clip = (tmp_path / "run/samples/step-2/seed-5.mp4").read_bytes()
    from stoker.runtime.sampling.files import write_samples

    write_samples(own, [5], tmp_path / "own", fps=cfg.data.fps, sample_rate=cfg.data.sample_rate)
    assert (tmp_path / "own/seed-5.mp4").read_bytes() != ema_clip


def test_each_rank_draws_an_equal_share() -> None:
    assert [share_of([1, 2, 3], r, 2) for r in range(2)] == [[1, 2], [3, 3]]
    assert [share_of([1, 2], r, 4) for r in range(4)] == [[1], [2], [2], [2]]
    assert share_of([9], 0, 1) == [9]


def test_sample_files_for_each_kind_of_model(tmp_path: Path) -> None:
    """Audio alone: WAVs; a rate AAC lacks: a silent mp4 beside a WAV; latents: one
    safetensors file; the folder is replaced whole; rows must match the seeds."""
    from stoker.runtime.sampling.files import write_samples

    audio = torch.rand(2, 2, 1600) * 2 - 1
    names = [p.name for p in write_samples({"audio": audio}, [3, 4], tmp_path / "a", fps=8,
                                           sample_rate=16_000)]  # fmt: skip
    assert names == ["seed-3.wav", "seed-4.wav", "contact.png", "samples.json"]
    with av.open(str(tmp_path / "a/seed-4.wav")) as container:
        stream = container.streams.audio[0]
        assert (stream.rate, stream.channels) == (16_000, 2)
        assert sum(f.samples for f in container.decode(audio=0)) == 1600

    video = torch.randint(0, 256, (1, 4, 3, 16, 16), dtype=torch.uint8)
    odd = write_samples({"video": video, "audio": audio[:1]}, [7], tmp_path / "b", fps=8,
                        sample_rate=1_000)  # fmt: skip
    assert [p.name for p in odd] == ["seed-7.mp4", "seed-7.wav", "contact.png", "samples.json"]
    with av.open(str(tmp_path / "b/seed-7.mp4")) as container:
        assert not container.streams.audio and container.streams.video[0].frames == 4

    latents = {"video": torch.randn(1, 2, 4, 4, 4), "audio": torch.randn(1, 8, 8)}
    folder = tmp_path / "b"  # replaced whole: the old clips go
    write_samples(latents, [7], folder, fps=8, sample_rate=16_000)
    assert sorted(p.name for p in folder.iterdir()) == ["latents.safetensors", "samples.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(ValueError, match="one row per seed"):
        write_samples({"audio": audio}, [1], tmp_path / "c", fps=8, sample_rate=16_000)


def test_a_caption_conditioned_run_on_the_loader_samples_with_guidance(
    tmp_path: Path, data_url: str
) -> None:
    """The real loader's captions (the `.txt` sidecars) condition the av_dit, and the
    samples are drawn for the prompts with guidance."""
    conditioned = [
        "model.args.condition=caption",
        "data.modalities=[video,audio,text]",
        'train.sample_prompts=["a red circle"]',
        "train.sample_guidance=2.0",
    ]
    cfg = trainer_config(tmp_path, data_url, 2, *SAMPLING, *conditioned)
    trainer = built_trainer(cfg, tmp_path / "run", Recorder())
    assert trainer.model.conditioner is not None
    trainer.train()
    record = json.loads((tmp_path / "run/samples/step-2/samples.json").read_text())
    assert record["prompts"] == ["a red circle"] * 3 and record["guidance"] == 2.0
    assert (tmp_path / "run/samples/step-2/seed-6.mp4").stat().st_size > 0
