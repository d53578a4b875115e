"""Compile every Triton kernel for an H100 (sm_90) on a machine without a GPU,
through Triton's real compiler and ptxas, and report registers and stack
(spill) bytes.

The interpreter checks what a kernel computes, not that it compiles: it
accepts code the GPU compiler rejects (type mismatches of loop-carried values,
unsupported ops), and says nothing of register pressure. Here a stand-in driver
answers "sm_90" and each launch is turned into a compile-only warm-up, so the
launchers run unchanged on CPU tensors. Prints one JSON line per compiled
kernel. Run as a script (it replaces triton's active driver):

    python tests/kernels/sm90_compile.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


class _Sm90Driver:
    """Just enough of a CUDA driver for JITFunction to compile: no device."""

    def get_current_target(self) -> GPUTarget:
        return TARGET

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def _resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers and spill bytes of the compiled kernel, from cuobjdump."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        out = subprocess.run(
            [str(CUOBJDUMP), "--dump-resource-usage", str(path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"cuobjdump failed: {out.stderr.strip()}")
    regs = re.search(r"REG:(\d+)", out.stdout)
    spills = re.search(r"STACK:(\d+)", out.stdout)
    return {"registers": int(regs.group(1)) if regs else -1,
            "stack_bytes": int(spills.group(1)) if spills else -1}  # fmt: skip


def _compile_launches(label: str, call: Any, results: list[dict[str, Any]]) -> None:
    original = JITFunction.run

    def compile_only(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kw: Any) -> Any:
        kernel = original(self, *args, grid=grid, warmup=True, **kw)
        results.append(
            {"case": label, "kernel": self.fn.__name__, "num_warps": kernel.metadata.num_warps,
             "shared_bytes": kernel.metadata.shared, **_resource_usage(kernel.asm["cubin"])}
        )  # fmt: skip
        return kernel

    JITFunction.run = compile_only  # type: ignore[method-assign]
    try:
        call()
    finally:
        JITFunction.run = original  # type: ignore[method-assign]


def cases() -> dict[str, Any]:
    from stoker.kernels.ops import cross_entropy, glu, rms_norm, rope

    bf16 = {"dtype": torch.bfloat16}

    def norm(hidden: int, residual: bool, mod: bool) -> Any:
        def call() -> None:
            x = torch.randn(256, hidden, **bf16)
            w = torch.ones(hidden, **bf16)
            m = torch.randn(4, hidden, **bf16) if mod else None
            r = x.clone() if residual else None
            _, _h, rstd = rms_norm.rms_norm_fwd(x, r, w if not mod else None, m, m, 1e-6)
            rms_norm.rms_norm_bwd(x, r, x, w if not mod else None, m, rstd)

        return call

    def gated(act: str) -> Any:
        def call() -> None:
            x = torch.randn(64, 2 * 4096, **bf16)
            glu.glu_bwd(glu.glu_fwd(x, act), x, act)

        return call

    def rotary(heads: int, kv_heads: int, dim: int) -> Any:
        def call() -> None:
            q = torch.randn(2, 64, heads, dim, **bf16)
            k = torch.randn(2, 64, kv_heads, dim, **bf16)
            cs = torch.randn(64, dim // 2)
            rope.rope_bwd(*rope.rope_fwd(q, k, cs, cs), cs, cs)

        return call

    def xent(vocab: int, smoothing: float) -> Any:
        def call() -> None:
            x = torch.randn(16, vocab, **bf16)
            t = torch.randint(0, vocab, (16,))
            _loss, lse = cross_entropy.cross_entropy_fwd(x, t, -100, smoothing)
            cross_entropy.cross_entropy_bwd(torch.ones(16), x, t, lse, -100, smoothing)

        return call

    out: dict[str, Any] = {}
    for hidden in (1024, 3072, 4096, 8192):
        out[f"rms_norm h={hidden}"] = norm(hidden, False, False)
    out["add_rms_norm h=4096"] = norm(4096, True, False)
    out["modulated_rms_norm h=4096"] = norm(4096, False, True)
    for act in ("silu", "gelu", "gelu_tanh"):
        out[f"glu {act}"] = gated(act)
    out["rope 16x128"] = rotary(16, 16, 128)
    out["rope 32/8x64"] = rotary(32, 8, 64)
    out["cross_entropy V=65536"] = xent(65536, 0.0)
    out["cross_entropy V=32000 smoothing"] = xent(32000, 0.1)
    out["cross_entropy V=256"] = xent(256, 0.0)
    return out


def main() -> int:
    driver.set_active(_Sm90Driver())  # type: ignore[arg-type]
    results: list[dict[str, Any]] = []
    for label, call in cases().items():
        _compile_launches(label, call, results)
    for row in results:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
