"""`scripts/bootstrap`'s choice of torch build, with the environment's Python and pip
replaced by a script that records every call (the real install runs in `make run` and
`make test`, each CI run): without a GPU it asks PyTorch's CPU wheel index first, falls
back to the default index, and says which build it installed; with one it lets pip pick
the CUDA build. The project itself goes in with uv where uv can be had (bytecode
compiled, as pip does), else with pip."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The venv's python: records its arguments; `import torch` works once pip installed it;
# `pip install --index-url ...` fails when $CPU_INDEX_DOWN is set, any pip install
# fails when $ALL_DOWN is; the build line reads $BUILD.
FAKE_PYTHON = """#!/bin/bash
echo "$*" >>"$CALLS"
case "$1 $2" in
"-c import torch") [ -e "$VENV/torch-installed" ] ;;
"-m pip")
    if [[ " $* " == *" install "* ]]; then
        [ -n "${ALL_DOWN:-}" ] && exit 1
        [[ " $* " == *" --index-url "* ]] && [ -n "${CPU_INDEX_DOWN:-}" ] && exit 1
        [[ " $* " == *" torch"* ]] && touch "$VENV/torch-installed"
    fi
    exit 0 ;;
"scripts/torch-build ") echo "bootstrap: torch 2.13.0 ($BUILD build) in the environment" >&2 ;;
esac
"""
FAKE_STOKER = '#!/bin/bash\necho "stoker 0.1.0"\n'
# The uv that `pip install uv` put in the venv: records its arguments, fails with $UV_DOWN.
FAKE_UV = '#!/bin/bash\necho "uv $*" >>"$CALLS"\n[ -z "${UV_DOWN:-}" ]\n'


def _bootstrap(
    tmp_path: Path, *, gpu: bool = False, uv: bool = False, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    tools = [("python", FAKE_PYTHON), ("stoker", FAKE_STOKER)] + ([("uv", FAKE_UV)] if uv else [])
    for name, text in tools:
        (venv / "bin" / name).write_text(text)
        (venv / "bin" / name).chmod(0o755)
    tools = tmp_path / "tools"  # PATH: the system's tools, nvidia-smi only with a GPU
    tools.mkdir()
    if gpu:
        (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100'\n")
        (tools / "nvidia-smi").chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path), "STOKER_VENV": str(venv),
           "VENV": str(venv), "CALLS": str(calls), "BUILD": "CUDA 12.8" if gpu else "CPU",
           **env}  # fmt: skip
    result = subprocess.run(
        [str(REPO / "scripts" / "bootstrap")], env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = calls.read_text().splitlines() if calls.exists() else []
    return result, [c for c in (shlex.split(line) for line in lines) if c]


def _torch_installs(calls: list[list[str]]) -> list[list[str]]:
    return [
        c[c.index("install") + 1 :]
        for c in calls
        if c[:2] == ["-m", "pip"] and "-e" not in c and c[-1] != "uv"
    ]


def test_without_a_gpu_the_cpu_index_is_asked_first(tmp_path: Path) -> None:
    result, calls = _bootstrap(tmp_path)
    assert result.returncode == 0, result.stderr
    assert _torch_installs(calls) == [
        ["--index-url", CPU_INDEX, "--timeout", "15", "--retries", "1", "torch==2.13.0"]
    ]
    assert "asking PyTorch's CPU wheel index" in result.stderr
    assert "torch 2.13.0 (CPU build) in the environment" in result.stderr
    assert ["-m", "pip", "--disable-pip-version-check", "-q", "install", "-e", "."] in calls
    assert ["-m", "compileall", "-q", "stoker"] in calls  # its bytecode, once


def test_an_unreachable_cpu_index_falls_back_to_the_default_one(tmp_path: Path) -> None:
    result, calls = _bootstrap(tmp_path, CPU_INDEX_DOWN="1")
    assert result.returncode == 0, result.stderr
    assert _torch_installs(calls) == [
        ["--index-url", CPU_INDEX, "--timeout", "15", "--retries", "1", "torch==2.13.0"],
        ["torch==2.13.0"],
    ]
    assert f"CPU wheel index ({CPU_INDEX}) could not be reached" in result.stderr
    assert "(CPU build) in the environment" in result.stderr


def test_an_index_of_ones_own_and_a_pinned_build_are_used(tmp_path: Path) -> None:
    mirror = "https://pypi.example.org/torch-cpu"
    result, calls = _bootstrap(
        tmp_path, STOKER_TORCH_CPU_INDEX=mirror, STOKER_TORCH="torch==2.5.1+cpu"
    )
    assert result.returncode == 0, result.stderr
    assert _torch_installs(calls)[0][:2] == ["--index-url", mirror]
    assert _torch_installs(calls)[0][-1] == "torch==2.5.1+cpu"


def test_with_a_gpu_pip_picks_the_cuda_build(tmp_path: Path) -> None:
    result, calls = _bootstrap(tmp_path, gpu=True)
    assert result.returncode == 0, result.stderr
    assert _torch_installs(calls) == [["torch"]]
    assert "(CUDA 12.8 build) in the environment" in result.stderr


def test_a_present_torch_is_kept(tmp_path: Path) -> None:
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "torch-installed").touch()
    result, calls = _bootstrap(tmp_path)
    assert result.returncode == 0, result.stderr
    assert _torch_installs(calls) == []


def test_no_index_reachable_says_how_to_point_pip_at_a_cpu_build(tmp_path: Path) -> None:
    result, _ = _bootstrap(tmp_path, ALL_DOWN="1")
    assert result.returncode == 1
    assert "could not install torch==2.13.0 (CPU build)" in result.stderr
    assert "STOKER_TORCH" in result.stderr and "PIP_EXTRA_INDEX_URL" in result.stderr


def test_the_project_goes_in_with_uv_where_it_can_be_had(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    result, calls = _bootstrap(tmp_path, uv=True)
    assert result.returncode == 0, result.stderr
    uv_installs = [c for c in calls if c[0] == "uv"]
    assert uv_installs == [
        ["uv", "pip", "install", "-q", "--compile-bytecode", "--python", f"{venv}/bin/python",
         "-e", "."]
    ]  # fmt: skip
    assert not [c for c in calls if c[:2] == ["-m", "pip"] and "-e" in c]


def test_where_uv_fails_pip_installs_the_project(tmp_path: Path) -> None:
    result, calls = _bootstrap(tmp_path, uv=True, UV_DOWN="1")
    assert result.returncode == 0, result.stderr
    assert "bootstrap: uv could not install .: pip installs it" in result.stderr
    assert ["-m", "pip", "--disable-pip-version-check", "-q", "install", "-e", "."] in calls


def test_stoker_installer_pip_skips_uv(tmp_path: Path) -> None:
    result, calls = _bootstrap(tmp_path, uv=True, STOKER_INSTALLER="pip")
    assert result.returncode == 0, result.stderr
    assert not [c for c in calls if c[0] == "uv" or c[-1] == "uv"]
    assert ["-m", "pip", "--disable-pip-version-check", "-q", "install", "-e", "."] in calls


def test_the_build_is_read_without_importing_torch_so_no_numpy_warning(tmp_path: Path) -> None:
    """On a fresh machine numpy comes with the project, after torch: the build line is
    read from torch/version.py, not by `import torch`, which warns "Failed to initialize
    NumPy" without it. Here numpy cannot be imported, as on that machine."""
    import sys

    import torch

    (tmp_path / "numpy").mkdir()
    (tmp_path / "numpy" / "__init__.py").write_text("raise ImportError('no numpy here')\n")
    result = subprocess.run(
        [sys.executable, "-X", "importtime", str(REPO / "scripts" / "torch-build")],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    assert said == [f"bootstrap: torch {torch.__version__} ({build} build) in the environment"]
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines()[1:]}
    assert "torch" not in imported and "numpy" not in imported
