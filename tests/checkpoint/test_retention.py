"""Retention: keep the last K verified and every M-th, never lose the newest
verified one, never touch what stoker did not write. The rules on rows, then
`stoker ckpt prune` on real committed folders (local and s3://)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fsspec.core import url_to_fs

from stoker.checkpoint import commit as ck
from stoker.checkpoint.checkpointer import Checkpointer
from stoker.checkpoint.retention import plan
from stoker.checkpoint.train_state import TrainState
from tests.clirun import stoker
from tests.s3_server import S3Server


def _rows(*specs: tuple[int, bool]) -> list[ck.Row]:
    rows = [ck.Row(step=s, path=f"/r/step-{s}", committed=c, bytes=10) for s, c in specs]
    return sorted(rows, key=lambda r: r.step, reverse=True)


def _deleted(rows: list[ck.Row], broken: set[int] = frozenset(), foreign: set[int] = frozenset(),
             **policy: int | None) -> list[int]:  # fmt: skip
    decisions = plan(
        rows,
        keep_last=int(policy.get("keep_last") or 1),
        keep_every=policy.get("keep_every"),
        verified=lambda r: r.step not in broken,
        stokers=lambda r: r.step not in foreign,
    )
    return sorted(d.row.step for d in decisions if d.delete)


def test_keep_last_and_every() -> None:
    rows = _rows(*((s, True) for s in range(100, 1100, 100)))
    assert _deleted(rows, keep_last=2) == list(range(100, 900, 100))
    assert _deleted(rows, keep_last=2, keep_every=500) == [100, 200, 300, 400, 600, 700, 800]


def test_broken_newest_keeps_the_older_good_ones() -> None:
    rows = _rows((10, True), (20, True), (30, True))
    # 30 is broken: 20 is what a restart loads; keep_last counts good ones only.
    assert _deleted(rows, broken={30}, keep_last=1) == [10]
    assert _deleted(rows, broken={30}, keep_last=2) == []
    # Nothing verifies: nothing is deleted.
    assert _deleted(rows, broken={10, 20, 30}, keep_last=1) == []


def test_uncommitted_and_foreign_folders() -> None:
    rows = _rows((10, True), (15, False), (20, True), (25, False), (5, False))
    # 25 may be a save in flight; 15 is a save that never committed; 5 is not stoker's.
    assert _deleted(rows, foreign={5}, keep_last=1) == [10, 15]
    assert _deleted(rows, foreign={5, 15}, keep_last=5) == []


def _save(root: str, steps: list[int]) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    # keep_last high: the test prunes by hand.
    saver = Checkpointer(root, async_save=False, keep_last=100)
    for step in steps:
        saver.save(step, TrainState(step, None), model, opt, sched)
    saver.close()


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "ckpt")
    server: S3Server = request.getfixturevalue("s3_env")
    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": server.endpoint}).mkdir(tmp_path.name)
    return f"s3://{tmp_path.name}/ckpt"


def test_prune_command(root: str) -> None:
    _save(root, [100, 200, 300, 400])
    fs, base = url_to_fs(root)
    fs.makedirs(f"{base}/step-50", exist_ok=True)  # someone else's folder
    fs.pipe_file(f"{base}/step-50/weights.bin", b"mine")
    fs.pipe_file(f"{base}/step-400/__0_0.distcp", b"cut")  # the newest is broken

    # docs/checkpoints.md's synopsis: what would go, the same rules as the real prune below.
    keep = ("--keep-last", "1", "--keep-every", "200")
    dry = stoker("ckpt", "prune", root, *keep, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    decided = {d["step"]: (d["delete"], d["reason"]) for d in json.loads(dry.stdout)}
    assert decided == {
        400: (False, "newer than the newest verified (broken commit)"),
        300: (False, "newest verified"),
        200: (False, "multiple of keep_every=200"),
        100: (True, "beyond keep_last=1"),
        50: (False, "not written by stoker"),
    }
    assert [r.step for r in ck.list_checkpoints(root)] == [400, 300, 200, 100, 50]

    done = stoker("ckpt", "prune", root, *keep)
    assert done.returncode == 0, done.stderr
    assert "deleted 1 of 5 checkpoints" in done.stdout
    assert [r.step for r in ck.list_checkpoints(root)] == [400, 300, 200, 50]
    assert fs.cat_file(f"{base}/step-50/weights.bin") == b"mine"

    missing = stoker("ckpt", "prune", root + "-nothing", "--keep-last", "1")
    assert missing.returncode != 0 and "no checkpoint root" in missing.stderr
