"""One gloo rank of tests/runtime/test_context_parallel.py (4 ranks, tests/local_ranks.py): every
context-parallel layout of 2 and 4 ranks against one rank holding every token, on the
same batch and weights, in fp32. Rank 0 writes one JSON object per case.

For each case every rank computes the CP 1 reference itself (the whole sequence, no CP),
then its share with CP; the CP gradients are summed over the CP group and divided by its
size, as FSDP's mean over the shard x CP ranks does (stoker/runtime/models/
context_parallel.py), and compared tensor by tensor with the reference's."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from stoker.model import set_context_parallel
from stoker.runtime.models.context_parallel import GroupContextParallel, context_parallel_of_world

# (CP degree, Ulysses degree): Ulysses 2, ring 2, Ulysses 4, ring 4, Ulysses 2 x ring 2.
LAYOUTS = [(2, 2), (2, 1), (4, 4), (4, 1), (4, 2)]


DOC = Path(__file__).resolve().parents[2] / "docs" / "bring-your-own.md"


def documented_model() -> type[nn.Module]:
    """The long-sequence model docs/bring-your-own.md shows (its `# mypkg/long.py` block),
    as written there: a user's model with stoker.model's attention, token_slice, cp_sum."""
    text = DOC.read_text()
    found = re.search(r"```python\n(# mypkg/long.py\n.*?)```", text, re.S)
    assert found, f"{DOC} has no `# mypkg/long.py` example"
    namespace: dict[str, Any] = {}
    exec(compile(found.group(1), f"{DOC}:mypkg/long.py", "exec"), namespace)
    model: type[nn.Module] = namespace["LongModel"]
    return model


def plugin_case() -> tuple[nn.Module, list[dict[str, Any]]]:
    model = documented_model()()
    gen = torch.Generator().manual_seed(7)
    x, target = (torch.randn(2, 24, 3, generator=gen) for _ in range(2))
    return model, [{"x": x, "target": target}]


def av_dit_case() -> tuple[nn.Module, list[dict[str, Any]]]:
    """The av_dit on video and audio, two buckets: 4 x 4 x 2 video patches and 8 audio
    tokens, then 2 x 4 x 4 and 4."""
    from stoker.config import DataConfig, ModelConfig
    from stoker.runtime.models import build_model

    data = DataConfig.model_validate(
        {
            "clip_seconds": 1.0,
            "fps": 8,
            "resolution": [32, 64],
            "sample_rate": 3200,
            "buckets": [
                {"resolution": [32, 64], "clip_seconds": 1.0, "batch_size": 2},
                {"resolution": [32, 32], "clip_seconds": 0.5, "batch_size": 2},
            ],
        }
    )
    model = build_model(ModelConfig(arch="av_dit", size="tiny"), data)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(3)
    batches = []
    for frames, width, samples in ((8, 64, 3200), (4, 32, 1600)):
        batches.append(
            {
                "video": torch.randint(
                    0, 256, (2, frames, 3, 32, width), generator=gen, dtype=torch.uint8
                ),
                "audio": torch.rand(2, 1, samples, generator=gen) * 2 - 1,
                "valid": torch.tensor([True, True]),
            }
        )
    return model, batches


def audio_ar_case() -> tuple[nn.Module, list[dict[str, Any]]]:
    from stoker.config import DataConfig, ModelConfig
    from stoker.runtime.models import build_model

    data = DataConfig.model_validate(
        {"clip_seconds": 0.02, "sample_rate": 3200, "channels": 1, "modalities": ["audio"]}
    )
    model = build_model(ModelConfig(arch="audio_ar", size="tiny"), data)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(5)
    return model, [{"audio": torch.rand(2, 1, 64, generator=gen) * 2 - 1}]


def one_bucket(
    make: Callable[[], tuple[nn.Module, list[dict[str, Any]]]],
) -> Callable[[], tuple[nn.Module, list[dict[str, Any]]]]:
    def first() -> tuple[nn.Module, list[dict[str, Any]]]:
        model, batches = make()
        return model, batches[:1]

    return first


def compiled(model: nn.Module) -> None:
    from stoker.runtime.dist.parallelize import apply_activation_checkpointing, apply_compile

    apply_activation_checkpointing(model, "full")
    apply_compile(model)


def perturb(model: nn.Module) -> None:
    """Every parameter moved off its init (adaLN-zero leaves most gradients at zero)."""
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.05)


def loss_and_grads(
    model: nn.Module, batches: list[dict[str, Any]]
) -> tuple[list[float], dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    losses = []
    for batch in batches:
        # The same noise for every layout: per-sample generators seeded afresh.
        batch = {**batch, "generators": [torch.Generator().manual_seed(100 + i) for i in range(2)]}
        loss = model(batch)
        loss.backward()
        losses.append(float(loss.detach()))
    grads = {
        _unwrapped(n): p.grad.detach().clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }
    return losses, grads


def _unwrapped(name: str) -> str:
    """A parameter's name without what activation checkpointing and compile put in it."""
    for wrapper in ("_orig_mod.", "_checkpoint_wrapped_module."):
        name = name.replace(wrapper, "")
    return name


def compare(
    reference: tuple[list[float], dict[str, torch.Tensor]],
    ours: tuple[list[float], dict[str, torch.Tensor]],
) -> dict[str, Any]:
    """The loss's relative difference, and per gradient tensor the worst of
    |g_CP - g_1| / bound for the norm and the largest element, where the bound is 1e-5 of
    the reference tensor's norm (largest element), or 1e-6 of the whole gradient's norm
    for a tensor whose norm is below that: at most 1 passes."""
    (ref_losses, ref_grads), (losses, grads) = reference, ours
    total = float(torch.sqrt(sum(g.double().square().sum() for g in ref_grads.values())))
    worst: dict[str, tuple[float, str]] = {"norm": (0.0, ""), "max": (0.0, "")}
    for name, ref in ref_grads.items():
        delta = (grads[name] - ref).double()
        small = float(ref.norm()) < 1e-6 * total
        bounds = {
            "norm": 1e-6 * total if small else 1e-5 * float(ref.norm()),
            "max": 1e-6 * total if small else 1e-5 * float(ref.abs().max()),
        }
        found = {"norm": float(delta.norm()), "max": float(delta.abs().max())}
        for kind, bound in bounds.items():
            ratio = found[kind] / bound if bound > 0 else float("inf") * found[kind]
            if ratio > worst[kind][0]:
                worst[kind] = (ratio, name)
    return {
        "losses": ref_losses,
        "cp_losses": losses,
        "loss_rel": max(abs(a - b) / abs(a) for a, b in zip(ref_losses, losses, strict=True)),
        "grad_norm": worst["norm"],
        "grad_max": worst["max"],
        "zero_grads": [n for n, g in ref_grads.items() if float(g.norm()) == 0.0],
        "missing": sorted(set(ref_grads) - set(grads)),
        "tensors": len(ref_grads),
    }


def run_case(
    name: str,
    make: Callable[[], tuple[nn.Module, list[dict[str, Any]]]],
    cp: GroupContextParallel,
    wrap: Callable[[nn.Module], None] | None = None,
) -> dict[str, Any]:
    """`wrap`: applied to the model after the eager CP 1 reference, before the CP run."""
    torch.manual_seed(0)
    model, batches = make()
    perturb(model)
    set_context_parallel(None)
    reference = loss_and_grads(model, batches)
    if wrap is not None:
        wrap(model)
    set_context_parallel(cp)
    try:
        losses, grads = loss_and_grads(model, batches)
    finally:
        set_context_parallel(None)
    for grad in grads.values():
        dist.all_reduce(grad, group=cp.group)
        grad /= cp.size
    return {
        "case": name,
        "cp": cp.size,
        "ulysses": cp.ulysses,
        "ring": cp.ring,
        **compare(reference, (losses, grads)),
    }


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results = []
    for size, ulysses in LAYOUTS:
        cp = context_parallel_of_world(size, ulysses)
        results.append(run_case("plugin", plugin_case, cp))
        results.append(run_case("av_dit", av_dit_case, cp))
        if cp.ring == 1:
            results.append(run_case("audio_ar", audio_ar_case, cp))
    # The runtime's wrapping (activation checkpointing, then torch.compile of each block
    # whole), on one bucket (one graph); ranks 2 and 3 sit it out (it compiles per rank).
    cp = context_parallel_of_world(2, 1)
    if dist.get_rank() < 2:
        results.append(run_case("av_dit compiled", one_bucket(av_dit_case), cp, compiled))
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as out:
            json.dump(results, out, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
