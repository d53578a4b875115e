"""Cross-entropy: the loss and the logits' gradient against fp64, in fp32, bf16
and fp16, over one and several blocks of classes, strided and batched logits,
every reduction, label smoothing, ignored rows and extreme values; the
reference against torch itself; the errors."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

# Names, not the module: stoker.kernels exports the function cross_entropy,
# which shadows the submodule of the same name as an attribute of the package.
from stoker.kernels.cross_entropy_loss import (
    CrossEntropyLoss,
    cross_entropy,
    cross_entropy_fwd,
    cross_entropy_reference,
)
from tests.kernels.numerics import ON_GPU, Case, assert_matches_fp64, strided

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
REDUCTIONS = ["mean", "sum", "none"]
# (leading dims, classes): two classes on one row; odd sizes inside one block;
# exactly one full block (8192); one block and a tail (9000); two blocks and
# a one-class tail (16385); a [B, S, V] batch; unbatched [V] logits with a
# scalar target. The interpreter is slow, so vocabulary-sized shapes run only
# where a GPU does.
SHAPES = [((1,), 2), ((7,), 129), ((4,), 1000), ((2,), 8192), ((3,), 9000), ((2,), 16385)]
SHAPES += [((2, 3), 300), ((), 50)]
if ON_GPU:
    SHAPES += [((64,), 65536), ((4096,), 32000), ((2, 1024), 50257)]


def _logits(
    lead: tuple[int, ...], v: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(hash((lead, v)) % 2**31)
    # Temperature 2: softmaxes neither uniform nor one-hot.
    return (2 * torch.randn(*lead, v, generator=gen, dtype=torch.float64)).to(device, dtype)


def _target(lead: tuple[int, ...], v: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(hash((v, lead)) % 2**31)
    return torch.randint(0, v, lead, generator=gen).to(device)


def loss_fn(backend, logits, target, **options):
    return cross_entropy(logits, target, backend=backend, **options)


def _case(logits: torch.Tensor, target: torch.Tensor) -> Case:
    return Case({"logits": logits, "target": target}, ("logits",))


def _check(logits: torch.Tensor, target: torch.Tensor, **options) -> None:
    assert_matches_fp64(functools.partial(loss_fn, **options), _case(logits, target))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("lead", "v"), SHAPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy(lead, v, dtype, reduction, device):
    _check(_logits(lead, v, dtype, device), _target(lead, v, device), reduction=reduction)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("lead", "v"), [((7,), 129), ((3,), 9000), ((2, 3), 300)], ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_label_smoothing(lead, v, dtype, reduction, device):
    target = _target(lead, v, device)
    target.view(-1)[1] = -100  # smoothing must skip ignored rows too
    _check(_logits(lead, v, dtype, device), target, reduction=reduction, label_smoothing=0.1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_ignored_rows(dtype, reduction, device):
    x, target = _logits((6,), 1000, dtype, device), _target((6,), 1000, device)
    target[[0, 3]] = -100
    _check(x, target, reduction=reduction)
    # ignore_index may be a real class: rows with that target drop out.
    target = torch.where(target == -100, 5, target)
    target[4] = 5
    _check(x, target, reduction=reduction, ignore_index=5)
    rows = cross_entropy(x, target, reduction="none", ignore_index=5, backend="triton")
    assert (rows[[0, 3, 4]] == 0).all() and (rows[[1, 2, 5]] != 0).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_rows_ignored(dtype, reduction, device):
    """0 with zero gradients where torch's mean is NaN (0 / 0)."""
    x = _logits((2, 3), 300, dtype, device)
    target = torch.full((2, 3), -100, device=device)
    _check(x, target, reduction=reduction)
    for backend in ("triton", "reference"):
        leaf = x.clone().requires_grad_(True)
        loss = cross_entropy(leaf, target, reduction=reduction, backend=backend)
        assert loss.dtype == torch.float32 and (loss == 0).all(), (backend, loss)
        loss.sum().backward()
        assert leaf.grad is not None and (leaf.grad == 0).all(), backend
    assert F.cross_entropy(x.float().view(6, 300), target.view(6)).isnan()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_logits(dtype, device):
    target = _target((3, 7), 129, device)
    x = strided(_logits((3, 7), 129, dtype, device))  # rows a slice of a wider buffer
    assert not x.is_contiguous()
    _check(x, target, reduction="none")
    x2 = strided(_logits((5,), 9000, dtype, device), pad=40)  # strided and two blocks
    _check(x2, _target((5,), 9000, device))
    xt = _logits((7, 3), 129, dtype, device).transpose(0, 1)  # no [rows, V] view: copied
    _check(xt, target, label_smoothing=0.2)
    xc = _logits((129,), 6, dtype, device).t()  # classes not unit-stride: copied
    _check(xc, _target((6,), 129, device), reduction="sum")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_equal_logits_give_log_v(dtype, device):
    """Every class alike: the loss is log V exactly, whatever the common value."""
    v = 1000
    x = (torch.arange(-2, 3, device=device, dtype=torch.float64)[:, None] * 37.5).expand(5, v)
    x = x.to(dtype).contiguous()
    target = _target((5,), v, device)
    _check(x, target, reduction="none")
    loss = cross_entropy(x, target, reduction="none", backend="triton")
    expected = torch.full_like(loss, math.log(v))
    torch.testing.assert_close(loss, expected, rtol=torch.finfo(torch.float32).eps, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("values", ["huge", "offset", "tiny"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_edge_values(values, smoothing, dtype, device):
    x = _logits((3,), 9000, dtype, device).double()
    if values == "huge":
        # exp(x) overflows fp32 from 89: only a subtracted max keeps it finite.
        # fp16 up to its largest value, 65504.
        x = x * 1e4 if dtype != torch.float16 else x / x.abs().max() * 65504
    elif values == "offset":  # every logit large and positive, close together
        x = x + (3e4 if dtype == torch.float16 else 1e4)
    elif values == "tiny":  # a nearly uniform softmax: the loss is log V - tiny
        x = x * 1e-3
    x = x.to(dtype)
    assert torch.isfinite(x).all()
    target = _target((3,), 9000, device)
    _check(x, target, reduction="none", label_smoothing=smoothing)
    _check(x, target, reduction="mean", label_smoothing=smoothing)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_masked_classes(dtype, device):
    """-inf logits (a vocabulary padded and masked out), a whole first block
    of them included: the online softmax must not turn -inf - -inf into NaN."""
    x, target = _logits((4,), 9000, dtype, device), _target((4,), 9000, device)
    x[:, :8192] = float("-inf")
    x[:, 8500::7] = float("-inf")
    target = 8192 + target % 300  # every target a class that is not masked
    _check(x, target, reduction="none")
    _check(x, target, reduction="mean")


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_empty_batch(backend, device):
    """No rows: mean and sum are 0 (torch's mean is NaN), none is empty."""
    x = torch.randn(0, 7, device=device, requires_grad=True)
    target = torch.zeros(0, dtype=torch.long, device=device)
    for reduction in REDUCTIONS:
        loss = cross_entropy(x, target, reduction=reduction, backend=backend)
        assert loss.shape == (() if reduction != "none" else (0,))
        assert (loss == 0).all()
        loss.sum().backward()
        assert x.grad is not None and x.grad.shape == (0, 7)


def test_out_of_range_targets(device):
    """The reference raises as torch does; the Triton path cannot check
    without a sync, so the row's loss and gradient are NaN, the others exact."""
    x, target = _logits((4,), 5, torch.float32, device), torch.tensor([1, 7, 2, -1])
    target = target.to(device)
    with pytest.raises(IndexError, match=r"target 7 is out of bounds for 5 classes"):
        cross_entropy(x, target, backend="reference")
    with pytest.raises(IndexError):
        F.cross_entropy(x.cpu(), target.cpu())
    leaf = x.clone().requires_grad_(True)
    rows = cross_entropy(leaf, target, reduction="none", backend="triton")
    rows.sum().backward()
    assert leaf.grad is not None
    assert rows[[1, 3]].isnan().all() and leaf.grad[[1, 3]].isnan().all()
    ok = torch.tensor([0, 2], device=device)
    ref = x[ok].clone().requires_grad_(True)
    want = cross_entropy(ref, target[ok], reduction="none", backend="reference")
    want.sum().backward()
    torch.testing.assert_close(rows[ok], want)
    torch.testing.assert_close(leaf.grad[ok], ref.grad)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_reference_matches_torch(reduction, smoothing, device):
    """The fp64 reference is torch's own cross_entropy (class dim last)."""
    x = _logits((2, 5), 33, torch.float64, device)
    target = _target((2, 5), 33, device)
    target[0, 1] = target[1, 4] = 7  # ignore_index as a class, on some rows
    got_x, want_x = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    options = {"reduction": reduction, "label_smoothing": smoothing, "ignore_index": 7}
    got = cross_entropy_reference(got_x, target, **options)
    want = F.cross_entropy(want_x.view(10, 33), target.view(10), **options)
    want = want.view(2, 5) if reduction == "none" else want
    torch.testing.assert_close(got, want)
    gen = torch.Generator().manual_seed(0)
    upstream = torch.randn(got.shape, generator=gen, dtype=torch.float64).to(device)
    got.backward(upstream)
    want.backward(upstream)
    torch.testing.assert_close(got_x.grad, want_x.grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_loss_dtype_and_target_dtypes(dtype, device):
    """fp32 loss for every logits dtype; any integer target dtype."""
    x, target = _logits((2, 3), 40, dtype, device), _target((2, 3), 40, device)
    want = cross_entropy(x, target, backend="reference")
    assert want.dtype == torch.float32
    for t in (target, target.int(), target.to(torch.int16), target.to(torch.uint8)):
        got = cross_entropy(x, t, backend="triton")
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want)
    assert cross_entropy(x.double(), target, backend="reference").dtype == torch.float64


def test_errors_name_the_values(device):
    x, target = torch.randn(4, 10, device=device), torch.zeros(4, dtype=torch.long, device=device)
    for backend in ("triton", "reference"):
        with pytest.raises(ValueError, match=r"target has shape \(3,\); expected \(4,\)"):
            cross_entropy(x, target[:3], backend=backend)
        with pytest.raises(ValueError, match=r"target is torch.float32; .* integer dtype"):
            cross_entropy(x, target.float(), backend=backend)
        with pytest.raises(ValueError, match=r"reduction 'avg' is not one of 'mean'"):
            cross_entropy(x, target, reduction="avg", backend=backend)  # type: ignore[arg-type]
        for bad in (1.0, -0.1):
            with pytest.raises(ValueError, match=rf"label_smoothing {bad} is outside \[0, 1\)"):
                cross_entropy(x, target, label_smoothing=bad, backend=backend)
        with pytest.raises(ValueError, match=r"V >= 1 classes; got \(4, 0\)"):
            cross_entropy(x[:, :0], target, backend=backend)
    with pytest.raises(ValueError, match=r"target is on meta but logits are on"):
        cross_entropy(x, target.to("meta"))
    with pytest.raises(ValueError, match=r"not torch.float64; use backend='reference'"):
        cross_entropy(x.double(), target, backend="triton")
    with pytest.raises(ValueError, match=r"reduction 'mea' is not one of"):
        CrossEntropyLoss(reduction="mea")  # type: ignore[arg-type]


def test_module_matches_function(device):
    x, target = _logits((2, 5), 64, torch.bfloat16, device), _target((2, 5), 64, device)
    target[0, 0] = 3
    loss = CrossEntropyLoss(ignore_index=3, label_smoothing=0.1, backend="triton")
    assert "ignore_index=3" in repr(loss) and "label_smoothing=0.1" in repr(loss)
    want = cross_entropy(x, target, ignore_index=3, label_smoothing=0.1, backend="reference")
    torch.testing.assert_close(loss(x, target), want)


def test_custom_ops_pass_opcheck(device):
    x, target = _logits((6,), 40, torch.float32, device), _target((6,), 40, device)
    target[2] = -100
    _, lse = cross_entropy_fwd(x, target, -100, 0.1)
    dloss = torch.randn(6, device=device)
    for args in ((x, target, -100, 0.0), (x, target, -100, 0.1)):
        torch.library.opcheck(torch.ops.stoker.cross_entropy_fwd.default, args)
    args = (dloss, x, target, lse, -100, 0.1)
    torch.library.opcheck(torch.ops.stoker.cross_entropy_bwd.default, args)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiles_fullgraph(reduction, device):
    """torch.compile traces the reduction and the custom ops in one graph (the
    mean's row count stays a tensor: no .item(), no graph break)."""
    seen: set[str] = set()

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        # The autograd.Function is a higher-order op: its forward and backward
        # are subgraph modules of gm.
        for module in gm.modules():
            if isinstance(module, torch.fx.GraphModule):
                seen.update(str(n.target) for n in module.graph.nodes if "stoker" in str(n.target))
        return gm.forward

    x, target = _logits((3, 4), 50, torch.float32, device), _target((3, 4), 50, device)
    target[0, 0] = -100
    fn = functools.partial(loss_fn, "triton", reduction=reduction, label_smoothing=0.1)
    compiled = torch.compile(fn, fullgraph=True, backend=record)
    got_x, want_x = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    got, want = compiled(got_x, target), fn(want_x, target)
    got.sum().backward()
    want.sum().backward()
    assert {"stoker.cross_entropy_fwd.default", "stoker.cross_entropy_bwd.default"} <= seen, seen
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_x.grad, want_x.grad)


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="no GPU here: this test measures CUDA memory")
def test_no_fp32_logits_sized_tensor(device):
    """The forward allocates [N] floats; the backward one [N, V] gradient in
    the logits' dtype, and nothing the size of the logits in fp32."""
    n, v = 4096, 32000
    x = _logits((n,), v, torch.bfloat16, device).requires_grad_(True)
    target = _target((n,), v, device)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = cross_entropy(x, target, backend="triton")
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base < 2**20
    loss.backward()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base < x.numel() * x.element_size() + 2**20
