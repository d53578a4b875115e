"""Training on latents (`stoker data encode`, then `data.modalities: [latent]`): the
built-in av_dit learns on 2 ranks and its MLflow run names the latent data set, its
encoder and its source; a plugin model gets the latents' shapes and tensors; a media
data set asked for latents is refused with the fix."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from stoker.config import resolve_config
from stoker.data.encode.pipeline import EncodeRequest, run_encode
from stoker.data.encode.shard import DecodeSpec
from stoker.data.synthetic.shapes import synth_dataset
from stoker.errors import StokerError
from tests.clirun import stoker

TINY = "stoker.data.tiny_encoder:build"


@pytest.fixture(scope="module")
def latents(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(source, latents): 16 synthetic clips of 1 s at 64x64, and their tiny latents."""
    root = tmp_path_factory.mktemp("latent-training")
    synth_dataset(str(root / "src"), clips=16, seconds=1.0, size=(64, 64), samples_per_shard=4)
    spec = DecodeSpec(("video", "audio"), 8.0, (64, 64), 1.0, 16000, 1, "crop")
    run_encode(EncodeRequest(str(root / "src"), str(root / "latents"), TINY, {}, spec))
    return root / "src", root / "latents"


def test_the_av_dit_learns_on_latents_on_two_ranks(
    latents: tuple[Path, Path], isolated_home: Path
) -> None:
    from mlflow.tracking import MlflowClient

    source, data = latents
    result = stoker("run", f"data.url={data}", "data.modalities=[latent]", "data.batch_size=4",
                    "data.num_workers=1", "data.prefetch_mb=1", "train.steps=40",
                    "train.log_every=10", "--json",
                    timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["state"] == "COMPLETED" and summary["step"] == 40

    client: Any = MlflowClient(f"sqlite:///{isolated_home / '.stoker' / 'mlflow' / 'mlflow.db'}")
    run = client.get_run(summary["run_id"])
    assert run.data.tags["stoker.world_size"] == "2"
    losses = [m.value for m in client.get_metric_history(summary["run_id"], "loss")]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses
    (dataset,) = [i.dataset for i in run.inputs.dataset_inputs]
    assert dataset.name == "train" and json.loads(dataset.source) == {"uri": str(data)}
    profile = json.loads(dataset.profile)
    assert profile["modalities"] == "text, meta, latent" and profile["samples"] == 16
    identity = json.loads((data / "manifest.json").read_text())["encoding"]["encoder"]["digest"]
    assert profile["encoder"] == f"{TINY} ({identity[:12]})"
    assert profile["encoded from"] == f"file://{source} (stoker data synth)"
    assert profile["lineage"] == (
        f"file://{source} (stoker data synth) -> {data} (encoded by {TINY}, {identity[:12]})"
    )


PLUGIN = '''
import torch
from torch import nn
from stoker.model import DataShapes, valid_mean


class LatentMLP(nn.Module):
    """Predicts each video latent from itself through a bottleneck: a loss on latents."""

    def __init__(self, data: DataShapes) -> None:
        super().__init__()
        (shape,) = data.latents
        self.seen = dict(shape.tensors), dict(shape.dtypes)
        t, c, h, w = shape.tensors["video"]
        self.net = nn.Sequential(nn.Linear(c, 4), nn.Linear(4, c))

    def forward(self, batch):
        video = batch["latent"]["video"].float()          # [B, T, C, h, w]
        x = video.permute(0, 1, 3, 4, 2)
        per_sample = (self.net(x) - x).square().flatten(1).mean(1)
        return valid_mean(per_sample, batch)


def build(data: DataShapes) -> LatentMLP:
    return LatentMLP(data)
'''


def test_a_plugin_model_gets_the_latent_shapes_and_tensors(
    latents: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stoker.data.stream.loader import loader_from_config
    from stoker.runtime.models import build_model
    from stoker.runtime.preflight import check_model

    (tmp_path / "latplug.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    _, data = latents
    cfg = resolve_config(None, ["model.arch=latplug:build", f"data.url={data}",
                                "data.modalities=[latent]", "data.batch_size=4",
                                "data.num_workers=0"]).config  # fmt: skip
    check_model(cfg)  # the meta-device forward `stoker check` and `submit` run
    model: Any = build_model(cfg.model, cfg.data)
    assert model.seen == (
        {"video": (8, 8, 16, 16), "audio": (16, 100)},
        {"video": "float16", "audio": "float16"},
    )
    batch = next(loader_from_config(cfg, rank=0, world_size=1).batches(max_batches=1))
    loss = model(batch)
    assert loss.dim() == 0 and torch.isfinite(loss) and loss > 0


def test_a_media_data_set_asked_for_latents_is_refused(latents: tuple[Path, Path]) -> None:
    from stoker.runtime.models.build import data_shapes

    source, _ = latents
    cfg = resolve_config(None, [f"data.url={source}", "data.modalities=[latent]"]).config
    with pytest.raises(StokerError) as info:
        data_shapes(cfg.data)
    assert f"data set '{source}' holds no latents" in info.value.message
    assert "stoker data encode" in (info.value.fix or "")
