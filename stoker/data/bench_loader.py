"""How fast the streaming loader feeds a trainer on this machine: samples/s,
decoded frames/s per worker core, bytes/s, and the headroom against the step
rate the trainer needs (headroom < 1 means the GPUs would wait for data)."""

from __future__ import annotations

import time
from typing import Any

from stoker.data.stream.loader import StreamingLoader


def bench_loader(
    url: str,
    *,
    workers: int,
    batch_size: int,
    batches: int,
    step_rate: float,
    loader_options: dict[str, Any],
) -> dict[str, Any]:
    """Time `batches` batches after a first one (worker start-up is reported apart)."""
    loader = StreamingLoader(url, batch_size=batch_size, num_workers=workers, **loader_options)
    began = time.perf_counter()
    it = loader.batches(max_batches=batches + 1)
    next(it)
    first_batch_s = time.perf_counter() - began
    before = loader.stats()
    start = time.perf_counter()
    taken = 0
    for _ in it:
        taken += 1
    elapsed = time.perf_counter() - start
    after = loader.stats()
    samples = taken * batch_size
    frames = after.video_frames - before.video_frames
    cores = max(1, workers)
    steps_per_s = taken / elapsed if elapsed > 0 else float("inf")
    return {
        "url": url,
        "workers": workers,
        "batch_size": batch_size,
        "batches": taken,
        "first_batch_s": round(first_batch_s, 3),
        "seconds": round(elapsed, 3),
        "samples_per_s": round(samples / elapsed, 2),
        "frames_per_s": round(frames / elapsed, 1),
        "frames_per_s_per_core": round(frames / elapsed / cores, 1),
        "bytes_per_s": round((after.bytes_read - before.bytes_read) / elapsed, 1),
        "decode_s_per_sample": round(
            (after.decode_s - before.decode_s) / max(1, after.samples - before.samples), 5
        ),
        "skipped_samples": after.skipped_samples,
        "steps_per_s": round(steps_per_s, 3),
        "target_steps_per_s": step_rate,
        "headroom": round(steps_per_s / step_rate, 2) if step_rate > 0 else None,
    }
