"""One training step of a plan's candidate, traced on fake tensors in one process, as
one rank of the target world would run it: the experiment's model (built-in or
plugin) built under FakeTensorMode, wrapped as the runtime wraps it (activation
checkpointing, then FSDP2 or HSDP on a fake process group of the target's size), its
optimizer states made, then one step as the trainer takes it (forward and backward of
each micro-batch, FSDP2's reduce-scatter on the last only, gradient clipping, AdamW,
zero_grad), with PyTorch's FSDP memory tracker counting every tensor this rank holds.
Nothing is allocated and no GPU is needed; the fake collectives move no data.

On a GPU target the stoker kernels are traced as they run there, through their custom
ops' fake implementations (TRITON_INTERPRET is set so that the backend resolves to them
on fake CPU tensors; no kernel is launched). Autocast follows the CPU's op lists: they
cast the same matmuls to bf16 as CUDA's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from stoker.metric_names import PEAK_GPU_MEMORY_GB
from stoker.modes import ActivationCheckpointing, ResolvedPrecision

# Each trace: a fresh fake process group of its world size (one per process at a time).
_PG_WORLD: list[int] = []
# (model, data, world, shard) whose optimizer step this process has taken (see trace_step).
_PRIMED: set[tuple[str, str, int, int]] = set()


@dataclass(frozen=True)
class TraceSpec:
    """What a trace needs to know of one candidate."""

    world: int
    shard: int
    """Ranks one copy of the parameters is sharded over (world: FSDP; a node's: HSDP)."""
    activation_checkpointing: ActivationCheckpointing
    precision: ResolvedPrecision
    """bf16 (autocast, bf16 all-gathers on a GPU target) or fp32."""
    micro_batch: int
    micro_batches: int
    """How many micro-batches to trace (2 stands for any accumulation: the pattern repeats)."""
    bucket: int | None
    """Index in data.buckets, or None for the data's one shape."""
    gpu: bool
    """A GPU target: stoker's Triton kernels (when model.kernels allows) and bf16 params."""
    cp: int = 1
    """train.context_parallel: the trace computes one CP rank's share of the tokens."""
    ulysses: int = 1


@dataclass(frozen=True)
class Traced:
    """The peak of one traced step, bytes, by what held it."""

    peak: int
    parts: Mapping[str, int]
    """params, gradients, optimizer, activations, buffers (all-gather and
    reduce-scatter buffers and the model's buffers), ema: at the peak."""


# FSDPMemTracker's reference types, summed into the parts a person plans with.
_PARTS = {
    "Sharded Param": "params",
    "Unsharded Param": "params",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "OptState": "optimizer",
    "Activation": "activations",
    "Temp": "activations",
    "Inputs": "activations",
    "All Gather": "buffers",
    "Reduce Scatter": "buffers",
    "Buffer": "buffers",
    # MemTracker's, for one rank without FSDP:
    "Parameter": "params",
    "Gradient": "gradients",
    "Optstate": "optimizer",
    "Other": "buffers",
}


@contextlib.contextmanager
def values_needed_said(cfg: Any) -> Iterator[None]:
    """A model whose code reads a tensor's values (`.item()`, `if loss > 0:`, a
    `nonzero` whose size depends on them) cannot run on fake tensors, which have shapes
    and no values: a ModelSetupError naming the model, the line of its code and the op,
    and the way out, rather than FakeTensor's traceback."""
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        UnsupportedOperatorException,
    )

    from stoker.runtime.models.build import ModelSetupError

    try:
        yield
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        op = getattr(exc, "func", None) or type(exc).__name__
        what = (
            "reads a tensor's value (.item(), float(t), a Python `if` on a tensor)"
            if isinstance(exc, DataDependentOutputException)
            else "makes a tensor whose size depends on values"
        )
        raise ModelSetupError(
            "model.arch",
            f"{cfg.model.arch}: the planner runs the model on fake tensors (shapes, no "
            f"values), and its code {what} at {_users_line(exc)} ({op})",
            fix="keep values in tensors there (torch.where, torch.clamp, a masked mean; "
            "return metrics as tensors: the trainer reads them after the step); or size "
            "the job without a plan: a few steps of it log each rank's peak memory "
            f"({PEAK_GPU_MEMORY_GB} in its MLflow run)",
        ) from exc
    except UnsupportedOperatorException as exc:
        raise ModelSetupError(
            "model.arch",
            f"{cfg.model.arch}: the planner runs the model on fake tensors, and {exc.func} "
            f"at {_users_line(exc)} has no fake implementation",
            fix="register one (torch.library.register_fake) for your op; or size the "
            f"job without a plan: a few steps of it log {PEAK_GPU_MEMORY_GB}",
        ) from exc


def _users_line(exc: BaseException) -> str:
    """file:line of the innermost frame outside torch: the model's code that asked."""
    import traceback

    torch_dir = os.path.dirname(torch.__file__)
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(torch_dir)
    ]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "an unknown line"


def _fake_process_group(world: int) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if [world] == _PG_WORLD:
        return
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    _PG_WORLD[:] = [world]


def close() -> None:
    """Destroy the fake process group (the next trace makes one again)."""
    if _PG_WORLD and dist.is_initialized():
        dist.destroy_process_group()
    _PG_WORLD.clear()


@contextlib.contextmanager
def _kernels_for(cfg: Any, gpu: bool) -> Iterator[None]:
    """The kernel backend the ranks would run: Triton's ops (their fake implementations)
    for a GPU target unless model.kernels is reference; the references on a CPU one."""
    from stoker.kernels import use_backend
    from stoker.kernels.backend import Backend

    backend: Backend = "triton" if gpu and cfg.model.kernels != "reference" else "reference"
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # lets "triton" resolve on fake CPU tensors
    try:
        with use_backend(backend):
            yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def random_batch(
    cfg: Any, rows: int, device: torch.device | str = "cpu", bucket: int | None = None
) -> dict[str, Any]:
    """A batch of the loader's shapes (runtime/preflight.py's meta batch, bucket
    `bucket`) with values: random uint8 video, audio in [-1, 1], every row valid. Fake
    tensors under a FakeTensorMode (a plan's trace), real ones on `device` otherwise (a
    candidate measured for real: tests/plan, benchmarks/plan_measured.py)."""
    from stoker.runtime.models import data_shapes
    from stoker.runtime.preflight import batch_with_values

    shapes = data_shapes(cfg.data)
    clip = shapes.buckets[bucket] if bucket is not None else None
    return batch_with_values(shapes, rows, clip, device)


def trace_step(cfg: Any, spec: TraceSpec) -> Traced:
    """The peak memory of one rank in one training step of `cfg` as `spec` runs it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    from stoker.runtime.dist.parallelize import apply_activation_checkpointing, apply_fsdp
    from stoker.runtime.models import build_model
    from stoker.runtime.models.context_parallel import SharesOnly, context_parallel_as
    from stoker.runtime.observe.step_memory import local_bytes, tracked
    from stoker.runtime.optim import build_optimizer

    _fake_process_group(spec.world)
    cpu = torch.device("cpu")
    if spec.shard == spec.world:
        mesh = init_device_mesh("cpu", (spec.world,), mesh_dim_names=("shard",))
    else:
        mesh = init_device_mesh(
            "cpu", (spec.world // spec.shard, spec.shard), mesh_dim_names=("replicate", "shard")
        )
    bf16 = spec.precision == "bf16"
    # One CP rank's share of every sequence, as stoker.model's attention, token_slice and
    # cp_sum give it a rank (its attention over its share: the shapes, not the values).
    shares = SharesOnly(spec.cp, spec.ulysses) if spec.cp > 1 else None
    with (
        values_needed_said(cfg),
        _kernels_for(cfg, spec.gpu),
        FakeTensorMode(),
        context_parallel_as(shares),
    ):
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, cfg.data)
        apply_activation_checkpointing(model, spec.activation_checkpointing)
        if spec.world > 1:  # one rank: the runtime wraps nothing (no mesh)
            apply_fsdp(model, mesh, bf16_params=bf16 and spec.gpu, per_block=spec.gpu)
        optimizer = build_optimizer(model, cfg.optim, cpu)
        params = [p for p in model.parameters() if p.requires_grad]
        # The first foreach AdamW step on parameters of these shapes is a miss of
        # FakeTensorMode's cache, and the tracker then counts 4-5x the states: take
        # that step untracked once per shapes in this process; later, make the states.
        shapes = (repr(cfg.model), repr(cfg.data), spec.world, spec.shard)
        prime_optimizer(optimizer, step=shapes not in _PRIMED)
        _PRIMED.add(shapes)
        ema_bytes = local_bytes(params) if cfg.train.ema_decay is not None else 0
        micro = [
            random_batch(cfg, spec.micro_batch, bucket=spec.bucket)
            for _ in range(spec.micro_batches)
        ]
        with tracked(model, optimizer, micro) as peak:
            train_step(model, optimizer, micro, params, cfg.optim.grad_clip, bf16)
        snapshot = peak()
    parts: dict[str, int] = {}
    for kind, size in snapshot.items():
        name = _PARTS.get(getattr(kind, "value", str(kind)))
        if name is not None:
            parts[name] = parts.get(name, 0) + int(size)
    parts["ema"] = ema_bytes
    return Traced(peak=int(snapshot["Total"]) + ema_bytes, parts=parts)


def prime_optimizer(optimizer: torch.optim.Optimizer, *, step: bool) -> None:
    """The states an optimizer holds from its first step on: by a step on zero
    gradients, or without `step` for AdamW, made as its first step makes them (a foreach
    AdamW step on fake tensors costs seconds for a 1b model)."""
    if (
        not step
        and type(optimizer) is torch.optim.AdamW
        and not any(g.get("amsgrad") for g in optimizer.param_groups)
    ):
        for group in optimizer.param_groups:
            for param in group["params"]:
                optimizer.state[param] = {
                    "step": torch.tensor(0.0),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def train_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    micro: list[dict[str, Any]],
    params: Sequence[torch.Tensor],
    grad_clip: float | None,
    bf16: bool,
) -> None:
    """The trainer's step (runtime/trainer.py) without its bookkeeping: each micro-batch
    forward under autocast and backward, FSDP2 reducing gradients on the last; clipping;
    AdamW; zero_grad."""
    from stoker.runtime.models import contract

    device_type = params[0].device.type if params else "cpu"  # fake tensors: cpu
    for index, batch in enumerate(micro):
        if hasattr(model, "set_requires_gradient_sync"):
            model.set_requires_gradient_sync(index == len(micro) - 1)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = contract.loss_and_metrics(model, batch)
        (loss / len(micro)).backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip is not None else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class ModelFacts:
    """What the search needs of the model itself, from one fake build."""

    params: int
    blocks: int
    flops_per_sample: tuple[float, ...]
    """Training FLOPs of one sample of each bucket's shape (one entry without buckets)."""
    flops_source: str
    """"the model's flops_per_sample" or "PyTorch's FLOP counter"."""
    attention: tuple[AttentionFacts, ...] = ()
    """Per bucket, what context parallelism would split (empty: not recorded)."""


@dataclass(frozen=True)
class AttentionFacts:
    """One sample's sequences and attention, as stoker.model saw a forward of it: what
    context parallelism splits and what its collectives move."""

    tokens: tuple[int, ...]
    """Every sequence length the model cut with token_slice (each must divide by CP)."""
    heads: int | None
    """The fewest heads of an attention call (Ulysses' degree must divide it); None: the
    model calls no stoker.model.attention, so it cannot take CP."""
    causal: bool
    qkv_elements: int
    """Elements of q (= k = v = the output) over every attention call of a forward."""
    score_flops: float = 0.0
    """FLOPs of the attention's two matmuls (q k^T and p v) over every call of a forward:
    the compute a ring's passes hide behind."""


def model_facts(cfg: Any, buckets: list[int | None]) -> ModelFacts:
    """Parameters, blocks and FLOPs per sample of `cfg`'s model, built on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    from stoker.runtime.models import build_model, contract

    with values_needed_said(cfg), _kernels_for(cfg, False), FakeTensorMode():
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, cfg.data)
        params = sum(p.numel() for p in model.parameters())
        blocks = len(contract.blocks_of(model))
        flops: list[float] = []
        attention: list[AttentionFacts] = []
        source = "the model's flops_per_sample"
        for bucket in buckets:
            batch = random_batch(cfg, 1, bucket=bucket)
            attention.append(_attention_facts(model, batch))
            said = contract.flops_per_sample(model, batch)
            if said is None:
                source = "PyTorch's FLOP counter"
                with FlopCounterMode(display=False) as counter:
                    loss, _ = contract.loss_and_metrics(model, batch)
                    loss.backward()  # type: ignore[no-untyped-call]
                said = float(counter.get_total_flops())
                model.zero_grad(set_to_none=True)
            flops.append(float(said))
    return ModelFacts(int(params), blocks, tuple(flops), source, tuple(attention))


def _attention_facts(model: Any, batch: dict[str, Any]) -> AttentionFacts:
    """A forward of one sample with a CP of one rank that records what it is asked."""
    from stoker.runtime.models import contract
    from stoker.runtime.models.context_parallel import SharesOnly, context_parallel_as

    class Recorder(SharesOnly):
        def __init__(self) -> None:
            super().__init__(1, 1)
            self.tokens: list[int] = []
            self.heads: list[int] = []
            self.causal, self.elements, self.flops = False, 0, 0.0

        def token_slice(self, tokens: int) -> slice:
            self.tokens.append(tokens)
            return super().token_slice(tokens)

        def attention(self, q: Any, k: Any, v: Any, **kw: Any) -> Any:
            self.heads.append(int(q.shape[1]))
            self.causal |= bool(kw.get("causal"))
            self.elements += int(q.numel())
            # [B, H, S_q, D] against [B, H, S_k, D]: 2 FLOPs per multiply-add, two matmuls.
            causal = 0.5 if kw.get("causal") else 1.0
            self.flops += 4.0 * q.numel() * int(k.shape[-2]) * causal
            return super().attention(q, k, v, **kw)

    recorder = Recorder()
    with torch.no_grad(), context_parallel_as(recorder):
        contract.loss_and_metrics(model, batch)
    return AttentionFacts(
        tuple(dict.fromkeys(recorder.tokens)),
        min(recorder.heads) if recorder.heads else None,
        recorder.causal,
        recorder.elements,
        recorder.flops,
    )
