"""`stoker ckpt export CKPT OUT --register NAME` against a real `mlflow server`: a real
checkpoint (the Checkpointer, one process) whose train state names a run that has a
dataset input and samples at the checkpoint's step becomes a registered model version
whose tags carry that lineage and whose files are the export's bytes; a second
registration is version 2; a checkpoint without a run is registered with what is
missing said; a bad name, an unknown run and an unreachable server fail with the fix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from stoker.checkpoint.checkpointer import Checkpointer
from stoker.checkpoint.train_state import TrainState
from stoker.tracking.dataset_inputs import (
    TRAINING,
    DataSetInput,
    dataset_entry,
    send_dataset_inputs,
)
from stoker.tracking.model_registry import (
    COMMIT_TAG,
    MISSING_TAG,
    RUN_TAG,
    SAMPLES_TAG,
    STEP_TAG,
    URI_TAG,
    WEIGHTS_TAG,
    dataset_tag,
)
from tests.clirun import stoker, stoker_text
from tests.mlflow_server import Server, free_port

STEP = 4
DIGEST = "0123456789abcdef"


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow opens sqlite:///mlflow.db in the current folder wherever a URI is left
    unset: should a call here leave one out, keep that file out of the checkout."""
    monkeypatch.chdir(tmp_path)


def save_checkpoint(root: Path, run_id: str | None) -> Path:
    """A committed step-<STEP> folder of a small model, its train state naming `run_id`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    saver = Checkpointer(str(root), async_save=False)
    saver.save(
        STEP, TrainState(STEP, None, run_id), model, torch.optim.AdamW(model.parameters()), None
    )
    saver.close()
    return root / f"step-{STEP}"


def client_of(server: Server) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=server.url, registry_uri=server.url)


def training_run(client: Any, tmp_path: Path) -> str:
    """A run as a job leaves it: a training data set as an input, clips at step STEP."""
    found = client.get_experiment_by_name("registry")
    experiment_id = found.experiment_id if found else client.create_experiment("registry")
    run_id = str(client.create_run(experiment_id).info.run_id)
    data = DataSetInput("train", TRAINING, "s3://bucket/av-train", DIGEST, samples=10)
    send_dataset_inputs(client, run_id, [dataset_entry(data)])
    clip = tmp_path / "seed-0.mp4"
    clip.write_bytes(b"\x00\x00\x00\x18ftypmp42 not a real clip")
    client.log_artifact(run_id, str(clip), f"samples/step-{STEP}")
    return run_id


def export_and_register(ckpt: Path, out: Path, name: str, uri: str, *options: str) -> Any:
    return stoker_text("ckpt", "export", str(ckpt), str(out), *options, "--register", name,
                       "--tracking-uri", uri, "--json")  # fmt: skip


def test_a_version_carries_the_lineage_and_the_exported_bytes(
    mlflow_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow.artifacts

    # models:/NAME/1 resolves through the registry, then the tracking store: both default
    # to a sqlite file in the current folder.
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", mlflow_server.url)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)

    client = client_of(mlflow_server)
    run_id = training_run(client, tmp_path)
    ckpt = save_checkpoint(tmp_path / "checkpoints", run_id)
    out = tmp_path / "model.safetensors"

    # As docs/runtime.md writes it: the checkpoints folder, whose newest commit is exported.
    result = export_and_register(ckpt.parent, out, "av-dit-small", mlflow_server.url)
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)["registered"]
    assert (printed["name"], printed["version"], printed["run_id"]) == ("av-dit-small", 1, run_id)
    assert printed["missing"] == []

    version = client.get_model_version("av-dit-small", "1")
    assert version.run_id == run_id and version.source == f"models:/{printed['model_id']}"
    commit_sha = hashlib.sha256((ckpt / "COMMIT.json").read_bytes()).hexdigest()
    assert version.tags == {
        RUN_TAG: run_id,
        STEP_TAG: str(STEP),
        URI_TAG: str(ckpt),
        COMMIT_TAG: commit_sha,
        dataset_tag("train"): DIGEST,
        SAMPLES_TAG: f"runs:/{run_id}/samples/step-{STEP}",
        WEIGHTS_TAG: "model",
    }
    # The version's files are the export, byte for byte.
    fetched = Path(
        mlflow.artifacts.download_artifacts("models:/av-dit-small/1", dst_path=str(tmp_path / "f"))
    )
    assert (fetched / out.name).read_bytes() == out.read_bytes()
    # The run lists the logged model among its outputs, at the checkpoint's step.
    outputs = client.get_run(run_id).outputs.model_outputs
    assert [(o.model_id, o.step) for o in outputs] == [(printed["model_id"], STEP)]

    # docs/checkpoints.md's synopsis, every option: over the first export, in bf16.
    options = ("--format", "safetensors", "--dtype", "bf16", "--full", "--force")
    again = export_and_register(ckpt, out, "av-dit-small", mlflow_server.url, *options)
    assert again.returncode == 0, again.stderr
    floats = [t.dtype for t in load_file(out).values() if t.is_floating_point()]
    assert floats and set(floats) == {torch.bfloat16}
    assert json.loads(again.stdout)["registered"]["version"] == 2
    assert client.get_model_version("av-dit-small", "2").tags[COMMIT_TAG] == commit_sha


def test_a_checkpoint_without_a_run_is_registered_with_what_is_missing(
    mlflow_server: Server, tmp_path: Path
) -> None:
    ckpt = save_checkpoint(tmp_path / "checkpoints", None)
    result = stoker_text(
        "ckpt",
        "export",
        str(ckpt),
        str(tmp_path / "model.safetensors"),
        "--register",
        "untracked",
        "--tracking-uri",
        mlflow_server.url,
    )
    assert result.returncode == 0, result.stderr
    assert "registered untracked version 1" in result.stdout
    assert "without lineage: run, datasets, samples" in result.stderr
    version = client_of(mlflow_server).get_model_version("untracked", "1")
    assert version.run_id in (None, "")
    assert version.tags[MISSING_TAG] == "run, datasets, samples"
    assert RUN_TAG not in version.tags and SAMPLES_TAG not in version.tags
    assert (
        version.tags[COMMIT_TAG] == hashlib.sha256((ckpt / "COMMIT.json").read_bytes()).hexdigest()
    )


@pytest.mark.parametrize(
    ("case", "expected", "fix"),
    [
        ("bad name", "is not a name MLflow's model registry takes", "without '/' or ':'"),
        ("unknown run", "which is not in the store", "--tracking-uri"),
        ("unreachable", "is unreachable", "check that an MLflow server answers"),
    ],
)
def test_refusals_name_the_problem_and_the_fix(
    mlflow_server: Server, tmp_path: Path, case: str, expected: str, fix: str
) -> None:
    ckpt = save_checkpoint(tmp_path / "checkpoints", "0" * 32 if case == "unknown run" else None)
    out = tmp_path / "model.safetensors"
    name = "team/model" if case == "bad name" else "refused"
    uri = f"http://127.0.0.1:{free_port()}" if case == "unreachable" else mlflow_server.url
    result = stoker_text(
        "ckpt", "export", str(ckpt), str(out), "--register", name, "--tracking-uri", uri
    )
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and fix in result.stderr.split("fix:", 1)[-1]
    assert "Traceback" not in result.stderr
    # A bad name is refused before the export reads the checkpoint.
    assert out.exists() == (case != "bad name")


def test_a_run_registers_its_ema_weights_with_their_lineage_and_samples_join_it(
    isolated_home: Path, tmp_path: Path
) -> None:
    """train.register_final through `stoker run`, on the default store (stoker's sqlite
    in $STOKER_HOME, no MLFLOW_TRACKING_URI), run from a folder of the user's: the
    version names the run, the final checkpoint's COMMIT.json digest, the data set's
    digest and the final step's samples, and holds the EMA's weights. Then `ckpt export
    --register` of the same checkpoint, as a newcomer types it after `make run`, is
    version 2; neither leaves an mlflow.db in the current folder (MLflow's own default
    store, where its registry looked for the logged model)."""
    from mlflow.tracking import MlflowClient

    from stoker.data.synthetic.shapes import synth_dataset
    from stoker.tracking.store import resolve_tracking_uri

    data = tmp_path / "data"
    synth_dataset(str(data), clips=4, seconds=1.0, size=(32, 32), fps=8)
    bucket = tmp_path / "shared" / "ckpts"  # outside the run folder, as a shared bucket
    result = stoker(
        "run", "--nproc", "1", "--json", f"data.url={data}", f"checkpoint.root={bucket}",
        "data.batch_size=2", "data.num_workers=0", "train.steps=3", "checkpoint.every=0",
        "train.ema_decay=0.9", "train.sample_every=3", "train.sample_seeds=[0]",
        "train.sample_steps=1", "train.register_final=tiny-av", timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    job = json.loads(result.stdout.strip().splitlines()[-1])
    run_id = job["run_id"]
    default_store = resolve_tracking_uri(None).uri
    assert default_store.startswith("sqlite:") and str(isolated_home) in default_store
    client = MlflowClient(tracking_uri=default_store, registry_uri=default_store)
    version = client.get_model_version("tiny-av", "1")
    final = bucket / "step-3"
    commit = hashlib.sha256((final / "COMMIT.json").read_bytes()).hexdigest()
    assert version.run_id == run_id
    assert version.tags[RUN_TAG] == run_id and version.tags[COMMIT_TAG] == commit
    assert version.tags[STEP_TAG] == "3" and version.tags[WEIGHTS_TAG] == "ema"
    assert version.tags[SAMPLES_TAG] == f"runs:/{run_id}/samples/step-3"
    digests = [v for k, v in version.tags.items() if k.startswith("stoker.dataset.")]
    run = client.get_run(run_id)
    assert digests and digests[0] == run.inputs.dataset_inputs[0].dataset.digest
    assert MISSING_TAG not in version.tags

    # `stoker sample ROOT --log`, the checkpoint alone: the experiment it carries (its
    # commit's config.yaml) rebuilds the model; the clips join its run.
    record = json.loads((final / "COMMIT.json").read_text())
    assert "config.yaml" in {f["path"] for f in record["files"]}
    assert record["extra"]["model_arch"] == "av_dit"
    assert record["extra"]["tracking_uri"] == default_store
    clips = tmp_path / "clips"
    sampled = stoker_text("sample", str(bucket), "--seed", "9", "--steps", "1",
                          "--out", str(clips), "--log", "--json")  # fmt: skip
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    record = json.loads(sampled.stdout)
    assert record["step"] == 3 and record["weights"] == "ema"
    assert record["logged"] == f"runs:/{run_id}/samples/cli-step-3"
    logged = [a.path for a in client.list_artifacts(run_id, "samples/cli-step-3")]
    assert "samples/cli-step-3/seed-9.mp4" in logged, logged

    # As a newcomer types it: the checkpoint alone, registered in the store of its run.
    exported = stoker_text("ckpt", "export", str(bucket), str(tmp_path / "model.safetensors"),
                           "--register", "tiny-av")  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "registered tiny-av version 2" in exported.stdout
    again = client.get_model_version("tiny-av", "2")
    assert again.run_id == run_id and again.tags[COMMIT_TAG] == commit
    assert not (tmp_path / "mlflow.db").exists() and not Path("mlflow.db").exists()
