"""Batch buffers that go round between a loader's worker and the training loop
(stoker/data/stream/shared_batch.py): a batch the loop keeps, whole or as a view of one
row, is never written over by the batches after it, while the batches it lets go of
come back in the same buffers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stoker.config import ExperimentConfig
from stoker.data.stream.loader import StreamingLoader
from stoker.data.stream.shared_batch import BufferPool, LentBuffers, SharedBatch, leases
from stoker.data.synthetic.shapes_latents import write_synthetic_latents

CLIPS = 24
BATCH = 4
BATCHES = 3 * CLIPS // BATCH  # three epochs


def latent_set(path: Path) -> str:
    data = ExperimentConfig.model_validate(
        {"data": {"modalities": ["latent"], "resolution": [32, 32], "clip_seconds": 0.5}}
    ).data
    write_synthetic_latents(path, data, clips=CLIPS, seed=5)
    return str(path)


def loader(url: str, workers: int) -> StreamingLoader:
    return StreamingLoader(
        url, batch_size=BATCH, num_workers=workers, seed=3, modalities=("latent",)
    )


def rows(batch: dict[str, Any]) -> dict[str, Any]:
    """What a batch holds, as values that outlive it."""
    return {
        "key": list(batch["key"]),
        "position": batch["position"].tolist(),
        "valid": batch["valid"].tolist(),
        **{name: t.clone() for name, t in batch["latent"].items()},
    }


def same(held: dict[str, Any], expected: dict[str, Any]) -> bool:
    return held.keys() == expected.keys() and all(
        torch.equal(v, expected[k]) if isinstance(v, torch.Tensor) else v == expected[k]
        for k, v in held.items()
    )


def test_batches_the_loop_keeps_are_never_written_over(tmp_path: Path) -> None:
    url = latent_set(tmp_path / "latents")
    expected = [rows(b) for b in loader(url, 0).batches(BATCHES)]  # in this process

    kept: dict[int, dict[str, Any]] = {}
    kept_row: dict[int, torch.Tensor] = {}
    for n, batch in enumerate(loader(url, 1).batches(BATCHES)):
        assert same(rows(batch), expected[n]), f"batch {n} is not the one without workers"
        if n == 2:
            kept[n] = batch
        elif n == 3:
            kept_row[n] = batch["latent"]["video"][1]  # a view of a row, the batch let go
        del batch  # as a loop does when it takes the next
    for n, batch in kept.items():
        assert same(rows(batch), expected[n]), f"kept batch {n} was written over"
    for n, row in kept_row.items():
        assert torch.equal(row, expected[n]["video"][1]), f"kept row of batch {n} was written over"


def test_a_buffer_comes_back_once_nothing_refers_to_it() -> None:
    """One worker's pool and the main process's side, in this process."""
    bytes_ = leases(1)
    pool, lent = BufferPool(0, bytes_), LentBuffers(bytes_)

    def send(value: int) -> dict[str, Any]:
        shared = SharedBatch()
        batch = {"x": shared.stack([torch.full((1000,), value)] * 4), "n": 2}
        shared.fill(batch, pool)
        lent.resolve(batch)
        return batch

    first = send(1)
    where = first["x"].data_ptr()
    del first
    lent.hand_back()
    second = send(2)
    assert second["x"].data_ptr() == where  # the same buffer, filled again
    row = second["x"][3]
    del second
    lent.hand_back()  # the row still refers to it: not handed back
    third = send(3)
    assert third["x"].data_ptr() != where and torch.equal(row, torch.full((1000,), 2))
    assert third["n"] == 2 and torch.equal(third["x"], torch.full((4, 1000), 3))
