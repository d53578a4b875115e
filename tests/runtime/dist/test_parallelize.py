"""How the runtime shards a model: a FSDP2 unit per block on a GPU, the whole model as
one unit on CPU ranks (gloo runs its collectives in series with the rank's compute,
so per-block all-gathers only add to a CPU step), and the planner's trace wraps a
candidate the way its target's ranks will. On a fake process group of 2 ranks, in
this process: the wrapping is what is checked, not the collectives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule

from stoker.config import resolve_config
from stoker.planning import trace
from stoker.runtime.dist.parallelize import apply_fsdp, parallelize
from stoker.runtime.models import build_model
from stoker.runtime.models.contract import block_slots


@pytest.fixture
def two_fake_ranks() -> Iterator[None]:
    trace._fake_process_group(2)
    try:
        yield
    finally:
        trace.close()


def _sharded_blocks(model: torch.nn.Module) -> list[bool]:
    return [isinstance(getattr(parent, name), FSDPModule) for parent, name in block_slots(model)]


def test_cpu_ranks_shard_the_model_as_one_unit_and_gpus_each_block(two_fake_ranks: None) -> None:
    cfg = resolve_config(None, ["train.precision=fp32"], use_profile=False).config
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("shard",))

    on_cpu = parallelize(build_model(cfg.model, cfg.data), cfg.train, mesh,
                         torch.device("cpu"), "fp32")  # fmt: skip
    assert isinstance(on_cpu, FSDPModule)
    assert _sharded_blocks(on_cpu) == [False] * 4  # the tiny preset's 4 blocks

    per_block = build_model(cfg.model, cfg.data)
    apply_fsdp(per_block, mesh, bf16_params=False)  # what a GPU rank gets
    assert isinstance(per_block, FSDPModule) and _sharded_blocks(per_block) == [True] * 4
    # Each parameter is sharded alike whatever its unit: the checkpoint is the same.
    assert {k: v.shape for k, v in on_cpu.state_dict().items()} == {
        k: v.shape for k, v in per_block.state_dict().items()
    }


def test_the_plan_traces_a_cpu_target_as_one_unit(
    two_fake_ranks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trace_step wraps as the target's ranks do: per_block only for a GPU target."""
    seen: list[bool] = []
    real = apply_fsdp

    def recording(model: torch.nn.Module, mesh: object, **kwargs: bool) -> None:
        seen.append(kwargs["per_block"])
        real(model, mesh, **kwargs)  # type: ignore[arg-type]

    import stoker.runtime.dist.parallelize as parallelize_module

    monkeypatch.setattr(parallelize_module, "apply_fsdp", recording)
    cfg = resolve_config(None, ["train.precision=fp32", "model.size=tiny"],
                         use_profile=False).config  # fmt: skip
    for gpu in (False, True):
        spec = trace.TraceSpec(world=2, shard=2, activation_checkpointing="none",
                               precision="fp32", micro_batch=1, micro_batches=1,
                               bucket=None, gpu=gpu)  # fmt: skip
        trace.trace_step(cfg, spec)
    assert seen == [False, True]
