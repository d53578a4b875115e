"""`stoker check`: an experiment's model, data, checkpoint root and MLflow store,
checked before anything is queued; one line each, exit 1 when one failed. The command
runs in the test process (`stoker_text`); its own child processes (the model's and the
transform's import checks) are real."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from stoker.data.synthetic.shapes import synth_dataset
from tests.clirun import stoker_text
from tests.s3_server import S3Server

OWN_MODEL = Path(__file__).resolve().parents[2] / "examples" / "own_model"


def _findings(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[int, dict[str, dict]]:
    result = stoker_text("check", *args, "--json", cwd=cwd, env=env)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, {f["check"]: f for f in json.loads(result.stdout)}


@dataclass(frozen=True)
class Sound:
    tmp: Path
    project: Path
    code: int
    found: dict[str, dict]


@pytest.fixture(scope="module")
def sound(tmp_path_factory: pytest.TempPathFactory, module_home: dict[str, str]) -> Sound:
    """One check of a sound experiment, shared: a folder holding the plugin model
    (examples/own_model) and a transform package, a data set, a checkpoint root. The
    model check and the transform's import each start a child process importing torch."""
    tmp = tmp_path_factory.mktemp("sound")
    project = tmp / "proj"
    shutil.copytree(OWN_MODEL, project)
    (project / "my_aug").mkdir()
    (project / "my_aug" / "__init__.py").write_text("")
    (project / "my_aug" / "crops.py").write_text(
        "import torch\n\n\ndef center_crop(sample):\n    return sample\n"
    )
    data = tmp / "data"
    synth_dataset(str(data), clips=4, seconds=1.0, size=(64, 64), fps=8)
    # As docs/bring-your-own.md writes it: an experiment file and one override.
    experiment = {
        "model": {"arch": "own_model.denoiser:build", "args": {"width": 8}},
        "data": {"url": str(data), "transform": "my_aug.crops:center_crop"},
        "checkpoint": {"root": str(tmp / "ckpt")},
    }
    (project / "exp.yaml").write_text(yaml.safe_dump(experiment))
    code, found = _findings("exp.yaml", "model.args.width=256", cwd=project, env=module_home)
    return Sound(tmp, project, code, found)


def test_a_sound_experiment_passes_every_check(sound: Sound) -> None:
    code, found, data = sound.code, sound.found, sound.tmp / "data"
    assert code == 0, found
    assert [f["status"] for f in found.values()][:3] == ["ok", "ok", "ok"], found
    assert "own_model.denoiser:build builds on the meta device" in found["model"]["detail"]
    assert f"data.url {data}: 4 samples in" in found["data"]["detail"]
    ckpt = sound.tmp / "ckpt"
    assert found["checkpoints"]["detail"] == f"checkpoint.root {ckpt} takes a file"
    assert found["MLflow"]["status"] in ("ok", "warn")  # warn: a store local to this node
    assert not any(ckpt.iterdir())  # its probe file is gone


def test_each_broken_part_fails_with_its_fix(tmp_path: Path) -> None:
    data = tmp_path / "data"
    synth_dataset(str(data), clips=4, seconds=1.0, size=(64, 64), fps=8)
    # A data set packed from footage without captions: video and audio only.
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["modalities"] = ["video", "audio"]
    (data / "manifest.json").write_text(json.dumps(manifest))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, found = _findings(
        "model.arch=nosuch.models:build", f"data.url={data}",
        "data.modalities=[video,audio,text]", f"data.eval_url={tmp_path / 'nothing'}",
        "data.transform=nosuch_aug.crops:center_crop",
        f"checkpoint.root={blocker / 'ckpt'}", "tracking.uri=http://127.0.0.1:9",
    )  # fmt: skip
    assert code == 1
    assert {name: f["status"] for name, f in found.items()} == {
        "model": "fail", "data": "fail", "eval data": "fail", "transform": "fail",
        "checkpoints": "fail", "MLflow": "fail",
    }  # fmt: skip
    assert "no module 'nosuch'" in found["model"]["detail"]
    assert "(model.arch from override model.arch=nosuch.models:build)" in found["model"]["detail"]
    assert "not text" in found["data"]["detail"] and "drop text" in found["data"]["fix"]
    assert "manifest.json is missing there" in found["eval data"]["detail"]
    transform = found["transform"]["detail"]
    assert transform.startswith(
        "data.transform 'nosuch_aug.crops:center_crop': no module 'nosuch_aug' in "
    )
    assert "(data.transform from override data.transform=nosuch_aug.crops:center_crop)" in transform
    assert "run stoker from the folder that holds nosuch_aug/" in found["transform"]["fix"]
    assert "does not take a file" in found["checkpoints"]["detail"]
    assert "127.0.0.1:9" in found["MLflow"]["detail"] and found["MLflow"]["fix"]


def test_data_transform_is_imported_as_the_loader_workers_will(sound: Sound) -> None:
    """From the folder stoker runs in, as the workers import it by name: a function
    that is there passes with its file and line (the sound experiment's check); a
    misspelt one fails with where the value came from and the functions there are."""
    project, found = sound.project, sound.found
    assert found["transform"]["status"] == "ok", found["transform"]
    assert found["transform"]["detail"] == (
        f"data.transform my_aug.crops:center_crop imports ({project}/my_aug/crops.py:4)"
    )
    code, found = _findings("data.transform=my_aug.crops:centre_crop", cwd=project)
    assert code == 1 and found["transform"]["status"] == "fail", found["transform"]
    assert found["transform"]["detail"] == (
        f"data.transform 'my_aug.crops:centre_crop': module my_aug.crops "
        f"({project}/my_aug/crops.py) has no 'centre_crop' (did you mean center_crop?) "
        "(data.transform from override data.transform=my_aug.crops:centre_crop)"
    )
    assert found["transform"]["fix"] == "name one of its functions: center_crop"


def test_a_config_error_stops_at_once(tmp_path: Path) -> None:
    result = stoker_text("check", "train.stepz=5")
    assert result.returncode == 2
    assert "did you mean train.steps?" in result.stderr
    assert result.stdout == ""


def test_a_checkpoint_root_on_s3_is_probed_through_the_s3_api(
    tmp_path: Path, s3_env: S3Server
) -> None:
    """checkpoint.root on the S3 API server: a bucket that exists takes the probe file
    (and loses it again); one that does not fails with the fix."""
    import s3fs

    bucket = s3_env.new_bucket()
    code, found = _findings("train.steps=1", f"checkpoint.root=s3://{bucket}/ckpt")
    assert found["checkpoints"]["status"] == "ok", found["checkpoints"]
    assert s3fs.S3FileSystem().find(f"{bucket}/ckpt") == []  # the probe is gone
    code, found = _findings(f"checkpoint.root=s3://no-such-bucket-{bucket}/ckpt")
    assert code == 1 and found["checkpoints"]["status"] == "fail", found["checkpoints"]
    assert "does not take a file" in found["checkpoints"]["detail"]


def test_each_data_set_of_a_mixture_and_the_buckets_are_checked(tmp_path: Path) -> None:
    data = tmp_path / "data"
    synth_dataset(str(data), clips=4, seconds=1.0, size=(64, 64), fps=8)
    code, found = _findings(
        f"data.sources=[{{name: good, url: {data}}}, {{name: gone, url: {tmp_path / 'no'}}}]",
        "data.buckets=[{clip_seconds: 1, batch_size: 4}, {resolution: [64, 96], "
        "clip_seconds: 1, batch_size: 3}]", "job.ntasks_per_node=2",
    )  # fmt: skip
    assert code == 1
    assert found["data good"]["status"] == "ok", found
    assert f"data.sources[0] (good) {data}: 4 samples" in found["data good"]["detail"]
    assert found["data gone"]["status"] == "fail"
    assert "manifest.json is missing there" in found["data gone"]["detail"]
    assert found["buckets"]["status"] == "fail"
    assert "data.buckets[1] (64x96x1s" in found["buckets"]["detail"]
    assert "does not split over 2 ranks" in found["buckets"]["detail"]
    code, found = _findings(
        f"data.url={data}", "data.buckets=[{clip_seconds: 1, batch_size: 4}]",
        "job.ntasks_per_node=2",
    )  # fmt: skip
    assert found["buckets"] == {**found["buckets"], "status": "ok",
                                "detail": "global batches 64x64x1s: 4"}  # fmt: skip
