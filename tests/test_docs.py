"""Docs that tell the truth: the generated reference is current, the README's commands work."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.config.render import render_config_reference
from tests.clirun import STOKER, stoker, stoker_text

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


def python_snippets() -> list[tuple[str, str]]:
    """(`file:line`, code) of every ```python block of README.md and docs/*.md."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{path.relative_to(REPO)}:{line}", match.group(1)))
    return found


SNIPPETS = python_snippets()
# A function submitted as a SLURM job: run on the local cluster by tests/test_docs_cluster.py,
# in the cluster tests' process (this module's tests run beside them, off the cluster).
ON_THE_CLUSTER = "stoker.submit(train,"

# Snippets that cannot run here, known by a line of theirs, and what runs them instead.
NEEDS_A_CLUSTER = {
    # 2 nodes x 8 GPUs (the local cluster's nodes have 4), 2000 steps and a 4-task sweep
    # of 500: minutes of the suite's CPU for calls tests/launcher/test_api.py makes, each
    # on a short job of the local cluster.
    'stoker.submit("exp.yaml"': "trains 2000 steps on 2 x 8 GPUs and a 4-task sweep; "
    "tests/launcher/test_api.py makes these calls on the local cluster",
}


def _loader_on_a_small_set(
    code: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[str, list[str], dict[str, str]]:
    """The loader over the S3 API (the suite's S3 server), on its smallest synthetic set
    in a bucket of its own: one worker (its fork server is what the snippet must allow),
    4 clips a batch, 2 batches."""
    import fsspec

    data = request.getfixturevalue("synthetic_av_set")(clips=8, size=(32, 32))
    s3 = request.getfixturevalue("s3_env")  # AWS_* of this process and the snippet's
    url = f"s3://{s3.new_bucket()}/av"
    fsspec.filesystem("s3", skip_instance_cache=True).put(str(data), url, recursive=True)
    for before, after in [
        ('"s3://bucket/av"', repr(url)),
        ("batch_size=64", "batch_size=4"),
        ("num_workers=8", "num_workers=1"),
        ("step == 1000", "step == 2"),
    ]:
        assert before in code, before
        code = code.replace(before, after)
    return code, [sys.executable, "snippet.py"], s3.env


def _own_loop_under_stoker_run(
    code: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[str, list[str], dict[str, str]]:
    """As the page says to start it: `stoker run -- python loop.py`, one rank, 2 steps,
    no MLflow store (its first use alone is seconds of migrations)."""
    data = request.getfixturevalue("synthetic_av_set")(clips=8, size=(32, 32))
    settings = [f"data.url={data}", "data.batch_size=2", "data.num_workers=0", "train.steps=2"]
    command = [STOKER, "run", "--nproc", "1", *settings, "tracking.uri=none"]
    return code, [*command, "--", sys.executable, "snippet.py"], {}


def _an_exported_model(
    code: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[str, list[str], dict[str, str]]:
    """What `stoker ckpt export` leaves: a checkpoint's config.yaml and the model's
    weights under their plain names (the built-in experiment's defaults, tiny av_dit)."""
    import safetensors.torch

    from stoker.config import resolve_config, write_frozen
    from stoker.runtime.models import build_model

    resolved = resolve_config(None, use_profile=False)
    (tmp_path / "checkpoints" / "step-300").mkdir(parents=True)
    write_frozen(resolved, tmp_path / "checkpoints" / "step-300" / "config.yaml")
    model = build_model(resolved.config.model, resolved.config.data)
    safetensors.torch.save_model(model, str(tmp_path / "model.safetensors"))
    return code, [sys.executable, "snippet.py"], {}


def _a_jobs_mlflow_run(
    code: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[str, list[str], dict[str, str]]:
    """A job's environment: a run on the suite's MLflow server, a run folder."""
    from mlflow.tracking import MlflowClient

    server = request.getfixturevalue("mlflow_server")
    run = MlflowClient(server.url).create_run("0")
    env = {
        "MLFLOW_TRACKING_URI": server.url,
        "MLFLOW_RUN_ID": run.info.run_id,
        "STOKER_RUN_DIR": str(tmp_path),
    }
    return code, [sys.executable, "snippet.py"], env


PREPARED = {
    "StreamingLoader(": _loader_on_a_small_set,
    "job.init()": _own_loop_under_stoker_run,
    "safetensors.torch.load_file": _an_exported_model,
    "RunLogger(": _a_jobs_mlflow_run,
}


def test_the_docs_have_python_snippets() -> None:
    assert len(SNIPPETS) >= 10
    assert any("from stoker import kernels" in code for _, code in SNIPPETS)  # README's


OFF_THE_CLUSTER = [(where, code) for where, code in SNIPPETS if ON_THE_CLUSTER not in code]


@pytest.mark.parametrize(
    ("where", "code"), OFF_THE_CLUSTER, ids=[where for where, _ in OFF_THE_CLUSTER]
)
def test_each_python_snippet_runs_as_a_script(
    where: str, code: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A snippet of the docs saved as a script and run as its page says, in a fresh
    folder: one process each, on the smallest data the suite has. A page's fragment of a
    module (a factory, a `forward`) defines what it shows and runs as such."""
    run_snippet(where, code, tmp_path, request)


def run_snippet(where: str, code: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """`code` saved as snippet.py in `tmp_path` and run as its page says (PREPARED)."""
    for marker, reason in NEEDS_A_CLUSTER.items():
        if marker in code:
            pytest.skip(reason)
    command, env = [sys.executable, "snippet.py"], {}
    for marker, prepare in PREPARED.items():
        if marker in code:
            code, command, env = prepare(code, tmp_path, request)
    (tmp_path / "snippet.py").write_text(code)
    result = subprocess.run(
        command,
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"{where}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    if ON_THE_CLUSTER in code:  # the function's value came back from the job
        assert "{'loss': 0.15" in result.stdout, result.stdout
