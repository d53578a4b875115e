"""The Checkpointer in one process: the sha256 of each shard is taken while it
is written and equals the file's; a folder stoker did not write is never
overwritten; a state just resumed from is not saved again; RNG states come back."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from stoker.checkpoint import commit as ck
from stoker.checkpoint.checkpointer import Checkpointer
from stoker.checkpoint.train_state import TrainState
from stoker.errors import StokerError


def _state(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (i + 1))
    model(torch.randn(3, 64)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


@pytest.mark.parametrize("async_save", [True, False])
def test_commit_hashes_are_the_files(tmp_path: Path, async_save: bool) -> None:
    model, opt, sched = _state(0)
    saver = Checkpointer(str(tmp_path), async_save=async_save)
    saver.save(7, TrainState(7, {"at": 7}, "run-1"), model, opt, sched)
    saver.close()
    commit = ck.read_commit(str(tmp_path / "step-7"))
    assert commit is not None and commit.step == 7 and commit.world_size == 1
    for entry in commit.files:
        data = (tmp_path / "step-7" / entry.path).read_bytes()
        assert (entry.size, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert {f.path for f in commit.files} >= {"__0_0.distcp", ".metadata", ".stoker-save"}
    (record,) = saver.records
    assert record.step == 7 and record.bytes == commit.bytes and record.blocking_s > 0


def test_load_restores_state_and_rng_and_skips_a_resave(tmp_path: Path) -> None:
    model, opt, sched = _state(0)
    saver = Checkpointer(str(tmp_path), async_save=True)
    torch.manual_seed(1234)
    saver.save(3, TrainState(3, {"at": 3}, "run-1"), model, opt, sched)
    expected_draw = torch.rand(4)  # the RNG as it was when saved, drawn after
    saver.close()

    fresh, fresh_opt, fresh_sched = _state(99)
    loader = Checkpointer(str(tmp_path))
    state = loader.load_latest(fresh, fresh_opt, fresh_sched)
    assert state == TrainState(3, {"at": 3}, "run-1")
    assert torch.equal(torch.rand(4), expected_draw)
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert fresh_sched.get_last_lr() == sched.get_last_lr()
    before = (tmp_path / "step-3" / "COMMIT.json").read_text()
    # Saving the step just loaded (a stop right after a resume) writes nothing.
    assert loader.save(3, state, fresh, fresh_opt, fresh_sched) == 0.0
    assert (tmp_path / "step-3" / "COMMIT.json").read_text() == before
    loader.close()


def test_a_folder_stoker_did_not_write_is_never_overwritten(tmp_path: Path) -> None:
    model, opt, sched = _state(0)
    theirs = tmp_path / "step-5"
    theirs.mkdir()
    (theirs / "weights.bin").write_bytes(b"not ours")
    saver = Checkpointer(str(tmp_path), async_save=False)
    with pytest.raises(
        StokerError, match=r"cannot save step 5: .*step-5 exists and stoker did not"
    ):
        saver.save(5, TrainState(5, None), model, opt, sched)
    assert (theirs / "weights.bin").read_bytes() == b"not ours"
    # A save of ours that never committed is cleared and written again.
    (tmp_path / "step-6").mkdir()
    (tmp_path / "step-6" / ".stoker-save").write_text(json.dumps({"step": 6}))
    (tmp_path / "step-6" / "__3_0.distcp").write_bytes(b"from a bigger, dead job")
    saver.save(6, TrainState(6, None), model, opt, sched)
    saver.close()
    assert not (tmp_path / "step-6" / "__3_0.distcp").exists()
    assert ck.verify(str(tmp_path / "step-6"), full=True) == []
