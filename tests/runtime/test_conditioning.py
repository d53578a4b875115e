"""Conditioning the av_dit on captions and class labels (model.args.condition): its
args' checks, the data it needs, an untrained conditioned model that is the
unconditioned one, seeded condition dropout, classifier-free guidance at its two
ends, a text encoder of the user's own, and the errors a user meets."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stoker.config import ModelConfig
from stoker.errors import StokerError
from stoker.runtime.models import AVDiT, build_model
from stoker.runtime.models.build import build_av_dit
from stoker.runtime.models.conditioning import ConditionArgs, words
from stoker.runtime.sampling.draw import sample_model, seeded_generators
from tests.runtime.batches import data_config, moving_square_batch, random_batch
from tests.runtime.sampled_models import generators, scrambled

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CAPTIONED = data_config(clip_seconds=0.5, fps=8, resolution=(16, 16), modalities=["video", "text"])
LABELLED = data_config(clip_seconds=0.5, fps=8, resolution=(16, 16), modalities=["video", "meta"])
COLOURS = {"condition": "class", "class_field": "colour", "classes": ["red", "blue"]}


def conditioned(data: object, args: dict[str, object]) -> AVDiT:
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="av_dit", size="tiny", args=args), data)  # type: ignore[arg-type]
    assert isinstance(model, AVDiT)
    return model


def captioned_batch(captions: list[str]) -> dict[str, object]:
    return {**random_batch(CAPTIONED, len(captions)), "text": captions}


def test_args_are_checked_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"class_field .* and classes"):
        ConditionArgs(condition="class")
    with pytest.raises(StokerError, match="raised ValueError: cond_dropout 2 must be") as exc:
        build_model(ModelConfig(arch="av_dit", size="tiny", args={"cond_dropout": 2}), CAPTIONED)
    assert exc.value.fix and "model.args" in exc.value.fix
    with pytest.raises(ValueError, match="text_encoder is for condition: caption"):
        ConditionArgs(condition="class", class_field="c", classes=("a", "b"), text_encoder="x:y")
    with pytest.raises(StokerError, match=r"add 'text' to data\.modalities"):
        build_model(ModelConfig(arch="av_dit", size="tiny", args={"condition": "caption"}),
                    data_config(clip_seconds=0.5, fps=8, resolution=(16, 16),
                                modalities=["video"]))  # fmt: skip
    assert words("A red Circle, moving up!") == ["a", "red", "circle", "moving", "up"]


def test_an_untrained_conditioned_model_is_the_unconditioned_one() -> None:
    """The conditioner is made after the rest (the unconditioned weights do not move)
    and starts at zero output: the same loss on the same batch and noise."""
    torch.manual_seed(0)
    plain = build_av_dit("tiny", CAPTIONED)
    model = conditioned(CAPTIONED, {"condition": "caption", "cond_dropout": 0.0})
    own = dict(model.named_parameters())
    for name, param in plain.named_parameters():
        assert torch.equal(param, own[name]), name
    assert any(name.startswith("conditioner.") for name in own)
    batch = captioned_batch(["a red square", "a blue circle"])
    assert torch.equal(plain(batch, generators(1, 2)), model(batch, generators(1, 2)))


def test_conditions_change_the_velocity_and_dropout_is_seeded() -> None:
    model = scrambled(conditioned(CAPTIONED, {"condition": "caption", "cond_dropout": 0.5}))
    assert model.conditioner is not None
    x = {"video": torch.randn(2, 8, 384)}
    t = torch.full((2,), 0.5)
    red = model.velocity(x, t, None, ["a red square", "a red square"])["video"]
    blue = model.velocity(x, t, None, ["a blue square", "a blue square"])["video"]
    none = model.velocity(x, t, None, [None, None])["video"]
    assert not torch.allclose(red, blue) and not torch.allclose(red, none)
    assert torch.equal(none, model.velocity(x, t)["video"])  # no conditions: the null vector

    captions = [f"clip {i}" for i in range(64)]
    first = model.conditioner.dropped(captions, generators(*range(64)))
    assert first == model.conditioner.dropped(captions, generators(*range(64)))
    dropped = sum(c is None for c in first)
    assert 16 < dropped < 48  # about half
    assert model.conditioner.dropped(captions[5:6], generators(5)) == first[5:6]  # per sample


def test_guidance_at_its_ends_and_class_labels() -> None:
    model = scrambled(conditioned(LABELLED, COLOURS))
    seeds = [3, 4]
    unconditioned = sample_model(model, seeds=seeds, steps=2)["video"]
    plain = sample_model(model, seeds=seeds, steps=2, prompts=["red", "blue"])["video"]
    zero = sample_model(model, seeds=seeds, steps=2, prompts=["red", "blue"], guidance=0.0)
    strong = sample_model(model, seeds=seeds, steps=2, prompts=["red", "blue"], guidance=4.0)
    # w = 0 is the unconditioned model, whatever the prompt (up to batching's last bits).
    assert (zero["video"].int() - unconditioned.int()).abs().max() <= 1
    assert not torch.equal(plain, unconditioned)
    assert not torch.equal(strong["video"], plain)
    with pytest.raises(StokerError, match=r"prompts \['green'\] are not among .*\['red', 'blue'\]"):
        sample_model(model, seeds=[1], steps=1, prompts=["green"])
    batch = {**random_batch(LABELLED, 2), "meta": [{"colour": "red"}, {"colour": "green"}]}
    with pytest.raises(ValueError, match=r"class labels \['green'\] .* add them there"):
        model(batch, generators(1, 2))


def test_prompts_for_an_unconditioned_model_are_refused() -> None:
    torch.manual_seed(0)
    model = build_av_dit("tiny", CAPTIONED)
    with pytest.raises(StokerError, match="trained without conditioning") as exc:
        sample_model(model, seeds=[1], steps=1, prompts=["a red square"])
    assert exc.value.fix


def test_a_text_encoder_of_your_own() -> None:
    encoder = "tests.runtime.text_encoders:letters"
    model = conditioned(CAPTIONED, {"condition": "caption", "text_encoder": encoder})
    assert model.conditioner is not None
    assert model.conditioner.project_in.in_features == 26
    assert not any("encoder" in name for name in model.state_dict())  # frozen, not saved
    loss = model(captioned_batch(["abc", "xyz"]), generators(1, 2))
    loss.backward()
    assert model.conditioner.project_out.weight.grad is not None


# --- learning: samples approach the data, and guidance brings them closer -----------

LEVELS = {"dark": 20, "light": 200}
"""The background of each class's clips (tests/runtime/batches.moving_square_batch's,
made light for "light"): the statistic the conditioned generator must learn."""


def levelled_batch(size: int, seed: int) -> dict[str, object]:
    batch = moving_square_batch(LEVELLED, size, seed)
    draw = torch.Generator().manual_seed(seed + 10_000)
    labels = [("dark", "light")[int(torch.randint(0, 2, (), generator=draw))] for _ in range(size)]
    video = batch["video"]
    for row, label in enumerate(labels):
        video[row][video[row] == 20] = LEVELS[label]
    return {"video": video, "meta": [{"level": label} for label in labels]}


LEVELLED = data_config(clip_seconds=0.5, fps=8, resolution=(16, 16), modalities=["video", "meta"])


def test_training_brings_samples_to_the_data_and_guidance_closer() -> None:
    """200 steps of the tiny class-conditioned av_dit on clips whose background is dark
    or light by class. Its samples' mean level moves from the noise's (about 127) to
    each class's, and with guidance (w = 3) closer still than without (w = 1)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="av_dit", size="tiny", args={
        "condition": "class", "class_field": "level", "classes": ["dark", "light"],
        "cond_dropout": 0.2}), LEVELLED)  # fmt: skip
    held_out = levelled_batch(64, seed=99_999)
    rows: dict[str, list[torch.Tensor]] = {label: [] for label in LEVELS}
    for clip, meta in zip(held_out["video"], held_out["meta"], strict=True):  # type: ignore[call-overload]
        rows[meta["level"]].append(clip)
    target = {label: float(torch.stack(clips).float().mean()) for label, clips in rows.items()}

    def level(prompt: str, guidance: float) -> float:
        clips = sample_model(model, seeds=list(range(8)), steps=8, prompts=[prompt] * 8,
                             guidance=guidance)["video"]  # fmt: skip
        return float(clips.float().mean())

    untrained = {label: level(label, 1.0) for label in LEVELS}
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for step in range(200):
        batch = levelled_batch(16, seed=step)
        noise = seeded_generators(range(16 * step, 16 * step + 16), torch.device("cpu"))
        model(batch, noise).backward()
        optimizer.step()
        optimizer.zero_grad()
    for label, want in target.items():
        before, plain, guided = untrained[label], level(label, 1.0), level(label, 3.0)
        report = (f"{label}: data {want:.1f}, untrained {before:.1f}, trained {plain:.1f}, "
                  f"guided {guided:.1f}")  # fmt: skip
        assert abs(plain - want) < abs(before - want) - 20, report
        assert abs(guided - want) < abs(plain - want) - 10, report


# --- `stoker sample --prompt --cfg` ---------------------------------------------------


def test_stoker_sample_takes_prompts_and_guidance(tmp_path: Path) -> None:
    """docs/runtime.md's `stoker sample RUN --prompt P --cfg W`: from a class-conditioned
    run's checkpoint, the command's clips are the ones sample_model draws for the same
    prompts and guidance, and guidance changes them."""
    from torch.distributed.checkpoint import state_dict_saver

    from stoker.checkpoint import commit as ck
    from stoker.config import resolve_config
    from stoker.config.frozen import write_frozen
    from stoker.runtime.sampling.files import write_samples
    from tests.clirun import stoker_text

    resolved = resolve_config(overrides=[
        "model.args.condition=class", "model.args.class_field=colour",
        "model.args.classes=[red, blue]", "data.modalities=[video, meta]",
        "data.resolution=[16, 16]", "data.clip_seconds=0.5", "data.fps=8",
        "train.precision=fp32",  # the command's and this process's numbers alike
    ], use_profile=False)  # fmt: skip
    cfg = resolved.config
    torch.manual_seed(cfg.train.seed)
    model = scrambled(build_model(cfg.model, cfg.data))  # a conditioner that does something
    run = tmp_path / "run"
    write_frozen(resolved, run / "config.yaml")
    step = run / "checkpoints" / "step-5"
    state_dict_saver.save({"model": model.state_dict()}, checkpoint_id=str(step), no_dist=True)
    ck.write_commit(str(step), step=5, world_size=1)

    args = ["sample", str(run), "--seed", "0", "--seed", "1", "--steps", "1", "--method",
            "heun", "--device", "cpu", "--prompt", "red", "--prompt", "blue"]  # fmt: skip
    stoker_text(*args, "--cfg", "4", "--out", str(tmp_path / "guided"), check=True)
    stoker_text(*args, "--out", str(tmp_path / "plain"), check=True)
    expected = sample_model(model, seeds=[0, 1], steps=1, method="heun",
                            prompts=["red", "blue"], guidance=4.0)  # fmt: skip
    write_samples(expected, [0, 1], tmp_path / "expected", fps=cfg.data.fps,
                  sample_rate=cfg.data.sample_rate)  # fmt: skip
    clips = sorted(p.name for p in (tmp_path / "expected").glob("seed-*"))
    assert clips == ["seed-0.mp4", "seed-1.mp4"]
    for name in clips:
        guided = (tmp_path / "guided" / name).read_bytes()
        assert guided == (tmp_path / "expected" / name).read_bytes(), name
        assert guided != (tmp_path / "plain" / name).read_bytes(), name
    refused = stoker_text(*args, "--prompt", "blue", "--out", str(tmp_path / "x"))
    assert refused.returncode == 2 and "3 --prompt for 2 seeds" in refused.stderr
