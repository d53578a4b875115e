"""The plain DCP save the runtime resumes from after a stop: what it restores,
and that a folder without DCP's .metadata is never loaded."""

from __future__ import annotations

from pathlib import Path

import torch

from stoker.config import OptimConfig
from stoker.runtime import resume_state
from stoker.runtime.optim import build_optimizer, build_scheduler


def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    opt = build_optimizer(model, OptimConfig(warmup_steps=3), torch.device("cpu"))
    sched = build_scheduler(opt, OptimConfig(warmup_steps=3), 50)
    for _ in range(seed % 5 + 2):
        model(torch.randn(4, 6)).pow(2).mean().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, opt, sched


def test_save_then_load_restores_everything(tmp_path: Path) -> None:
    model, opt, sched = _trained(1)
    loader = {"version": 1, "epoch": 2, "samples_consumed": 40}
    torch.manual_seed(1234)
    resume_state.save(tmp_path, resume_state.TrainState(7, loader, "run-1"), model, opt, sched,
                      rank=0)  # fmt: skip
    expected_noise = torch.randn(3)
    fresh, fresh_opt, fresh_sched = _trained(2)
    state = resume_state.load_latest(tmp_path, fresh, fresh_opt, fresh_sched, rank=0)
    assert state == resume_state.TrainState(7, loader, "run-1")
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    for group_a, group_b in zip(opt.state_dict()["state"].values(),
                                fresh_opt.state_dict()["state"].values(), strict=True):  # fmt: skip
        assert torch.equal(group_a["exp_avg_sq"], group_b["exp_avg_sq"])
    assert fresh_sched.last_epoch == sched.last_epoch  # type: ignore[attr-defined]
    assert torch.equal(torch.randn(3), expected_noise)  # the RNG continues where it was saved


def test_newest_complete_folder_wins(tmp_path: Path) -> None:
    model, opt, sched = _trained(1)
    for step in (10, 20):
        resume_state.save(tmp_path, resume_state.TrainState(step, None), model, opt, sched, rank=0)
    # A save cut short: shards written, no .metadata.
    (tmp_path / "step-30").mkdir()
    (tmp_path / "step-30" / "__0_0.distcp").write_bytes(b"partial")
    (tmp_path / "notes").mkdir()  # not ours: ignored, never deleted
    assert [s for s, _ in resume_state.step_dirs(tmp_path)] == [20, 10]
    state = resume_state.load_latest(tmp_path, *_trained(3), rank=0)
    assert state is not None and state.step == 20
    resume_state.prune(tmp_path, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "step-20", "step-30"]


def test_nothing_to_resume(tmp_path: Path) -> None:
    assert resume_state.load_latest(tmp_path / "none", *_trained(1), rank=0) is None
