"""Batches of several shapes (data.buckets) on the model side: DataShapes lists each
bucket's shape; each built-in model trains on every bucket's shape, exactly as a model
built for that shape alone would, with its FLOPs counted at that shape; a bucket a
model cannot take is refused before anything starts, naming the bucket and the fix,
by the factory or by the meta-device forward of `stoker check` and `stoker submit`."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from stoker.config import DataConfig, ExperimentConfig, ModelConfig, resolve_config
from stoker.config.schema import BucketConfig
from stoker.errors import StokerError
from stoker.model import ClipShape, DataShapes
from stoker.runtime.models import AVDiT, build_model, contract, data_shapes
from stoker.runtime.models.av_dit import av_rope_tables
from stoker.runtime.models.build import DataDoesNotFitModel, ModelSetupError, av_dit
from stoker.runtime.observe.log_window import GATHERED, Window, across_ranks
from stoker.runtime.preflight import check_model
from tests.runtime.batches import data_config, random_batch

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BUCKETS = [
    {"resolution": [32, 48], "clip_seconds": 0.5, "batch_size": 4},
    {"resolution": None, "clip_seconds": 1.0, "batch_size": 2},  # data.resolution
]
AV = data_config(resolution=(32, 32), fps=8, sample_rate=8000, buckets=BUCKETS)
AUDIO = data_config(
    sample_rate=8000,
    channels=2,
    modalities=["audio"],
    buckets=[{"clip_seconds": 0.02, "batch_size": 4}, {"clip_seconds": 0.01, "batch_size": 4}],
)


def bucket_data(data: DataConfig, index: int) -> DataConfig:
    """The data config of bucket `index` alone (no buckets): its batches' shape."""
    bucket = data.buckets[index]
    return data.model_copy(
        update={
            "buckets": [],
            "clip_seconds": bucket.clip_seconds,
            "resolution": bucket.resolution or data.resolution,
        }
    )


def test_data_shapes_list_each_bucket_and_the_largest_of_each_dimension() -> None:
    shapes = data_shapes(AV)
    assert shapes.buckets == (
        ClipShape(clip_seconds=0.5, frames=4, resolution=(32, 48), channels=1, samples=4000),
        ClipShape(clip_seconds=1.0, frames=8, resolution=(32, 32), channels=1, samples=8000),
    )
    assert shapes.clip_shapes == shapes.buckets
    # The single-shape fields: a box every bucket fits in (W from bucket 0, T from 1).
    assert (shapes.frames, shapes.resolution, shapes.samples) == (8, (32, 48), 8000)
    assert shapes.video_shape == (8, 3, 32, 48) and shapes.audio_shape == (1, 8000)
    assert shapes.buckets[0].video_shape == (4, 3, 32, 48)
    assert shapes.buckets[1].audio_shape == (1, 8000)

    plain = data_shapes(data_config(resolution=(32, 32)))
    assert plain.buckets == ()
    assert plain.clip_shapes == (ClipShape(1.0, 8, (32, 32), 1, 16000),)


def test_data_shapes_written_against_the_old_fields_still_build() -> None:
    """A plugin's own DataShapes (a test, a notebook) without `buckets`."""
    shapes = DataShapes(
        modalities=("video",), clip_seconds=1.0, fps=8, frames=8, resolution=(32, 32),
        sample_rate=16000, channels=1, samples=16000,
    )  # fmt: skip
    assert shapes.buckets == () and shapes.clip_shapes[0].video_shape == shapes.video_shape
    assert av_dit(shapes).video == (8, 32, 32)


def _batch(data: DataConfig, rows: int, seed: int) -> dict[str, Any]:
    batch: dict[str, Any] = random_batch(data, rows, seed)
    batch["valid"] = torch.ones(rows, dtype=torch.bool)
    batch["generators"] = [torch.Generator().manual_seed(seed * 10 + i) for i in range(rows)]
    return batch


@pytest.mark.parametrize("arch", ["av_dit", "audio_ar"])
def test_each_bucket_trains_as_a_model_built_for_it_alone(arch: str) -> None:
    """Forward and backward on two bucket shapes; the loss, gradients and FLOPs equal
    those of a model built for that bucket's shape, with the same weights."""
    data = AV if arch == "av_dit" else AUDIO
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch), data)  # type: ignore[arg-type]
    with torch.no_grad():  # every weight non-zero: adaLN-zero would hide most paths
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    costs = contract.SampleCosts(model)
    seen = set()
    for index in range(2):
        alone = build_model(ModelConfig(arch=arch), bucket_data(data, index))  # type: ignore[arg-type]
        alone.load_state_dict(model.state_dict())  # the RoPE tables are not in it
        batch = _batch(bucket_data(data, index), 2, seed=index)
        model.zero_grad()
        loss = model(batch)
        loss.backward()
        expected = alone(_batch(bucket_data(data, index), 2, seed=index))  # the same noise
        expected.backward()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        for (name, p), q in zip(model.named_parameters(), alone.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
        cost = costs.of(batch)
        assert cost.flops == alone.flops_per_sample() == model.flops_per_sample(batch)
        assert cost.tokens == alone.tokens_per_sample()
        seen.add(cost.flops)
    assert len(seen) == 2  # two shapes, two costs


def test_a_smaller_clip_takes_the_rope_rows_of_its_own_grid() -> None:
    model = build_model(ModelConfig(arch="av_dit"), AV)  # type: ignore[arg-type]
    assert isinstance(model, AVDiT)
    grid = model.video_grid_of(torch.empty(1, 4, 3, 32, 48))
    cos, sin = model.rope(grid, 10)
    want_cos, want_sin = av_rope_tables(32, grid, 10, model.audio_token_period)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)


def test_a_clip_larger_than_every_bucket_is_refused() -> None:
    model = build_model(ModelConfig(arch="av_dit"), AV)  # type: ignore[arg-type]
    too_wide = random_batch(data_config(resolution=(32, 64), fps=8, sample_rate=8000), 1)
    with pytest.raises(ValueError, match=r"batch\['video'\] has shape \(1, 8, 3, 32, 64\); .*"
                       r"W of 8 up to 48"):  # fmt: skip
        model(too_wide)


@pytest.mark.parametrize(
    ("bucket", "message", "fix"),
    [
        ({"resolution": [60, 64], "clip_seconds": 0.5},
         "data.buckets[1]: resolution [60, 64] is not a multiple of the tiny av_dit's patch 8x8",
         "use resolution [64, 64] in data.buckets[1]"),
        ({"clip_seconds": 0.375},
         "data.buckets[1]: clip_seconds 0.375 x data.fps 8 gives 3 frames, not a positive "
         "multiple of the tiny av_dit's temporal patch 2",
         "use clip_seconds 0.3 in data.buckets[1]"),  # 2.4 frames: the loader decodes 2
        ({"clip_seconds": 0.51},
         "data.buckets[1]: clip_seconds 0.51 x data.sample_rate 8000 gives 4080 audio samples",
         "use clip_seconds 0.5 in data.buckets[1]"),
    ],
)  # fmt: skip
def test_a_bucket_the_av_dit_cannot_take_is_refused_by_name(
    bucket: dict[str, Any], message: str, fix: str
) -> None:
    data = data_config(
        resolution=(32, 32), fps=8, sample_rate=8000,
        buckets=[{"clip_seconds": 0.5, "batch_size": 2}, {**bucket, "batch_size": 2}],
    )  # fmt: skip
    with pytest.raises(DataDoesNotFitModel) as info:
        build_model(ModelConfig(arch="av_dit"), data)  # type: ignore[arg-type]
    assert info.value.key == "data.buckets"
    assert info.value.message.startswith(message), info.value.message
    assert info.value.fix is not None and info.value.fix.startswith(fix), info.value.fix
    # The fix works.
    number = re.search(r"use \w+ (\[.*?\]|[\d.]+)", info.value.fix)
    assert number is not None
    name = "resolution" if "resolution" in fix else "clip_seconds"
    fixed = BucketConfig.model_validate(
        {**bucket, "batch_size": 2, name: yaml.safe_load(number.group(1))}
    )
    works = data.model_copy(update={"buckets": [data.buckets[0], fixed]})
    build_model(ModelConfig(arch="av_dit"), works)  # type: ignore[arg-type]


# --- preflight: the meta forward of every bucket ---------------------------------------

FUSSY = textwrap.dedent(
    """
    import torch
    from torch import nn

    from stoker.model import valid_mean


    class Fussy(nn.Module):
        '''Takes square frames only.'''

        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, batch):
            video = batch["video"]
            if video.shape[-1] != video.shape[-2]:
                raise ValueError(f"frames must be square, got {tuple(video.shape[-2:])}")
            per_sample = (video.float() * self.scale).flatten(1).mean(1)
            return valid_mean(per_sample, batch)


    def build(data):
        return Fussy()
    """
)


def _experiment(tmp_path: Path, arch: str, buckets: list[dict[str, Any]]) -> Path:
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        "model": {"arch": arch},
        "data": {"resolution": [32, 32], "fps": 8, "sample_rate": 8000, "buckets": buckets},
    }))  # fmt: skip
    return exp


def _config(exp: Path) -> ExperimentConfig:
    return resolve_config(exp, [], use_profile=False).config


@pytest.fixture
def fussy_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "fussy_model.py").write_text(FUSSY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return "fussy_model:build"


def test_preflight_runs_forward_on_every_bucket_and_names_the_one_refused(
    tmp_path: Path, fussy_plugin: str
) -> None:
    square = {"clip_seconds": 0.5, "batch_size": 2}
    check_model(_config(_experiment(tmp_path, fussy_plugin, [square])))  # passes
    wide = {"resolution": [32, 48], "clip_seconds": 1.0, "batch_size": 2}
    with pytest.raises(ModelSetupError) as info:
        check_model(_config(_experiment(tmp_path, fussy_plugin, [square, wide])))
    assert info.value.key == "data.buckets"
    assert info.value.message.startswith(
        "data.buckets[1] (video [8, 3, 32, 48], audio [1, 8000]): fussy_model:build: "
        "forward(batch) on a batch of the data's shapes raised ValueError: frames must be "
        "square, got (32, 48)"
    ), info.value.message
    assert info.value.fix is not None and "or change or drop data.buckets[1]" in info.value.fix


def test_check_refuses_a_bad_bucket_before_anything_starts(tmp_path: Path) -> None:
    """The launcher's check (a child process, as `stoker check` and `submit` run it)
    names the bucket and where data.buckets was set."""
    from stoker.launcher.launch.model_fit import check_model_fits

    buckets = [{"clip_seconds": 0.5, "batch_size": 2},
               {"resolution": [60, 64], "clip_seconds": 0.5, "batch_size": 2}]  # fmt: skip
    exp = _experiment(tmp_path, "av_dit", buckets)
    with pytest.raises(StokerError) as info:
        check_model_fits(resolve_config(exp, [], use_profile=False))
    assert (
        "data.buckets[1]: resolution [60, 64] is not a multiple of the tiny av_dit's patch 8x8 "
        f"(data.buckets from file {exp}:" in str(info.value)
    ), str(info.value)
    assert "use resolution [64, 64] in data.buckets[1]" in str(info.value)


# --- the trainer's sums: each batch at its own shape -----------------------------------


def test_a_log_window_counts_each_batch_at_its_own_cost() -> None:
    window = Window()
    window.add_batch(4, 0, contract.SampleCost(flops=10.0, tokens=3))
    window.add_batch(2, 1, contract.SampleCost(flops=100.0, tokens=30))
    window.add_batch(2, 0, contract.SampleCost(flops=None, tokens=None))  # the model can't say
    assert (window.rows, window.skipped_samples) == (8, 1)
    assert (window.flops, window.tokens) == (240.0, 72.0)
    mine = window.gathered(torch.device("cpu"), [0.0, 2.0, 0.0]).tolist()
    other = [1.0] * len(GATHERED)
    total = across_ranks([mine, other])
    assert total["rows"] == 9 and total["skipped_samples"] == 2 and total["flops"] == 241
    assert total["fetch_retries"] == 3 and total["loss_sum"] == 0.5  # a mean: (0 + 1) / 2
