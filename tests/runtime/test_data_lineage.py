"""A run's data lineage (stoker/runtime/observe/data_lineage.py): which data sets a config makes
a run read, each recorded once in its MLflow run with its manifest's digest and
totals, by the trainer (a restart into the same run adds nothing) and by a loop of
one's own (`stoker.job.init()`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from stoker.config import DataConfig
from stoker.data.format.shard_format import MANIFEST_NAME, parse_manifest
from stoker.data.synthetic.default_set import synthetic_data_path
from stoker.data.synthetic.shapes import synth_dataset
from stoker.runtime.observe.data_lineage import data_sets_of, record_data_sets
from stoker.tracking.dataset_inputs import CONTEXT_TAG, DataSetInput


@pytest.fixture(scope="module")
def sets(synthetic_av_set: Callable[..., Path]) -> tuple[Path, Path]:
    """A training set and a held-out one, small (2 s clips at 8 fps)."""
    train = synthetic_av_set(clips=8, size=(64, 64))
    return train, synthetic_av_set(clips=4, size=(64, 64), seed=1)


def manifest_of(root: Path) -> Any:
    return parse_manifest((root / MANIFEST_NAME).read_bytes(), str(root))


class Recorder:
    def __init__(self) -> None:
        self.inputs: list[DataSetInput] = []

    def log_dataset_inputs(self, inputs: Sequence[DataSetInput]) -> None:
        self.inputs += inputs


def test_the_data_sets_a_config_makes_a_run_read() -> None:
    def named(data: dict[str, Any], **kwargs: bool) -> list[tuple[str, str, str]]:
        refs = data_sets_of(DataConfig.model_validate(data), **kwargs)
        return [(r.name, r.context, r.url) for r in refs]

    one = {"url": "s3://b/train", "eval_url": "s3://b/held"}
    assert named(one, evaluates=True) == [
        ("train", "training", "s3://b/train"), ("eval", "eval", "s3://b/held")
    ]  # fmt: skip
    assert named(one, evaluates=False) == [("train", "training", "s3://b/train")]
    mixture = {"sources": [{"name": "speech", "url": "s3://b/speech", "weight": 3},
                           {"name": "music", "url": "s3://b/music"}],
               "eval_url": "s3://b/held"}  # fmt: skip
    refs = data_sets_of(DataConfig.model_validate(mixture), evaluates=True)
    assert [(r.name, r.context, r.weight) for r in refs] == [
        ("speech", "training", 3.0), ("music", "training", 1.0), ("eval", "eval", None)
    ]  # fmt: skip
    synthetic = DataConfig()
    assert named({}, evaluates=True) == [
        ("synthetic", "training", str(synthetic_data_path(synthetic))),
        ("eval", "eval", str(synthetic_data_path(synthetic, "eval"))),
    ]
    # A loop of one's own at init: the synthetic set only once run.loader() makes it.
    assert named({}, evaluates=True, synthetic=False) == []
    assert named({"eval_url": "/held"}, evaluates=True, synthetic=False) == [
        ("eval", "eval", "/held")
    ]


def test_the_synthetic_set_is_recorded_with_its_digest_and_a_missing_one_is_said(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = DataConfig(resolution=(32, 32))
    made = synthetic_data_path(data)
    synth_dataset(str(made), clips=3, seconds=2.0, size=(32, 32), fps=8)
    sink = Recorder()
    record_data_sets(sink, data, evaluates=True)  # the held-out synthetic set is not made
    (recorded,) = sink.inputs
    manifest = manifest_of(made)
    assert (recorded.name, recorded.context, recorded.url) == ("synthetic", "training", str(made))
    assert recorded.digest == manifest.fingerprint() and recorded.samples == 3
    assert recorded.duration_s == pytest.approx(6.0, rel=0.01)
    assert recorded.modalities == ("video", "audio", "text", "meta")
    err = capfd.readouterr().err
    assert "data set 'eval'" in err and "is not recorded in MLflow" in err, err
    assert "manifest.json is missing" in err, err


def run_train(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The entry point, on one torch thread (its default: every core of the machine)."""
    env = {**env, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "stoker.runtime.train", "--config", str(config)],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip


def test_a_run_records_its_data_sets_once_across_a_restart(
    sets: tuple[Path, Path], tmp_path: Path, isolated_home: Path
) -> None:
    """The trainer's entry point twice on one run folder: the second attempt resumes from
    the first's checkpoint into the same MLflow run (MLFLOW_RUN_ID, as a requeued job)."""
    from mlflow.tracking import MlflowClient

    train, held_out = sets
    config = tmp_path / "run" / "config.yaml"
    config.parent.mkdir()
    experiment = {
        "job": {"name": "lineage"},
        "data": {"url": str(train), "eval_url": str(held_out), "batch_size": 2,
                 "num_workers": 0, "prefetch_mb": 1},
        "train": {"steps": 2, "log_every": 1, "eval_every": 2, "eval_batches": 1},
        "checkpoint": {"every": 2},
    }  # fmt: skip
    config.write_text(yaml.safe_dump(experiment))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "STOKER_RUN"))}
    first = run_train(config, env)
    assert first.returncode == 0, first.stderr[-3000:]
    client: Any = MlflowClient(f"sqlite:///{isolated_home / '.stoker' / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs(client.get_experiment_by_name("stoker").experiment_id)

    experiment["train"]["steps"] = 4  # type: ignore[index]
    config.write_text(yaml.safe_dump(experiment))
    second = run_train(config, {**env, "MLFLOW_RUN_ID": run.info.run_id})
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stdout and "finished at step 4" in second.stdout

    inputs = client.get_run(run.info.run_id).inputs.dataset_inputs
    by_name = {i.dataset.name: i for i in inputs}
    assert len(inputs) == 2 and sorted(by_name) == ["eval", "train"]
    for name, root, context in (("train", train, "training"), ("eval", held_out, "eval")):
        dataset = by_name[name].dataset
        manifest = manifest_of(root)
        assert dataset.digest == manifest.fingerprint(), name
        assert json.loads(dataset.source) == {"uri": str(root)}
        profile = json.loads(dataset.profile)
        assert profile["samples"] == manifest.samples and profile["shards"] == 1
        assert profile["hours"] == pytest.approx(manifest.totals.duration_s / 3600, abs=1e-6)
        assert {t.key: t.value for t in by_name[name].tags} == {CONTEXT_TAG: context}


OWN_LOOP = """
import sys
from stoker import job

run = job.init(sys.argv[1])
run.finish()
print("run", run.run_id)
"""


def test_a_loop_of_ones_own_records_the_data_sets_its_config_names(
    sets: tuple[Path, Path], tmp_path: Path, isolated_home: Path
) -> None:
    from mlflow.tracking import MlflowClient

    train, held_out = sets
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({
        "job": {"name": "own"}, "data": {"url": str(train), "eval_url": str(held_out)},
    }))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "STOKER_"))}
    env.update(HOME=str(isolated_home), STOKER_HOME=str(isolated_home / ".stoker"))
    result = subprocess.run([sys.executable, "-c", OWN_LOOP, str(config)], capture_output=True,
                            text=True, timeout=300, env=env, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = result.stdout.split("run ")[-1].strip()
    client: Any = MlflowClient(f"sqlite:///{isolated_home / '.stoker' / 'mlflow' / 'mlflow.db'}")
    inputs = client.get_run(run_id).inputs.dataset_inputs
    assert sorted((i.dataset.name, i.dataset.digest) for i in inputs) == [
        ("eval", manifest_of(held_out).fingerprint()),
        ("train", manifest_of(train).fingerprint()),
    ]
