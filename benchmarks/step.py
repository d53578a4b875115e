"""Training-step throughput and MFU of one model on one GPU: full steps
(forward, backward, gradient clipping, AdamW) in bf16 autocast with fp32
weights and AdamW states, on a synthetic batch that stays on the GPU, for
each variant: stoker (the Triton kernels), reference (the pure-torch modules,
eager), compile (the reference modules, each block torch.compile'd) and
stoker+compile. The same benchmark as `stoker bench step` (same options):

    python benchmarks/step.py [--arch av_dit|audio_ar] [--size 1b] [--batch-size N]
        [--variants stoker,reference,compile,stoker+compile] [--steps 20] [--warmup 5]
        [--resolution 256x256] [--fps 8] [--clip-seconds 2]
        [--activation-checkpointing none|selective|full] [--device auto|cuda|cpu]
        [--out benchmarks/results] [--json]

Defaults: the 1b av_dit on 2 s clips at 8 fps of 256x256 video and mono
16 kHz audio, 2048 video + 40 audio = 2088 tokens a sample, batch 8 (fits an
80 GB H100 without activation checkpointing; docs/runtime.md).

Writes benchmarks/results/step-<gpu>-<date>.json: {"device", "device_slug",
"date", "torch", "triton", "peak_flops", "model": {"arch", "size", "params",
"tokens_per_sample", "flops_per_sample"}, "data", "batch_size", "rows":
[{"variant", "backend", "compiled", "step_ms", "samples_per_s", "tokens_per_s",
"tflops", "mfu", "peak_memory_gb", "speedup": {"reference", "compile"}}],
"target_mfu"}. Rows of an earlier run with the same setup on the same GPU and
day are kept for the variants not run again. Target (issue "Training
runtime"): the 1b av_dit with the stoker kernels at >= 45% MFU in bf16 on an
H100 or H200.

Needs only torch, triton, typer and rich: GPU machines without pydantic,
mlflow, PyAV or soundfile run it from a checkout with PYTHONPATH=. . On a CPU
(`--device cpu --size tiny --resolution 64x64`) it checks the harness only.
"""

from __future__ import annotations

import sys

from stoker.cli.app import app

if __name__ == "__main__":
    app(args=["bench", "step", *sys.argv[1:]], prog_name="benchmarks/step.py")
