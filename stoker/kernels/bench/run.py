"""Run the kernel benchmark and write its JSON result.

For every kernel, shape and mode (fwd, bwd, fwd+bwd), the stoker kernel and
each baseline are timed on the same inputs: torch eager (the kernel's
reference, which is what a model would otherwise run), torch.compile of that
same function (default mode and max-autotune), and Liger-Kernel where it has
the op. Each row holds the times, the bytes of the byte model, stoker's GB/s,
its share of the device-to-device copy bandwidth measured in the same run,
and stoker's speed-up over every baseline (baseline ms / stoker ms).

max-autotune runs as "max-autotune-no-cudagraphs": CUDA graphs remove the
launch cost of any op, ours too, and a timed loop of backwards over one graph
would replay a stale graph; the comparison is of kernels.
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import re
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from stoker.kernels.bench.cases import CASES, MODES, Impl, Inputs, KernelCase, Shape
from stoker.kernels.bench.timing import Timer, copy_bandwidth_gbps

BASELINES = ("eager", "compile", "compile_max_autotune", "liger")
DEFAULT_TOKENS = (4096, 16384, 65536)
DEFAULT_HIDDEN = (1024, 2048, 3072, 4096)
DEFAULT_VOCAB = (8192, 32768, 65536)
_COMPILE_MODES = {"compile": None, "compile_max_autotune": "max-autotune-no-cudagraphs"}


def device_slug(device: torch.device) -> str:
    """'h100', 'h200', ... from the GPU's name; 'cpu' without one."""
    if device.type != "cuda":
        return "cpu"
    return slug_of_name(torch.cuda.get_device_name(device))


def slug_of_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100'; a name without a model number -> its words."""
    lowered = name.lower()
    found = re.search(r"\b([a-z]\d{2,4}[a-z]?)\b", lowered)
    return found.group(1) if found else re.sub(r"[^a-z0-9]+", "-", lowered).strip("-")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def _with_grad(inputs: Inputs, grad: bool) -> Inputs:
    args = tuple(
        a.detach().requires_grad_(grad and i in inputs.grad) if isinstance(a, torch.Tensor) else a
        for i, a in enumerate(inputs.args)
    )
    return Inputs(args, inputs.grad)


def _outputs(out: Any) -> list[torch.Tensor]:
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [o for o in items if isinstance(o, torch.Tensor) and o.requires_grad]


def timed_call(impl: Impl, inputs: Inputs, mode: str) -> Callable[[], object]:
    """A no-argument function that runs one `mode` step of `impl`."""
    prepared = impl.prepare(_with_grad(inputs, mode != "fwd"))
    args = prepared.args
    leaves = [args[i] for i in prepared.grad]
    if mode == "fwd":

        def fwd() -> object:
            with torch.no_grad():
                return impl.call(*args)

        return fwd
    # Upstream gradients made once, outside the timed call.
    outs = _outputs(impl.call(*args))
    grads = [torch.randn_like(o) for o in outs]
    if mode == "bwd":
        return lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True)

    def step() -> object:
        return torch.autograd.grad(_outputs(impl.call(*args)), leaves, grads)

    return step


def _impls(case: KernelCase, baselines: Sequence[str]) -> dict[str, Impl | None]:
    impls: dict[str, Impl | None] = {"stoker": case.stoker}
    for name in baselines:
        if name == "eager":
            impls[name] = case.eager
        elif name in _COMPILE_MODES:
            compiled = torch.compile(case.eager.call, mode=_COMPILE_MODES[name], dynamic=False)
            impls[name] = Impl(compiled, case.eager.prepare)
        elif name == "liger":
            impls[name] = case.liger()
    return impls


def bench_case(
    case: KernelCase,
    shape: Shape,
    dtype: torch.dtype,
    timer: Timer,
    modes: Sequence[str],
    baselines: Sequence[str],
    copy_gbps: float,
) -> list[dict[str, Any]]:
    torch.manual_seed(0)
    inputs = case.make(shape, dtype, timer.device)
    # A fresh compile per shape: dynamic=False kernels, no recompile limit.
    torch._dynamo.reset()
    impls = _impls(case, baselines)
    rows = []
    for mode in modes:
        ms: dict[str, float | None] = {}
        for name, impl in impls.items():
            ms[name] = None if impl is None else timer.median_ms(timed_call(impl, inputs, mode))
        nbytes = case.bytes(shape, torch.finfo(dtype).bits // 8, mode)
        ours = ms["stoker"]
        assert ours is not None
        gbps = nbytes / (ours * 1e-3) / 1e9
        rows.append(
            {
                "kernel": case.name,
                "mode": mode,
                "shape": shape,
                "dtype": str(dtype).removeprefix("torch."),
                "ms": ms,
                "bytes": nbytes,
                "gbps": round(gbps, 1),
                "pct_copy_bw": round(100 * gbps / copy_gbps, 1),
                "speedup": {
                    name: (round(t / ours, 3) if t is not None else None)
                    for name, t in ms.items()
                    if name != "stoker"
                },
            }
        )
    return rows


def run(
    kernels: Sequence[str] = tuple(CASES),
    *,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    hidden: Sequence[int] = DEFAULT_HIDDEN,
    vocab: Sequence[int] = DEFAULT_VOCAB,
    modes: Sequence[str] = MODES,
    baselines: Sequence[str] = BASELINES,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | None = None,
    warmup: int = 5,
    reps: int = 30,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Benchmark `kernels`; returns the result document (see docs/kernels.md)."""
    unknown = [k for k in kernels if k not in CASES] + [m for m in modes if m not in MODES]
    unknown += [b for b in baselines if b not in BASELINES]
    if unknown:
        raise ValueError(
            f"unknown kernel, mode or baseline {', '.join(map(repr, unknown))}; kernels: "
            f"{', '.join(CASES)}; modes: {', '.join(MODES)}; baselines: {', '.join(BASELINES)}"
        )
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timer = Timer(device, warmup=warmup, reps=reps)
    copy_gbps = copy_bandwidth_gbps(timer, (1 << 30) if device.type == "cuda" else (64 << 20))
    rows: list[dict[str, Any]] = []
    for name in kernels:
        case = CASES[name]
        for shape in case.shapes(tokens, hidden, vocab):
            for row in bench_case(case, shape, dtype, timer, modes, baselines, copy_gbps):
                rows.append(row)
                if progress:
                    progress(row)
    import triton

    return {
        "device": device_name(device),
        "device_slug": device_slug(device),
        "host": socket.gethostname(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "copy_gbps": round(copy_gbps, 1),
        "timing": {"warmup": warmup, "reps": reps, "statistic": "median", "l2_flushed": True},
        "rows": rows,
        "summary": summarize(rows),
    }


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per baseline: geometric mean and minimum of stoker's fwd+bwd speed-up."""
    out: dict[str, Any] = {}
    for name in BASELINES:
        ratios = [
            r["speedup"][name]
            for r in rows
            if r["mode"] == "fwd+bwd" and r["speedup"].get(name) is not None
        ]
        if ratios:
            out[name] = {
                "fwd_bwd_geomean": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3),
                "fwd_bwd_min": min(ratios),
                "rows": len(ratios),
            }
    return out


def _key(row: dict[str, Any]) -> str:
    return json.dumps([row["kernel"], row["mode"], row["shape"], row["dtype"]], sort_keys=True)


def write_result(result: dict[str, Any], out_dir: Path) -> Path:
    """Write kernels-<gpu>-<date>.json in out_dir. Rows already in that file
    for other kernels or shapes are kept, so a benchmark split over several
    runs (the device's 10-minute calls) adds up to one file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"kernels-{result['device_slug']}-{result['date']}.json"
    if path.exists():
        old = json.loads(path.read_text())
        fresh = {_key(r) for r in result["rows"]}
        kept = [r for r in old.get("rows", []) if _key(r) not in fresh]
        result = {**result, "rows": kept + result["rows"]}
        result["summary"] = summarize(result["rows"])
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)
    return path


def format_row(row: dict[str, Any]) -> str:
    ms = row["ms"]
    shape = "x".join(str(v) for v in row["shape"].values())
    base = "  ".join(
        f"{name} {ms[name]:.3f} ({row['speedup'][name]:.2f}x)"
        for name in BASELINES
        if ms.get(name) is not None
    )
    return (
        f"{row['kernel']:<19} {row['mode']:<8} {shape:<16} stoker {ms['stoker']:.3f} ms "
        f"{row['gbps']:>7.0f} GB/s {row['pct_copy_bw']:>5.1f}% copy  {base}"
    )
