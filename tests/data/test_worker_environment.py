"""Worker processes see the environment of the call that starts them, as 'spawn' would
give it, not the one the fork server began with: a variable exported after the server
started (credentials, an endpoint) reaches the loader's workers and the local shard
writers of `data pack` / `data encode`, and one removed since is gone there."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from stoker.data.stream.loader import StreamingLoader
from stoker.data.write.shard_pool import run_shard_writers
from tests.data.sample_transforms import MARK

BATCH = 2


def marks(url: str) -> list[str]:
    loader = StreamingLoader(
        url,
        batch_size=BATCH,
        num_workers=1,
        start_method="forkserver",
        seed=1,
        fps=8,
        size=(32, 32),
        clip_seconds=1.0,
        sample_rate=8000,
        clip_offset="start",
        transform="tests.data.sample_transforms:tag_environment",
    )
    (batch,) = loader.batches(max_batches=1)
    return list(batch["environment_mark"])


def test_the_loaders_workers_see_the_environment_the_loader_started_in(
    synthetic_av_set: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = str(synthetic_av_set(clips=4, size=(32, 32), sample_rate=8000, samples_per_shard=4))
    monkeypatch.setenv(MARK, "before")
    assert marks(url) == ["before"] * BATCH  # the fork server runs from here on
    monkeypatch.setenv(MARK, "after")
    assert marks(url) == ["after"] * BATCH
    monkeypatch.delenv(MARK)
    assert marks(url) == [""] * BATCH


def read_mark(task: SimpleNamespace) -> str:
    return os.environ.get(MARK, "")


def test_local_shard_writers_see_the_environment_of_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tasks = [SimpleNamespace(number=n) for n in range(2)]
    for value in ("first", "second"):
        monkeypatch.setenv(MARK, value)
        results, failures = run_shard_writers(read_mark, tasks, workers=2, advance=lambda: None)
        assert failures == {} and results == {0: value, 1: value}
