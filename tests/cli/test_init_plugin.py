"""`stoker init --plugin NAME`: the package it writes works as its README says, from its
own folder: its test passes, `stoker check experiment.yaml` passes, and `stoker run
experiment.yaml` trains it. A NAME that cannot be a package of its own, or a folder in
the way, is refused before anything is written."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.clirun import stoker, stoker_text

FILES = [
    "README.md",
    "demo_net/__init__.py",
    "demo_net/model.py",
    "experiment.yaml",
    "pyproject.toml",
    "tests/test_model.py",
]


@pytest.fixture(scope="module")
def demo_net(tmp_path_factory: pytest.TempPathFactory, module_home: dict[str, str]) -> Path:
    """The package demo_net, written once by the real command and shared by the
    module's tests (they run commands in it; none changes its files)."""
    root = tmp_path_factory.mktemp("plugin")
    result = stoker_text("init", "--plugin", "demo_net", cwd=root, env=module_home)
    assert result.returncode == 0, result.stderr
    assert "next: cd demo_net && stoker check experiment.yaml" in result.stderr
    return root / "demo_net"


def test_it_writes_an_installable_package_and_an_experiment_naming_it(demo_net: Path) -> None:
    assert sorted(str(p.relative_to(demo_net)) for p in demo_net.rglob("*") if p.is_file()) == (
        FILES
    )
    experiment = yaml.safe_load((demo_net / "experiment.yaml").read_text())
    assert experiment["model"]["arch"] == "demo_net.model:build"
    assert experiment["model"]["args"] == {"width": 32, "depth": 2, "downsample": 2}
    pyproject = (demo_net / "pyproject.toml").read_text()
    assert 'packages = ["demo_net"]' in pyproject and 'name = "demo-net"' in pyproject
    readme = (demo_net / "README.md").read_text()
    for command in (
        "stoker check experiment.yaml",
        "stoker run experiment.yaml train.steps=20",
        "stoker submit experiment.yaml",
    ):
        assert f"$ {command}\n" in readme, command


def test_its_own_test_passes(demo_net: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=demo_net, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout


def test_stoker_check_passes_in_its_folder(demo_net: Path) -> None:
    result = stoker_text("check", "experiment.yaml", cwd=demo_net)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok    model        demo_net.model:build builds on the meta device" in result.stdout


def test_stoker_run_trains_it_in_its_folder(
    demo_net: Path, synthetic_av_set: Callable[..., Path]
) -> None:
    data = synthetic_av_set(clips=16, size=(32, 32))
    result = stoker(
        "run", "--json", "experiment.yaml", "train.steps=4", "train.log_every=2",
        f"data.url={data}", "data.resolution=[32,32]", "data.batch_size=4",
        "data.num_workers=0", cwd=demo_net, timeout=900,
        env={"OMP_NUM_THREADS": "1"},  # one torch thread: others spin on a loaded machine
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["state"] == "COMPLETED" and summary["step"] == 4
    assert math.isfinite(summary["loss"]) and summary["loss"] > 0


@pytest.mark.parametrize(
    ("name", "message", "fix"),
    [
        ("my-model", "--plugin 'my-model' is not a Python package name", "--plugin my_model"),
        ("2fast", "--plugin '2fast' is not a Python package name", "--plugin my_2fast"),
        ("class", "--plugin 'class' is not a Python package name", "--plugin my_class"),
        ("json", "--plugin 'json' would shadow the module json (", "--plugin my_json"),
        ("torch", "--plugin 'torch' would shadow the module torch (", "--plugin my_torch"),
        ("stoker", "--plugin 'stoker' would shadow the module stoker (", "--plugin my_stoker"),
    ],
)
def test_a_name_that_cannot_be_a_package_of_its_own_is_refused(
    tmp_path: Path, name: str, message: str, fix: str
) -> None:
    result = stoker_text("init", "--plugin", name, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "fix: " in result.stderr and fix in result.stderr
    assert not any(tmp_path.iterdir())


def test_a_folder_with_files_is_not_written_into_without_force(tmp_path: Path) -> None:
    folder = tmp_path / "demo_net"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    refused = stoker_text("init", "--plugin", "demo_net", cwd=tmp_path)
    assert refused.returncode == 2
    assert "demo_net already exists and is not empty; nothing was written" in refused.stderr
    assert "--force" in refused.stderr
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]

    stoker_text("init", "--plugin", "demo_net", "--force", cwd=tmp_path, check=True)
    assert (folder / "notes.txt").read_text() == "mine\n"  # what is not the template's stays
    assert (folder / "demo_net" / "model.py").is_file()


def test_a_second_argument_is_the_package_folder(tmp_path: Path) -> None:
    stoker_text("init", "--plugin", "demo_net", "projects/net", cwd=tmp_path, check=True)
    assert (tmp_path / "projects" / "net" / "demo_net" / "model.py").is_file()
    assert not (tmp_path / "demo_net").exists()
