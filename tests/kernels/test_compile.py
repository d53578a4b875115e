"""torch.compile(fullgraph=True) traces through every kernel's custom op (fake
implementations, autograd), and the custom ops pass torch.library.opcheck."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stoker import kernels
from stoker.kernels import gated_units as glu_mod
from stoker.kernels import norms


class Block(nn.Module):
    """A DiT-style block reduced to the kernels: adaLN norm, gated MLP, fused
    residual add + norm."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ada = norms.AdaLNRMSNorm(dim)
        self.mod = nn.Linear(dim, 2 * dim)
        self.mlp = glu_mod.SwiGLU(dim, 2 * dim)
        self.geglu = glu_mod.GeGLU(dim, dim, approximate="tanh")
        self.add_norm = norms.AddRMSNorm(dim)
        self.out_norm = norms.RMSNorm(dim)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.mod(cond).chunk(2, dim=-1)
        h = self.mlp(self.ada(x, scale, shift))
        y, stream = self.add_norm(self.geglu(h), x)
        return self.out_norm(y + stream)


def _graph_ops(model: nn.Module, *args: torch.Tensor, backend: str) -> tuple[set[str], list]:
    """Compile fullgraph (a graph break raises), run forward and backward;
    return the stoker ops in the traced graph and the outputs and grads."""
    seen: set[str] = set()

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        # autograd.Function traces to a higher-order op whose forward and
        # backward are sub-graphs: look in every one.
        for sub in gm.modules():
            if isinstance(sub, torch.fx.GraphModule):
                for node in sub.graph.nodes:
                    if node.op == "call_function" and "stoker" in str(node.target):
                        seen.add(str(node.target))
        return gm.forward

    compiled = torch.compile(model, fullgraph=True, backend=record)
    out = compiled(*args)
    out.float().pow(2).sum().backward()
    return seen, [out.detach()] + [p.grad.clone() for p in model.parameters()]


def _eager(model: nn.Module, *args: torch.Tensor) -> list[torch.Tensor]:
    out = model(*args)
    out.float().pow(2).sum().backward()
    return [out.detach()] + [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("kernel_backend", ["triton", "reference"])
def test_block_compiles_fullgraph(kernel_backend, device):
    torch.manual_seed(0)
    model = Block(48).to(device)
    x, cond = torch.randn(2, 5, 48, device=device), torch.randn(2, 48, device=device)
    with kernels.use_backend(kernel_backend):
        want = _eager(model, x, cond)
        model.zero_grad()
        ops, got = _graph_ops(model, x, cond, backend="eager")
    if kernel_backend == "triton":
        assert {"stoker.rms_norm_fwd.default", "stoker.glu_fwd.default"} <= ops, ops
    else:
        assert not ops, "the reference path must trace to plain torch ops"
    for a, b in zip(got, want, strict=False):
        torch.testing.assert_close(a, b)


def test_block_compiles_with_inductor(device):
    """Inductor lowers the graph around the custom ops; the result and the
    gradients equal eager's."""
    torch.manual_seed(0)
    model = Block(32).to(device)
    x, cond = torch.randn(2, 3, 32, device=device), torch.randn(2, 32, device=device)
    with kernels.use_backend("triton"):
        want = _eager(model, x, cond)
        model.zero_grad()
        compiled = torch.compile(model, fullgraph=True)
        out = compiled(x, cond)
        out.float().pow(2).sum().backward()
    got = [out.detach()] + [p.grad for p in model.parameters()]
    for a, b in zip(got, want, strict=False):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _opcheck_cases(device: torch.device) -> list[tuple[object, tuple]]:
    x = torch.randn(6, 40, device=device)
    w, mod = torch.randn(40, device=device), torch.randn(2, 40, device=device)
    y, h, rstd = norms.rms_norm_fwd(x, x, w, mod, mod, 1e-6)
    return [
        (torch.ops.stoker.rms_norm_fwd.default, (x, None, w, None, None, 1e-6)),
        (torch.ops.stoker.rms_norm_fwd.default, (x, x.clone(), w, mod, mod, 1e-6)),
        (torch.ops.stoker.rms_norm_bwd.default, (y, h, h, w, mod, rstd)),
        (torch.ops.stoker.rms_norm_bwd.default, (y, None, x, None, None, rstd)),
        (torch.ops.stoker.glu_fwd.default, (x, "silu")),
        (torch.ops.stoker.glu_bwd.default, (x[:, :20].contiguous(), x, "gelu")),
    ]


def test_custom_ops_pass_opcheck(device):
    for op, args in _opcheck_cases(device):
        torch.library.opcheck(op, args)


def test_the_custom_ops_take_fake_inputs_that_no_view_can_flatten(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`stoker plan` runs the Triton kernels' fake implementations on fake tensors: a
    norm of q after a transpose ([B, S, H, D] with strides no 2-D view takes) must be
    copied, as a real tensor's is, not refused by the fake tensor's view."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from stoker.kernels import rms_norm, use_backend

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # "triton" resolves on CPU tensors
    with FakeTensorMode(), use_backend("triton"):
        x = torch.empty(2, 16, 8, 32).transpose(1, 2)  # [2, 8, 16, 32], not viewable as rows
        weight = torch.ones(32, requires_grad=True)
        y = rms_norm(x, weight, 1e-6)
        y.sum().backward()
        assert y.shape == x.shape and weight.grad is not None
