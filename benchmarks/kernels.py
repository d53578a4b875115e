"""Triton kernels against torch eager, torch.compile (default and
max-autotune) and Liger-Kernel, fwd / bwd / fwd+bwd, at AV DiT shapes, with
GB/s from a declared byte model and % of the copy bandwidth measured in the
same run. The same benchmark as `stoker bench kernels` (same options):

    python benchmarks/kernels.py [--kernels rms_norm,...] [--tokens 4096,16384,65536]
        [--hidden 1024,2048,3072,4096] [--vocab 8192,32768,65536] [--modes fwd,bwd,fwd+bwd]
        [--baselines eager,compile,compile_max_autotune,liger] [--dtype bf16]
        [--reps 30] [--warmup 5] [--device auto] [--out benchmarks/results] [--json]

Writes benchmarks/results/kernels-<gpu>-<date>.json: {"device", "torch", "triton",
"copy_gbps", "rows": [{"kernel", "mode", "shape", "dtype", "ms": {"stoker", "eager",
"compile", "compile_max_autotune", "liger"}, "bytes", "gbps", "pct_copy_bw",
"speedup": {baseline: baseline ms / stoker ms}}], "summary"}. Rows of an earlier
run on the same GPU and day for other kernels or shapes are kept, so the
benchmark can run in parts. Targets (docs/kernels.md): fwd+bwd >= 1.0x
torch.compile at every shape, geometric mean >= 1.3x; forward >= 85% and
backward >= 70% of the copy bandwidth at the large shapes.

Needs only torch, triton and typer (liger-kernel when installed): GPU machines
without mlflow or PyAV run it from a checkout with PYTHONPATH=. .
"""

from __future__ import annotations

import sys

from stoker.cli.app import app

if __name__ == "__main__":
    app(args=["bench", "kernels", *sys.argv[1:]], prog_name="benchmarks/kernels.py")
