"""The synthetic latent set (data.url null, data.modalities [latent]): shapes from the
settings alone, equal to what the written set holds, the same bytes for the same
settings, made without PyAV, and the settings it cannot take refused by name."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.config import ExperimentConfig
from stoker.data.sets.dataset import open_dataset
from stoker.data.synthetic.shapes_latents import synthetic_latent_shapes, write_synthetic_latents
from stoker.errors import StokerError

REPO = Path(__file__).resolve().parents[2]


def data_config(**data: object) -> ExperimentConfig:
    return ExperimentConfig.model_validate({"data": {"modalities": ["latent"], **data}})


def test_the_written_set_holds_the_shapes_the_settings_give(tmp_path: Path) -> None:
    data = data_config(resolution=[32, 48], channels=2, clip_seconds=0.5, fps=8).data
    shapes = synthetic_latent_shapes(data)
    assert {n: (t.shape, t.dtype) for n, t in shapes.items()} == {
        "video": ((4, 8, 8, 12), "float16"),
        "audio": ((16, 50), "float16"),
    }
    manifest = write_synthetic_latents(tmp_path / "a", data, clips=5, seed=3)
    assert manifest.samples == 5 and manifest.encoding is not None
    assert manifest.encoding.shapes == {"": shapes}
    assert manifest.encoding.encoder.factory == "stoker.data.tiny_encoder:build"
    assert manifest.modalities == ["text", "meta", "latent"]
    dataset = open_dataset(str(tmp_path / "a"))
    (entry, *_) = dataset.read_index(0).samples
    assert entry.latent is not None and entry.latent.tensors == shapes
    # Equal settings, equal bytes.
    write_synthetic_latents(tmp_path / "b", data, clips=5, seed=3)
    digest = [hashlib.sha256((tmp_path / d / "shards" / "shard-000000.tar").read_bytes())
              for d in ("a", "b")]  # fmt: skip
    assert digest[0].hexdigest() == digest[1].hexdigest()


def test_settings_the_tiny_encoder_cannot_take_are_refused_by_name() -> None:
    with pytest.raises(StokerError, match=r"data\.resolution"):
        synthetic_latent_shapes(data_config(resolution=[30, 64]).data)
    with pytest.raises(StokerError, match=r"data\.buckets"):
        synthetic_latent_shapes(data_config(buckets=[{"clip_seconds": 1.0, "batch_size": 8}]).data)


def test_made_and_read_without_pyav(tmp_path: Path) -> None:
    code = f"""
import sys
from pathlib import Path
from stoker.config import ExperimentConfig
from stoker.data.stream.loader import loader_from_config
from stoker.data.synthetic.shapes_latents import write_synthetic_latents
cfg = ExperimentConfig.model_validate({{"data": {{"modalities": ["latent"], "num_workers": 0,
                                        "batch_size": 2, "url": {str(tmp_path)!r}}}}})
write_synthetic_latents(Path({str(tmp_path)!r}), cfg.data, clips=4, seed=0)
batch = next(iter(loader_from_config(cfg, rank=0, world_size=1)))
assert tuple(batch["latent"]["video"].shape) == (2, 8, 8, 16, 16), batch["latent"]["video"].shape
assert not any(m.split(".")[0] in ("av", "soundfile") for m in sys.modules)
"""
    blocker = REPO / "benchmarks" / "gpu_check" / "import_blocker"
    env = {"PATH": "/usr/bin:/bin", "STOKER_BLOCK_IMPORTS": "av,soundfile",
           "PYTHONPATH": f"{blocker}:{REPO}"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
