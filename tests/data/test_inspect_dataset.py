"""A data set's digest: `stoker data inspect` prints it (human output and --json), the same
16 hex digits a run records as its MLflow dataset input's digest; `read_manifest`
reads the manifest alone, and tells plain WebDataset shards (no manifest) from no
data set at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stoker.data.inspect_dataset import read_manifest
from stoker.data.synthetic.shapes import synth_dataset
from stoker.errors import StokerError
from tests.clirun import stoker_text


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("inspect") / "set"
    synth_dataset(str(root), clips=4, seconds=1.0, size=(32, 32), fps=8, samples_per_shard=2)
    return root


def test_inspect_prints_the_digest_a_run_records(small_set: Path) -> None:
    manifest = read_manifest(str(small_set))
    assert manifest is not None and manifest.samples == 4
    digest = manifest.fingerprint()
    assert len(digest) == 16 and int(digest, 16) >= 0
    report = json.loads(stoker_text("data", "inspect", str(small_set), "--json", "--frames", "0",
                               check=True).stdout)  # fmt: skip
    assert report["digest"] == digest
    text = stoker_text("data", "inspect", str(small_set), "--frames", "0", check=True).stdout
    assert any(line.split() == ["digest", digest] for line in text.splitlines()), text


def test_read_manifest_reads_no_index_and_knows_plain_shards(
    small_set: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(small_set, copy)
    for index in copy.glob("shards/*.index.json"):
        index.unlink()  # the manifest alone is enough
    assert read_manifest(f"file://{copy}") == read_manifest(str(small_set))
    plain = tmp_path / "plain"
    plain.mkdir()
    for tar in small_set.glob("shards/*.tar"):
        shutil.copy(tar, plain / tar.name)
    assert read_manifest(str(plain)) is None
    assert read_manifest(str(plain / "shard-000000.tar")) is None
    assert read_manifest(f"{plain}/shard-{{000000..000001}}.tar") is None
    with pytest.raises(StokerError, match=r"manifest\.json is missing"):
        read_manifest(str(tmp_path / "none"))


def test_suggested_buckets_paste_into_an_experiment(tmp_path: Path) -> None:
    """Wide clips of 1.5 s: one bucket of their aspect ratio, at a length they hold, as
    YAML that (with batch sizes added) is a valid data.buckets."""
    import yaml

    from stoker.config.schema import ExperimentConfig

    wide = tmp_path / "wide"
    synth_dataset(str(wide), clips=4, seconds=1.5, size=(32, 64), fps=8)
    result = stoker_text("data", "inspect", str(wide), "--frames", "0", "--suggest-buckets",
                    "--max-side", "32", check=True)  # fmt: skip
    text = result.stdout[result.stdout.index("# suggested buckets") :]
    assert "resolution: [16, 32], clip_seconds: 1.5}  # 100%" in text, text
    buckets = yaml.safe_load(text)["buckets"]
    data = {"buckets": [{**b, "batch_size": 8} for b in buckets]}
    assert ExperimentConfig.model_validate({"data": data}).data.buckets[0].resolution == (16, 32)
    # The default --max-side (256) above the data's 32x64: the data's size, never larger.
    report = json.loads(stoker_text("data", "inspect", str(wide), "--frames", "0", "--json",
                               "--suggest-buckets", check=True).stdout)  # fmt: skip
    assert report["suggested_buckets"] == [
        {"resolution": [32, 64], "clip_seconds": 1.5, "share": 1.0}
    ]
