"""The test files that hold the tests marked `gpu` (skipped without a CUDA GPU), and the
modules the GPU machine lacks: `scripts/gpu-check` runs those files with those modules
blocked, as `STOKER_BLOCK_IMPORTS=mlflow,av,soundfile,submitit,moto,s3fs,webdataset
PYTHONPATH=benchmarks/gpu_check/import_blocker:. python -m pytest -m gpu -p
no:cacheprovider <GPU_TEST_PATHS>` from the repository root, so a module that imports
one of them at the top fails here (a collection error) rather than there.
tests/benchmarks/test_gpu_tests_listed.py checks that every file with a `gpu` test is
listed."""

from __future__ import annotations

GPU_TEST_PATHS: tuple[str, ...] = (
    "tests/data/test_encode.py",
    "tests/kernels/test_cross_entropy.py",
    "tests/runtime/dist/test_precision.py",
    "tests/runtime/test_context_parallel.py",
)
"""Relative to the repository root."""

BLOCKED_MODULES = ("mlflow", "av", "soundfile", "submitit", "moto", "s3fs", "webdataset")
"""Top-level module names, for STOKER_BLOCK_IMPORTS (comma-separated)."""
