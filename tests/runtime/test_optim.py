"""The learning-rate schedule and which parameters decay."""

from __future__ import annotations

import itertools

import pytest
import torch

from stoker.config import OptimConfig
from stoker.runtime.optim import MIN_LR_FRACTION, build_optimizer, build_scheduler, lr_factor


def test_warmup_then_cosine_to_a_tenth() -> None:
    f = [lr_factor(s, warmup=10, total=110, schedule="cosine") for s in range(111)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a < b for a, b in itertools.pairwise(f[:10]))  # rising
    assert f[10] == pytest.approx(1.0) and f[60] == pytest.approx(0.55)
    assert all(a >= b for a, b in itertools.pairwise(f[10:]))  # falling
    assert f[110] == pytest.approx(MIN_LR_FRACTION)
    assert lr_factor(50, warmup=10, total=110, schedule="constant") == 1.0


def test_scheduler_follows_the_factor() -> None:
    model = torch.nn.Linear(4, 4)
    cfg = OptimConfig(lr=1e-3, warmup_steps=4)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    sched = build_scheduler(opt, cfg, total_steps=20)
    lrs = []
    for _ in range(20):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[-1] == pytest.approx(1e-3 * lr_factor(19, warmup=4, total=20, schedule="cosine"))


def test_matrices_decay_vectors_do_not() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, OptimConfig(weight_decay=0.1), torch.device("cpu"))
    decay, no_decay = opt.param_groups
    assert [p.shape for p in decay["params"]] == [torch.Size([4, 4])]
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(no_decay["params"]) == 3  # bias, norm weight, norm bias
