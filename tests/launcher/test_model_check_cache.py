"""A passed model check is kept and not made again while its settings and every file it
imported stay the same (stoker/launcher/launch/model_check_cache.py): the child process
is real where a check runs; where one must not, starting it fails the test."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stoker.config import resolve_config
from stoker.errors import StokerError
from stoker.launcher.launch import model_check_cache, model_fit
from stoker.launcher.launch.model_check_cache import (
    CACHE_ENV,
    cache_folder,
    check_key,
    passed_before,
    remember,
)
from tests.clirun import stoker_text

OWN_MODEL = Path(__file__).resolve().parents[2] / "examples" / "own_model"
ARCH = "model.arch=own_model.denoiser:build"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "model-checks"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


def _no_child(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"the model check started a child process: {args[0]}")


def test_a_pass_is_kept_until_a_file_it_imported_changes(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    shutil.copytree(OWN_MODEL, project, ignore=shutil.ignore_patterns("__pycache__"))
    resolved = resolve_config(None, [ARCH, "model.args.width=16"])
    model_fit.check_model_fits(resolved, cwd=project)  # a real child: it passes
    assert len(list(cache.glob("*.json.gz"))) == 1

    # Again, from another data set of the same shapes: no child.
    monkeypatch.setattr(subprocess, "run", _no_child)
    elsewhere = resolve_config(None, [ARCH, "model.args.width=16", "data.url=/elsewhere/set"])
    model_fit.check_model_fits(elsewhere, cwd=project)
    # Another setting the model reads is another check; so is another folder: the model
    # was imported from the one it ran in.
    with pytest.raises(AssertionError, match="started a child process"):
        model_fit.check_model_fits(resolve_config(None, [ARCH, "model.args.width=32"]), cwd=project)
    with pytest.raises(AssertionError, match="started a child process"):
        model_fit.check_model_fits(resolved, cwd=tmp_path)

    # The model's own file edited: checked again for real, and refused; a refusal is
    # not kept, so the next try is checked again too.
    monkeypatch.undo()
    monkeypatch.setenv(CACHE_ENV, str(cache))
    module = project / "own_model" / "denoiser.py"
    module.write_text(module.read_text() + "\nraise ValueError('broken on purpose')\n")
    for _ in range(2):
        with pytest.raises(StokerError, match="broken on purpose"):
            model_fit.check_model_fits(resolved, cwd=project)


# A factory that reads a file named in model.args as it builds (its depth, here).
FROM_FILE = """
from dataclasses import dataclass
from pathlib import Path

from own_model.denoiser import Args, DataShapes, Denoiser


@dataclass
class FileArgs:
    depth_file: str = "depth.txt"


def build(data: DataShapes, args: FileArgs) -> Denoiser:
    depth = int(Path(args.depth_file).read_text())
    return Denoiser(data, Args(width=8, depth=depth))
"""


def test_a_file_the_factory_read_is_watched_like_its_modules(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = tmp_path / "project"
    shutil.copytree(OWN_MODEL, project, ignore=shutil.ignore_patterns("__pycache__"))
    (project / "own_model" / "from_file.py").write_text(FROM_FILE)
    depth = tmp_path / "depth.txt"
    depth.write_text("1")
    resolved = resolve_config(
        None, ["model.arch=own_model.from_file:build", f"model.args.depth_file={depth}"]
    )
    model_fit.check_model_fits(resolved, cwd=project)  # a real child: it passes
    with monkeypatch.context() as patched:
        patched.setattr(subprocess, "run", _no_child)
        model_fit.check_model_fits(resolved, cwd=project)
    depth.write_text("0")  # Args refuses a depth below 1: only a new check can say so
    with pytest.raises(StokerError, match="width and depth must be >= 1"):
        model_fit.check_model_fits(resolved, cwd=project)


def test_a_pass_of_a_model_from_elsewhere_holds_in_any_folder_that_shadows_nothing(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = {name: tmp_path / name for name in ("a", "b", "c")}
    for folder in folders.values():
        folder.mkdir()
    resolved = resolve_config(None, ["model.size=tiny"])
    model_fit.check_model_fits(resolved, cwd=folders["a"])  # a real child: it passes
    monkeypatch.setattr(subprocess, "run", _no_child)
    # `stoker check` in another folder says the model builds, from the kept pass.
    result = stoker_text("check", "model.size=tiny", "--json", cwd=folders["b"])
    assert result.returncode == 0, result.stderr
    (model,) = [f for f in json.loads(result.stdout) if f["check"] == "model"]
    assert model["status"] == "ok", model
    # A module named as one the check imported would be imported instead of it.
    (folders["c"] / "numpy.py").write_text("raise ImportError('not numpy')\n")
    with pytest.raises(AssertionError, match="started a child process"):
        model_fit.check_model_fits(resolved, cwd=folders["c"])


def test_a_kept_pass_says_its_notes_again(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolved = resolve_config(None, [])
    python = "/no/such/python"
    key = check_key([resolved], python, {})
    assert key is not None
    remember(key, _imported(Path(__file__), tmp_path), ["av_dit: a note of the check"])
    monkeypatch.setattr(subprocess, "run", _no_child)
    said: list[str] = []
    model_fit.check_model_fits(resolved, python=python, say=said.append, cwd=tmp_path)
    assert said == ["av_dit: a note of the check"]


def test_what_the_key_holds() -> None:
    def key(*overrides: str, python: str = "python", env: dict[str, str] | None = None) -> str:
        found = check_key([resolve_config(None, list(overrides))], python, env or {})
        assert found is not None
        return found

    same = key()
    assert key("data.url=/a", "train.steps=7", "optim.lr=0.1") == same  # not read by the check
    # Nor how the loader reads the samples: a run with loader workers and one without
    # share a pass.
    assert key("data.num_workers=0", "data.start_method=spawn", "data.decode_threads=2",
               "data.prefetch_mb=1", "data.shuffle_shards=1", "data.clip_offset=start",
               "data.allow_changed_data=true") == same  # fmt: skip
    for other in ("data.resolution=[32,32]", "model.size=small", "train.seed=3",
                  "train.context_parallel=2", "job.env={A: b}"):  # fmt: skip
        assert key(other) != same, other
    assert key(python="python3.12") != same
    assert key(env={"PYTHONPATH": "/site"}) != same
    # Latents: their shapes are in the manifests at data.url, so never kept.
    assert check_key([resolve_config(None, ["data.modalities=[latent]"])], "p", {}) is None


def test_a_changed_or_missing_file_is_a_miss_and_old_entries_are_dropped(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    imported = tmp_path / "mod.py"
    imported.write_text("x = 1\n")
    remember("a" * 32, _imported(imported, cache.parent), [])
    assert passed_before("a" * 32, cache.parent) == []
    imported.write_text("x = 22\n")
    assert passed_before("a" * 32, cache.parent) is None
    imported.unlink()
    assert passed_before("a" * 32, cache.parent) is None
    assert passed_before("b" * 32, cache.parent) is None  # never kept
    (cache / f"{'c' * 32}.json.gz").write_bytes(b"not gzip")
    assert passed_before("c" * 32, cache.parent) is None  # unreadable: a miss, not an error

    monkeypatch.setattr(model_check_cache, "MAX_ENTRIES", 2)
    for name in ("d", "e", "f"):
        remember(name * 32, _imported(Path(__file__), tmp_path), [])
    assert sorted(p.name[0] for p in cache.glob("*.json.gz")) == ["e", "f"]


def test_the_cache_is_off_when_its_variable_is_empty(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHE_ENV, "")
    assert cache_folder() is None
    remember("a" * 32, _imported(Path(__file__), tmp_path), [])
    assert passed_before("a" * 32, tmp_path) is None
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("STOKER_HOME", str(tmp_path / "home"))
    assert cache_folder() == tmp_path / "home" / "cache" / "model-checks"


def _imported(path: Path, cwd: Path) -> dict[str, Any]:
    """What the check's child writes, for a check that imported one file."""
    stat = path.stat()
    return {"files": {str(path): [stat.st_size, stat.st_mtime_ns]}, "top": [], "cwd": str(cwd)}
