"""Docs that tell the truth: the generated reference is current, the README's commands work."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.config.render import render_config_reference
from tests.clirun import stoker, stoker_text

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_config_reference_is_current() -> None:
    current = (REPO / "docs" / "config.md").read_text()
    assert current == render_config_reference(), (
        "docs/config.md is stale: run `stoker config schema > docs/config.md`"
    )


def code_blocks(markdown: str, section: str) -> list[str]:
    body = markdown.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\w*\n(.*?)```", body, re.S)


def test_quickstart_is_exactly_two_make_targets() -> None:
    (block,) = code_blocks(README, "Quickstart")
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    commands = [c for c in commands if c]
    assert commands == ["make run", "make test"]
    makefile = (REPO / "Makefile").read_text()
    for command in commands:
        assert re.search(rf"^{command.split()[1]}:", makefile, re.M), command
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci


def architecture_map() -> set[str]:
    """The paths the map in docs/architecture.md names; `a/b.py`, `c.py` in one cell
    names a/b.py and a/c.py."""
    text = (REPO / "docs" / "architecture.md").read_text()
    named: set[str] = set()
    for row in text.split("## Map", 1)[1].splitlines():
        if not row.startswith("| `"):
            continue
        folder = None
        for path in re.findall(r"`([^`]+)`", row.split("|")[1]):
            if "/" in path:
                named.add(path.rstrip("/"))
                folder = path.rstrip("/") if path.endswith("/") else path.rsplit("/", 1)[0]
            elif folder:
                named.add(f"{folder}/{path}")
    return named


def test_architecture_map_names_every_module_and_nothing_else() -> None:
    named = architecture_map()
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"
    unmapped = [
        str(module.relative_to(REPO))
        for module in sorted((REPO / "stoker").rglob("*.py"))
        if len(module.read_text().splitlines()) > 3  # an empty __init__ needs no row
        and not any(
            str(module.relative_to(REPO)) == path
            or str(module.relative_to(REPO)).startswith(path + "/")
            for path in named
        )
    ]
    assert not unmapped, f"modules without a row in docs/architecture.md's map: {unmapped}"


TOUR = [
    line[2:]
    for block in code_blocks(README, "A short tour")
    for line in block.splitlines()
    if line.startswith("$ ")
]


def test_tour_is_not_empty() -> None:
    assert len(TOUR) >= 4


def test_tour_runs_in_order(tmp_path: Path) -> None:
    """The tour as a reader types it: one folder, one command after another."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    for command in TOUR:
        args = shlex.split(command)
        assert args[0] == "stoker"
        result = stoker_text(*args[1:], cwd=tmp_path)
        # The README says the typo example exits 2 with a hint; every other command succeeds.
        if "stepz" in command:
            assert result.returncode == 2, command
            assert "(did you mean train.steps?)" in result.stderr  # as the README quotes it
        else:
            assert result.returncode == 0, f"{command}: {result.stderr}"


OWN_CODE_TOUR = [
    line[2:]
    for block in code_blocks(README, "Your own model or loop")
    for line in block.splitlines()
    if line.startswith("$ ")
]


def test_own_code_tour_runs_in_order(tmp_path: Path) -> None:
    """A model package of one's own, checked and trained; then the example own loop."""
    assert len(OWN_CODE_TOUR) >= 3
    (tmp_path / "examples").symlink_to(REPO / "examples")
    cwd = tmp_path
    for command in OWN_CODE_TOUR:
        # `python` in the README is whatever python the user has; here, this venv's.
        args = [sys.executable if a == "python" else a for a in shlex.split(command)]
        if args[0] == "cd":
            cwd = (cwd / args[1]).resolve()
            continue
        assert args[0] == "stoker"
        result = stoker(*args[1:], cwd=cwd, timeout=900)
        assert result.returncode == 0, f"{command}: {result.stderr[-3000:]}"
        if args[1] == "run":
            assert "completed at step 20" in result.stderr, result.stderr[-3000:]


JOBS_TOUR = [
    line[2:]
    for block in code_blocks(README, "Jobs on a SLURM cluster")
    for line in block.splitlines()
    if line.startswith("$ ")
]


@pytest.mark.slurm
def test_jobs_tour_runs_on_the_cluster(slurm_cluster: ClusterSettings, tmp_path: Path) -> None:
    assert len(JOBS_TOUR) >= 4
    (tmp_path / "examples").symlink_to(REPO / "examples")
    for command in JOBS_TOUR:
        args = shlex.split(command)
        assert args[0] == "stoker"
        # `python` in the README is whatever python the user has; here, this venv's.
        args = [sys.executable if a == "python" else a for a in args]
        # In this process, but for a --local submit: its supervisor is the submitting
        # process's child, and outlives it.
        run = stoker if "--local" in args else stoker_text
        result = run(*args[1:], cwd=tmp_path)
        assert result.returncode == 0, f"{command}: {result.stderr}"
        if args[1] == "status":
            assert "stoker-tiny" in result.stdout


def test_the_scripts_the_tours_run_are_files_of_the_clone() -> None:
    """A reader types the tours in a fresh clone: each `-- python X.py` names a file there
    (`stoker submit` refuses a script that is not there)."""
    from stoker.launcher.launch.local_inputs import script_of

    commands = [shlex.split(c) for c in [*TOUR, *OWN_CODE_TOUR, *JOBS_TOUR] if " -- " in c]
    scripts = [script_of(args[args.index("--") + 1 :]) for args in commands]
    assert any(scripts)
    assert [s for s in scripts if s is not None and not (REPO / s).is_file()] == []


DATA_TOUR = [
    line[2:]
    for block in code_blocks(README, "AV data")
    for line in block.splitlines()
    if line.startswith("$ ")
]


def test_data_tour_runs_in_order(tmp_path: Path) -> None:
    assert len(DATA_TOUR) >= 4
    outputs, notes = {}, {}
    for command in DATA_TOUR:
        args = shlex.split(command)
        assert args[0] == "stoker"
        result = stoker_text(*args[1:], cwd=tmp_path)
        assert result.returncode == 0, f"{command}: {result.stderr}"
        outputs[args[2]], notes[args[2]] = result.stdout, result.stderr
    packed = json.loads(outputs["pack"].strip().splitlines()[-1])
    # 16 clips of 4 s, cut in 2
    assert packed == {"samples": 32, "shards": 1, "skipped": [], "skipped_by_kind": {}}
    assert (
        re.search(r"32 in 1 shard *$", outputs["inspect"], re.M) and "headroom" in outputs["bench"]
    )
    assert "32 samples in 1 shard:" in outputs["encode"]  # latents of every clip
    # The packed 2 s clips stay 2 s latents (not data.clip_seconds' default 1 s), and
    # the encode says what it decoded at and why.
    latents = json.loads((tmp_path / "latents" / "manifest.json").read_text())
    assert latents["encoding"]["decode"]["clip_seconds"] == 2.0
    assert "2 s clips at 8 fps" in notes["encode"]
    assert "data.clip_seconds from the source's clips" in notes["encode"]
    # The frames of `data inspect` went to a folder of their own, not the user's.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latents", "packed", "raw"]


def test_kernels_example_runs() -> None:
    (block,) = [b for b in code_blocks(README, "Kernels") if "import torch" in b]
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
