"""Shared fixtures. Every test gets its own HOME and STOKER_HOME, so no test reads the
developer's site profile or writes into ~/.stoker."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stoker.process.gc_pause import pause_collector, resume_collector

# The garbage collector paused while the plugins below and the test modules import
# torch, mlflow and the rest, until collection ends (pytest_collection): collection went
# from 5.6 to 2.8 CPU-s on the 2-core VM, and the tests' collections never walk what
# those imports made (stoker/process/gc_pause.py).
pause_collector()

REPO = Path(__file__).resolve().parent.parent
CHECK_CACHE_ENV = "STOKER_MODEL_CHECK_CACHE"

# `slurm_cluster`: a real 3-node SLURM cluster (tests/cluster/); `mlflow_server`: a real
# MLflow tracking server over HTTP (tests/mlflow_server.py).
# `tests.cpu_cost`: each test's CPU seconds, printed at the end (the suite's budget);
# `tests.module_queue`: several processes share a run, a module each at a time.
pytest_plugins = [
    "tests.cluster.fixtures",
    "tests.mlflow_server",
    "tests.s3_server",
    "tests.cpu_cost",
    "tests.module_queue",
]


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Any:
    """Collection writes the bytecode of what it imports (the test modules as pytest
    rewrote their asserts, and the helpers under tests/) even where PYTHONDONTWRITEBYTECODE
    is set, as on these VMs: there, each of the suite's pytest processes rewrote every test
    module anew, 9 of its ~14 CPU-s of collection, and each process a test starts compiled
    the helpers it imports. Only during collection: a test's own imports (a plugin in its
    tmp_path) leave no __pycache__ behind.

    The garbage collector, paused since this file's import, is resumed with what the
    plugins and the test modules made frozen (stoker/process/gc_pause.py)."""
    saved = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = saved
        resume_collector()


def _uses_cluster(item: pytest.Item) -> bool:
    fixtures = getattr(item, "fixturenames", ())
    return item.get_closest_marker("slurm") is not None or "slurm_cluster" in fixtures


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks `cluster_module` every test of a module with a test on the SLURM cluster.
    `make test` runs them in one pytest process, one at a time (they share its three
    nodes, and some freeze one), and the other modules in a second process beside it:
    the cluster tests spend about a third of their time waiting on SLURM, and the
    CPU-bound tests fill it."""
    cluster_modules = {_module(item) for item in items if _uses_cluster(item)}
    for item in items:
        if _module(item) in cluster_modules:
            item.add_marker(pytest.mark.cluster_module)


@pytest.fixture(scope="module")
def module_home(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """HOME and STOKER_HOME (as environment variables) for a module's shared fixtures:
    module fixtures run before the per-test `isolated_home`, so they need their own."""
    home = tmp_path_factory.mktemp(f"{request.module.__name__.rsplit('.', 1)[-1]}-home")
    return {"HOME": str(home), "STOKER_HOME": str(home / ".stoker")}


SyntheticSet = Callable[..., Path]


@pytest.fixture(scope="session")
def synthetic_av_set(tmp_path_factory: pytest.TempPathFactory) -> SyntheticSet:
    """`synthetic_av_set(clips=16, size=(64, 64), ...)`: a synthetic AV data set
    (stoker.data.synthetic.shapes) with those arguments, written once per session and shared
    by every test that asks for the same arguments. Read it, never write into it."""
    made: dict[str, Path] = {}

    def make(**kwargs: Any) -> Path:
        from stoker.data.synthetic.shapes import synth_dataset

        args = {"seconds": 2.0, "fps": 8, **kwargs}
        key = repr(sorted(args.items()))
        if key not in made:
            root = tmp_path_factory.mktemp("synthetic-av") / "set"
            synth_dataset(str(root), **args)
            made[key] = root
        return made[key]

    return make


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run torch on one thread in the test process. Small shapes run as fast on one
    thread as on two on an idle 2-core machine, and 10x faster when other processes
    load it, as beside the cluster tests (measured: 0.06 s vs 0.6 s of CPU per tiny
    audio_ar step at load 11; OpenMP threads spin waiting for each other)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def process_wide_kernel_backend() -> Iterator[None]:
    """A Trainer run in the test process sets the process-wide kernel backend
    (model.kernels); the next test starts from STOKER_KERNELS / auto again."""
    yield
    backend = sys.modules.get("stoker.kernels.backend")
    if backend is not None:
        backend.set_backend(None)


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow sqlite store with its schema and nothing in it, made once per session
    by MLflow as `stoker submit` makes one."""
    from stoker.tracking.store import open_store, resolve_tracking_uri

    db = tmp_path_factory.mktemp("empty-store") / "mlflow.db"
    with open_store(resolve_tracking_uri(f"sqlite:///{db}"), None):
        pass
    return db


@pytest.fixture(scope="session", autouse=True)
def shared_model_checks(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One cache of passed model checks for the whole run (scripts/test-suite gives its
    pytest processes one folder), not one per test's STOKER_HOME: the check of a model
    and data settings a test before passed with the same files is not made again (~3
    CPU-s each; stoker/launcher/launch/model_check_cache.py). Refusals are never kept, so
    every test of one still runs the check; the cache's own tests set their own."""
    if CHECK_CACHE_ENV not in os.environ:
        os.environ[CHECK_CACHE_ENV] = str(tmp_path_factory.mktemp("model-checks"))


@pytest.fixture(autouse=True)
def isolated_home(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> Iterator[Path]:
    """HOME and STOKER_HOME of their own for each test, its default MLflow store made
    already (`empty_store`), as on a machine where stoker has run before: a store's first
    use is seconds of MLflow's migrations, which every test would pay again. The tests of
    a first use make their stores themselves, and a test marked `fresh_home` gets a home
    with nothing in it. A store the test never wrote is removed after it (0.9 MB each,
    most tests never open it)."""
    home = tmp_path_factory.mktemp("home")
    seeded: Path | None = None
    if request.node.get_closest_marker("fresh_home") is None:
        seeded = home / ".stoker" / "mlflow" / "mlflow.db"
        seeded.parent.mkdir(parents=True)
        shutil.copyfile(request.getfixturevalue("empty_store"), seeded)
        untouched = seeded.stat().st_mtime_ns
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("STOKER_HOME", str(home / ".stoker"))
    monkeypatch.delenv("STOKER_PROFILE", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield home
    if seeded is not None and seeded.exists() and seeded.stat().st_mtime_ns == untouched:
        seeded.unlink()
