"""The wheels the GPU machine lacks, carried with the checkout.

The GPU machine has torch, triton, numpy, typer, rich, pyyaml, jinja2, fsspec,
safetensors and pytest, and no network; stoker.config needs pydantic. `--prepare`
downloads pydantic and its dependencies here, for the device's Python 3.12 on
manylinux x86_64, into `.gpu-wheels/` (ignored by git; the device call names it in
`carry`), and sizes what the call sends against the tool's 64 MiB. On the device the
orchestrator installs them into a temporary folder that goes first on the parts'
PYTHONPATH, when pydantic is not importable there.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEEL_DIR_NAME = ".gpu-wheels"
WHEEL_DIR = REPO / WHEEL_DIR_NAME
CARRIED = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")
"""pydantic and what it requires (pip show pydantic); pinned to the versions installed
here, the ones the suite tests."""
DEVICE_PYTHON = "3.12"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
UPLOAD_LIMIT = 64 << 20
"""What one device call may send: tracked and untracked-not-ignored files plus carry."""


def _pins() -> list[str]:
    pins = []
    for name in CARRIED:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            raise SystemExit(
                f"gpu-check --prepare: {name} is not installed here; run it from the "
                "project's environment (.venv/bin/python scripts/gpu-check --prepare)"
            ) from None
    return pins


def checkout_bytes() -> int:
    """Tracked plus untracked-not-ignored files: what the device call sends besides carry."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    total = 0
    for name in filter(None, listed):
        path = REPO / name.decode()
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


def prepare() -> int:
    """Download the carried wheels; print their sizes and the upload's."""
    pins = _pins()
    WHEEL_DIR.mkdir(exist_ok=True)
    for old in WHEEL_DIR.glob("*.whl"):
        old.unlink()
    command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "-q"]
    command += ["--no-deps", "--only-binary=:all:", "--python-version", DEVICE_PYTHON]
    command += ["--implementation", "cp", "-d", str(WHEEL_DIR)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    done = subprocess.run(command + pins)
    if done.returncode != 0:
        print(f"gpu-check --prepare: pip could not download {' '.join(pins)}", file=sys.stderr)
        return 1
    wheels = sorted(WHEEL_DIR.glob("*.whl"))
    carried = sum(w.stat().st_size for w in wheels)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    tree = checkout_bytes()
    total = tree + carried
    print(
        f"upload: checkout {tree / 2**20:.1f} MiB + {WHEEL_DIR_NAME} {carried / 2**20:.1f} MiB "
        f"= {total / 2**20:.1f} MiB of {UPLOAD_LIMIT / 2**20:.0f} MiB"
    )
    if total > UPLOAD_LIMIT:
        print("gpu-check --prepare: the upload is over the device tool's limit", file=sys.stderr)
        return 1
    return 0


def install_carried() -> Path | None:
    """Install the carried wheels into a temporary folder when pydantic is missing;
    the folder, for the parts' PYTHONPATH, or None when nothing was needed."""
    if importlib.util.find_spec("pydantic") is not None:
        return None
    wheels = sorted(WHEEL_DIR.glob("*.whl"))
    if not wheels:
        print(
            f"gpu-check: pydantic is missing and {WHEEL_DIR_NAME}/ holds no wheels: run "
            f"scripts/gpu-check --prepare here and name {WHEEL_DIR_NAME} in the call's carry; "
            "the parts that read stoker's config will fail",
            file=sys.stderr,
        )
        return None
    site = Path(tempfile.mkdtemp(prefix="stoker-gpu-check-site-"))
    command = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    command += ["--no-index", "--no-deps", "--no-compile", "--target", str(site)]
    subprocess.run(command + [str(w) for w in wheels], check=True)
    return site
