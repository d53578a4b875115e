"""Rows that stand in for skipped samples (`valid` False) are not trained on:
`stoker.model.valid_mean`, each built-in model's gradient (a stand-in row, whatever it
holds, changes nothing; the batch without it gives the same gradient), and the trainer
on a data set with a corrupt sample: it trains, and logs the skipped sample at the step
that skipped it."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from stoker.config import ModelConfig, resolve_config
from stoker.model import valid_mean
from stoker.runtime.dist.dist_env import detect
from stoker.runtime.models import build_model
from stoker.runtime.observe.metrics_sink import MetricsOnlySink
from stoker.runtime.trainer import Trainer
from tests.runtime.batches import data_config, random_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

AV = data_config(clip_seconds=0.5, fps=8, resolution=(32, 32), sample_rate=8000)
AUDIO = data_config(clip_seconds=0.02, sample_rate=8000, channels=2, modalities=["audio"])


# --- valid_mean -------------------------------------------------------------------------


def test_valid_mean_averages_the_valid_rows_only() -> None:
    losses = torch.tensor([1.0, 100.0, 3.0], requires_grad=True)
    batch = {"valid": torch.tensor([True, False, True])}
    mean = valid_mean(losses, batch)
    mean.backward()
    assert mean.item() == 2.0
    assert losses.grad is not None and losses.grad.tolist() == [0.5, 0.0, 0.5]
    assert valid_mean(torch.tensor([1.0, 3.0]), {}).item() == 2.0  # no "valid": all rows


def test_valid_mean_of_stand_ins_only_is_zero_not_nan() -> None:
    """A micro-batch of stand-ins only: 0 and a zero gradient, even where they hold NaN."""
    losses = torch.tensor([math.nan, math.inf], requires_grad=True)
    mean = valid_mean(losses, {"valid": torch.tensor([False, False])})
    mean.backward()
    assert mean.item() == 0.0
    assert losses.grad is not None and losses.grad.tolist() == [0.0, 0.0]


def test_valid_mean_refuses_a_loss_that_is_not_one_per_row() -> None:
    with pytest.raises(
        ValueError, match=r"one loss per sample, a \[B\] tensor; got shape \(2, 3\)"
    ):
        valid_mean(torch.zeros(2, 3), {"valid": torch.ones(2, dtype=torch.bool)})
    with pytest.raises(
        ValueError, match=r"batch\['valid'\] has shape \(3,\) but the losses \(2,\)"
    ):
        valid_mean(torch.zeros(2), {"valid": torch.ones(3, dtype=torch.bool)})


def test_valid_mean_compiles_and_runs_on_meta() -> None:
    compiled = torch.compile(valid_mean, fullgraph=True, backend="aot_eager")
    batch = {"valid": torch.tensor([True, False])}
    assert compiled(torch.tensor([2.0, 7.0]), batch).item() == 2.0
    on_meta = valid_mean(torch.empty(2, device="meta"), {"valid": torch.ones(2, device="meta")})
    assert on_meta.shape == () and on_meta.device.type == "meta"


# --- the built-in models: a stand-in row gets no gradient -------------------------------


def _model(arch: str) -> torch.nn.Module:
    """The tiny model, every parameter random (zero-initialised output layers would
    make most gradients zero whatever the rows hold)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch), AV if arch == "av_dit" else AUDIO)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1 + (param.dim() == 1))
    return model


def _rows(batch: dict[str, Any], keep: list[int], valid: list[bool]) -> dict[str, Any]:
    """The batch's rows `keep`, with `valid` and one noise generator per row, seeded by
    the row's place in the original batch (the loader's stream position)."""
    out: dict[str, Any] = {k: v[keep] for k, v in batch.items() if k in ("video", "audio")}
    out["valid"] = torch.tensor(valid)
    out["generators"] = [torch.Generator().manual_seed(100 + row) for row in keep]
    return out


def _gradients(model: torch.nn.Module, batch: dict[str, Any]) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=False)
    loss = model(batch)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("arch", ["av_dit", "audio_ar"])
def test_a_stand_in_row_adds_nothing_to_the_gradient(arch: str) -> None:
    model = _model(arch)
    data = AV if arch == "av_dit" else AUDIO
    batch = random_batch(data, 3, seed=0)
    garbage = random_batch(data, 3, seed=1)  # other content for row 1
    copied = {k: v.clone() for k, v in batch.items() if k in ("video", "audio")}
    for name in copied:
        copied[name][1] = batch[name][0]  # what the loader puts there: a copy of a good row
        garbage[name][[0, 2]] = batch[name][[0, 2]]

    # Marked valid, row 1's content does change the gradient: the check below has teeth.
    _, whole_a = _gradients(model, _rows(garbage, [0, 1, 2], [True, True, True]))
    _, whole_b = _gradients(model, _rows(copied, [0, 1, 2], [True, True, True]))
    assert not all(torch.equal(a, b) for a, b in zip(whole_a, whole_b, strict=True))

    loss_a, grads_a = _gradients(model, _rows(garbage, [0, 1, 2], [True, False, True]))
    loss_b, grads_b = _gradients(model, _rows(copied, [0, 1, 2], [True, False, True]))
    # Whatever the stand-in row holds: the same loss and gradients, bit for bit.
    assert loss_a == loss_b
    for a, b in zip(grads_a, grads_b, strict=True):
        assert torch.equal(a, b)
    # The same as the batch without the row (its mean over 2 rows): other shapes sum
    # in another order, hence a tolerance of fp32 rounding.
    loss_c, grads_c = _gradients(model, _rows(batch, [0, 2], [True, True]))
    assert loss_c == pytest.approx(loss_a, rel=1e-6)
    assert any(bool(g.abs().sum() > 0) for g in grads_c)
    for a, c in zip(grads_a, grads_c, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("arch", ["av_dit", "audio_ar"])
def test_a_batch_of_stand_ins_only_has_zero_loss_and_gradient(arch: str) -> None:
    model = _model(arch)
    batch = random_batch(AV if arch == "av_dit" else AUDIO, 2)
    loss, grads = _gradients(model, _rows(batch, [0, 1], [False, False]))
    assert loss == 0.0
    assert all(bool((g == 0).all()) for g in grads)


# --- the trainer on a data set with a corrupt sample ------------------------------------


class Recorder(MetricsOnlySink):
    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if "loss" in metrics:
            self.metrics[step] = dict(metrics)


def _with_a_corrupt_sample(clean: Path, root: Path) -> str:
    """A copy of the data set whose first sample's video is zeros (same size: the
    index stays right, the decoder refuses it); the sample's shard:key."""
    shutil.copytree(clean, root)
    index_path = next(iter(sorted((root / "shards").glob("*.index.json"))))
    entry = json.loads(index_path.read_text())["samples"][0]
    member = entry["members"]["mp4"]
    tar = index_path.with_name(index_path.name.replace(".index.json", ".tar"))
    with tar.open("r+b") as f:
        f.seek(member["offset"])
        f.write(bytes(member["size"]))
    return f"shards/{tar.name}:{entry['key']}"


def test_the_trainer_logs_a_corrupt_sample_at_its_step_and_trains(
    tmp_path: Path, synthetic_av_set: Callable[..., Path]
) -> None:
    root = tmp_path / "corrupt-set"
    _with_a_corrupt_sample(synthetic_av_set(clips=16, size=(64, 64)), root)
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        "data": {"url": str(root), "batch_size": 4, "num_workers": 0},
        # Two micro-batches a step: one of them holds the stand-in row.
        "train": {"steps": 4, "log_every": 1, "seed": 3, "grad_accum": 2},
        "optim": {"warmup_steps": 1},
        "checkpoint": {"every": 0},
    }))  # fmt: skip
    cfg = resolve_config(exp, [], use_profile=False).config
    sink = Recorder()
    trainer = Trainer(cfg, detect({}), torch.device("cpu"), run_dir=tmp_path / "run", sink=sink)
    trainer.build()
    outcome = trainer.train()
    assert outcome.status == "FINISHED"
    # 4 steps of 4 samples: the 16 clips once. The corrupt one is counted at its own
    # step (not carried on to later ones), and every step's loss is finite.
    skipped = [sink.metrics[step]["system/data/skipped_samples"] for step in range(1, 5)]
    assert sorted(skipped) == [0.0, 0.0, 0.0, 1.0], skipped
    assert all(math.isfinite(sink.metrics[step]["loss"]) for step in range(1, 5))
    assert all(sink.metrics[step]["system/throughput/samples_per_s"] > 0 for step in range(1, 5))
