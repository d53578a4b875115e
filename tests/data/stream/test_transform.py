"""`data.transform: package.module:function` on real encoded media: run on every
sample in the loader's worker processes (imported there by name), its effect in the
batch; a transform that does not import stops the loader's construction, one that
raises on a sample skips that sample as a corrupt one is, one that returns no dict
stops the run."""

from __future__ import annotations

import logging
import multiprocessing
import os
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from stoker.config import resolve_config
from stoker.data.stream.loader import StreamingLoader, loader_from_config
from stoker.errors import StokerError
from tests.data.sample_transforms import FAILS_ON

CLIPS = 8
BATCH = 4
AV: dict[str, Any] = {"fps": 8, "size": (32, 32), "clip_seconds": 1.0, "sample_rate": 8000}
HERE = "tests.data.sample_transforms"


@pytest.fixture(scope="module")
def dataset(synthetic_av_set: Callable[..., Path]) -> str:
    return str(synthetic_av_set(clips=CLIPS, size=(32, 32), sample_rate=8000, samples_per_shard=4))


def config(tmp_path: Path, dataset: str, transform: str, workers: int = 0) -> Any:
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        f"data:\n  url: {dataset}\n  batch_size: {BATCH}\n  num_workers: {workers}\n"
        "  fps: 8\n  resolution: [32, 32]\n  sample_rate: 8000\n  clip_offset: start\n"
        f"  transform: {transform}\n"
    )
    return resolve_config(exp, [], {}).config


def loader(url: str, **kw: Any) -> StreamingLoader:
    args = {"batch_size": BATCH, "num_workers": 0, "seed": 1, "clip_offset": "start", **AV}
    return StreamingLoader(url, **{**args, **kw})


def test_the_transform_runs_on_every_sample_in_the_worker_processes(
    dataset: str, tmp_path: Path
) -> None:
    cfg = config(tmp_path, dataset, f"{HERE}:halve_audio_and_tag", workers=2)
    ld = loader_from_config(cfg, rank=0, world_size=1)
    transformed = list(ld.batches(max_batches=2 * CLIPS // BATCH))
    plain = list(loader(dataset, seed=0).batches(max_batches=2 * CLIPS // BATCH))
    pids = set()
    for got, want in zip(transformed, plain, strict=True):
        assert got["key"] == want["key"]  # same order, same clips
        assert torch.equal(got["audio"], want["audio"] * 0.5)
        assert torch.equal(got["video"], want["video"])  # untouched
        assert got["clip"] == [int(k.split("-")[1]) for k in got["key"]]  # an added key: a list
        assert got["ran_in_pid"].shape == (BATCH,)  # an added tensor: stacked
        pids |= set(got["ran_in_pid"].tolist())
    assert len(pids) == 2 and os.getpid() not in pids  # both workers, never this process
    assert ld.stats().samples == 2 * CLIPS and ld.stats().skipped_samples == 0


def test_a_spawned_worker_imports_the_transform_by_name(dataset: str) -> None:
    ld = loader(dataset, num_workers=1, start_method="spawn", transform=f"{HERE}:fail_on_one")
    batches = list(ld.batches(max_batches=CLIPS // BATCH))
    assert ld.stats().skipped_samples == 1 and ld.stats().samples == CLIPS - 1
    assert [s for b in batches for s in b["skipped"]] == [f"shards/shard-000000.tar:{FAILS_ON}"]


def test_a_sample_the_transform_raises_on_is_skipped_and_never_trained_on(
    dataset: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="stoker.data"):
        ld = loader_from_config(config(tmp_path, dataset, f"{HERE}:fail_on_one"), rank=0,
                                world_size=1)  # fmt: skip
        batches = list(ld.batches(max_batches=CLIPS // BATCH))
    assert FAILS_ON not in [k for b in batches for k in b["key"]]  # its row is another's copy
    assert sum(int((~b["valid"]).sum()) for b in batches) == 1
    assert [s for b in batches for s in b["skipped"]] == [f"shards/shard-000000.tar:{FAILS_ON}"]
    assert ld.stats().skipped_samples == 1 and ld.stats().samples == CLIPS - 1
    (warning,) = [r.getMessage() for r in caplog.records if "skipping sample" in r.getMessage()]
    assert f"{FAILS_ON!r} of {dataset}/shards/shard-000000.tar" in warning
    assert f"transform {HERE}:fail_on_one raised ValueError: cannot crop {FAILS_ON}" in warning
    assert "sample_transforms.py:" in warning  # the line that raised

    # The same in worker processes: counted there, carried back with the batches.
    ld = loader(dataset, num_workers=2, transform=f"{HERE}:fail_on_one")
    batches = list(ld.batches(max_batches=2 * CLIPS // BATCH))
    assert ld.stats().skipped_samples == 2  # once per epoch
    assert [s for b in batches for s in b["skipped"]] == [f"shards/shard-000000.tar:{FAILS_ON}"] * 2


def test_with_decode_threads_the_transform_runs_in_the_loops_own_thread(dataset: str) -> None:
    """Clips decode in threads (data.decode_threads), but a user's transform runs one
    sample at a time, in order, in the thread that iterates the loader: it need not be
    thread-safe. A sample it raises on is still skipped."""
    import threading

    ran: list[tuple[int, str]] = []

    def record(sample: dict[str, Any]) -> dict[str, Any]:
        ran.append((threading.get_ident(), sample["key"]))
        if sample["key"] == FAILS_ON:
            raise ValueError(f"cannot crop {sample['key']}")
        return sample

    ld = loader(dataset, decode_threads=3, transform=record)
    batches = list(ld.batches(max_batches=CLIPS // BATCH))
    assert {ident for ident, _ in ran} == {threading.get_ident()}
    plain = [k for b in loader(dataset).batches(max_batches=CLIPS // BATCH) for k in b["key"]]
    assert [key for _, key in ran] == plain  # every sample once, in the stream's order
    assert [s for b in batches for s in b["skipped"]] == [f"shards/shard-000000.tar:{FAILS_ON}"]
    assert ld.stats().skipped_samples == 1 and ld.stats().samples == CLIPS - 1


def test_a_worker_decodes_in_the_threads_data_decode_threads_asks_for(
    dataset: str, tmp_path: Path
) -> None:
    cfg = config(tmp_path, dataset, f"{HERE}:count_decode_threads", workers=1)
    cfg.data.decode_threads = 2
    ld = loader_from_config(cfg, rank=0, world_size=1)
    assert ld.decode_threads == 2
    batches = list(ld.batches(max_batches=CLIPS // BATCH))
    assert [n for b in batches for n in b["decode_threads"]] == [2] * CLIPS
    cfg.data.decode_threads = 1
    one = list(loader_from_config(cfg, rank=0, world_size=1).batches(max_batches=1))
    assert one[0]["decode_threads"] == [0] * BATCH  # the worker's loop decodes


def test_a_transform_that_fails_on_every_sample_stops_at_the_first_batch(dataset: str) -> None:
    with pytest.raises(RuntimeError, match=r"every sample of batch 0") as info:
        next(iter(loader(dataset, transform=f"{HERE}:always_fail")))
    assert f"the last: transform {HERE}:always_fail raised RuntimeError: this transform" in str(
        info.value
    )


def test_a_transform_that_returns_no_dict_stops_the_loader(dataset: str) -> None:
    before = set(multiprocessing.active_children())
    with pytest.raises(StokerError) as info:
        next(iter(loader(dataset, num_workers=2, transform=f"{HERE}:return_nothing")))
    # Its workers are gone although the traceback still holds the DataLoader's iterator:
    # they ignore SIGTERM, so left behind they would hang this process's exit.
    assert set(multiprocessing.active_children()) <= before
    message = str(info.value)
    assert f"transform {HERE}:return_nothing returned NoneType, not a sample dict" in message
    assert "(sample " in message and "shards/shard-0000" in message
    assert "fix: return the sample" in message


def test_a_transform_must_give_every_sample_the_same_keys(dataset: str) -> None:
    with pytest.raises(StokerError, match=r"have different keys.*odd") as info:
        next(iter(loader(dataset, transform=f"{HERE}:tag_odd_clips_only")))
    assert f"(transform {HERE}:tag_odd_clips_only)" in info.value.message
    assert info.value.fix == "return the same keys for every sample from the transform"


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A user's package in the folder the job runs in: one good module, one whose import
    raises. Its name is unique to the test, so no earlier import is cached."""
    name = f"user_aug_{tmp_path.name.replace('-', '_')}"
    package = tmp_path / "proj" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "good.py").write_text("def scale(sample):\n    return sample\n")
    (package / "broken.py").write_text(
        textwrap.dedent("""\
            import os

            import a_dependency_that_is_not_installed

            def scale(sample):
                return sample
            """)
    )
    monkeypatch.syspath_prepend(str(tmp_path / "proj"))
    monkeypatch.chdir(tmp_path / "proj")
    yield name


@pytest.mark.parametrize(
    ("value", "message", "fix"),
    [
        ("nosuch_package_xyz.aug:scale", "no module 'nosuch_package_xyz' in {cwd} (the folder "
         "the job runs in) nor installed in", "run stoker from the folder that holds "
         "nosuch_package_xyz/, or pip install your package"),
        ("{pkg}.missing:scale", "no module '{pkg}.missing'", "run stoker from the folder"),
        ("{pkg}.broken:scale", "importing {pkg}.broken raised ModuleNotFoundError: No module "
         "named 'a_dependency_that_is_not_installed' [{cwd}/{pkg}/broken.py:3]",
         "fix the error in {pkg}.broken (python -c 'import {pkg}.broken' shows it)"),
        ("{pkg}.good:scael", "module {pkg}.good ({cwd}/{pkg}/good.py) has no 'scael'",
         "name one of its functions: scale"),
        (f"{HERE}:NOT_A_FUNCTION", "is a int, not a function", "takes a sample dict"),
    ],
)  # fmt: skip
def test_a_transform_that_does_not_import_stops_the_loader_before_it_starts(
    dataset: str, tmp_path: Path, plugin: str, value: str, message: str, fix: str
) -> None:
    cwd = str(tmp_path / "proj")
    value = value.format(pkg=plugin)
    cfg = config(tmp_path, dataset, value, workers=2)
    with pytest.raises(StokerError) as info:
        loader_from_config(cfg, rank=0, world_size=1)
    assert info.value.message.startswith(f"data.transform {value!r}: ") or (
        info.value.message.startswith(f"data.transform {value!r} ")
    )
    assert message.format(pkg=plugin, cwd=cwd) in info.value.message
    assert fix.format(pkg=plugin) in (info.value.fix or "")


def test_a_transform_from_the_folder_the_job_runs_in_imports(dataset: str, plugin: str) -> None:
    batch = next(iter(loader(dataset, transform=f"{plugin}.good:scale")))
    assert batch["valid"].all()
