"""The streaming loader over a mixture of two data sets with buckets, on real encoded
media: the same global batches on any number of ranks and workers, each batch one
bucket's shape, exact elastic resume, and the checks a resumed state must pass."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from stoker.data.sets.buckets import Bucket
from stoker.data.stream.loader import MixSource, StreamingLoader
from stoker.errors import StokerError

BUCKETS = (Bucket((32, 32), 1.0, 4), Bucket((32, 64), 1.0, 2), Bucket((32, 32), 2.0, 2))
AV = {"fps": 4, "clip_seconds": 1.0, "sample_rate": 8000, "seed": 3}


@pytest.fixture(scope="module")
def sets(synthetic_av_set: Callable[..., Path]) -> dict[str, str]:
    return {
        # Square clips of 2 s (buckets 0 and 2) and wide ones of 1 s (bucket 1).
        "square": str(synthetic_av_set(clips=12, size=(32, 32), seconds=2.0, fps=4,
                                       sample_rate=8000, samples_per_shard=5)),
        "wide": str(synthetic_av_set(clips=8, size=(32, 64), seconds=1.0, fps=4,
                                     sample_rate=8000, samples_per_shard=3)),
    }  # fmt: skip


def mixture(sets: dict[str, str], **kw: Any) -> StreamingLoader:
    sources = [MixSource("square", sets["square"], 2.0), MixSource("wide", sets["wide"], 1.0)]
    args: dict[str, Any] = {"buckets": BUCKETS, "num_workers": 0, "mixing": "random", **AV}
    args.update(kw)
    return StreamingLoader(sources, **args)


def global_batches(loaders: list[StreamingLoader], n: int) -> list[dict[str, Any]]:
    """n global batches: each rank's batch, rows concatenated in rank order."""
    iters = [ld.batches() for ld in loaders]
    out = []
    for _ in range(n):
        parts = [next(it) for it in iters]
        assert len({p.get("bucket") for p in parts}) == 1, "every rank in the same bucket"
        out.append({
            "bucket": parts[0].get("bucket"),
            "position": torch.cat([p["position"] for p in parts]).tolist(),
            "key": [k for p in parts for k in p["key"]],
            "source": [s for p in parts for s in p["source"]],
            "video": {tuple(p["video"].shape[1:]) for p in parts},
        })  # fmt: skip
    return out


def test_same_batches_on_any_ranks_and_workers_and_each_is_one_buckets_shape(
    sets: dict[str, str],
) -> None:
    one = global_batches([mixture(sets)], 12)
    two = global_batches([mixture(sets, rank=r, world_size=2, num_workers=2) for r in (0, 1)], 12)
    assert one == two
    names = {b.name: b for b in BUCKETS}
    for batch in one:
        bucket = names[batch["bucket"]]
        assert len(batch["position"]) == bucket.batch_size
        frames = round(bucket.clip_seconds * AV["fps"])
        assert set(batch["video"]) == {(frames, 3, *bucket.resolution)}
        wide = bucket.resolution == (32, 64)
        assert set(batch["source"]) == ({"wide"} if wide else {"square"})
    # Wide 1 s clips fill 32x64x1s; square 2 s ones the longest bucket they fit, 32x32x2s.
    assert {b["bucket"] for b in one} == {"32x64x1s", "32x32x2s"}
    positions = [p for b in one for p in b["position"]]
    assert len(positions) == len(set(positions)), "no sample slot twice"


def test_resume_on_other_ranks_continues_exactly(sets: dict[str, str]) -> None:
    straight = global_batches([mixture(sets)], 10)
    first = mixture(sets, rank=0, world_size=2)
    second = mixture(sets, rank=1, world_size=2)
    before = global_batches([first, second], 4)
    state = first.state_dict()
    assert state == second.state_dict(), "every rank holds the same state"
    assert state["version"] == 2 and [s["name"] for s in state["sources"]] == ["square", "wide"]
    resumed = mixture(sets, num_workers=2)
    resumed.load_state_dict(state)
    after = global_batches([resumed], 6)
    assert before + after == straight
    taken = resumed.progress()
    assert set(taken) == {"square", "wide"}
    assert sum(n for n, _ in taken.values()) >= sum(len(b["position"]) for b in straight)


def test_exact_mixing_gives_each_source_its_share(sets: dict[str, str]) -> None:
    loader = mixture(sets, buckets=(), batch_size=6, mixing="exact", size=(32, 32))
    for batch in global_batches([loader], 4):
        assert Counter(batch["source"]) == {"square": 4, "wide": 2}


def test_a_changed_data_set_stops_the_resume_unless_allowed(
    sets: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    loader = mixture(sets)
    global_batches([loader], 2)
    state = loader.state_dict()
    state["sources"][1]["digest"] = "0123456789abcdef"
    with pytest.raises(StokerError, match=r"data set 'wide' changed.*0123456789abcdef") as err:
        mixture(sets).load_state_dict(state)
    assert "data.allow_changed_data=true" in (err.value.fix or "")
    allowed = mixture(sets, allow_changed_data=True)
    with caplog.at_level(logging.WARNING, logger="stoker.data"):
        allowed.load_state_dict(state)
    assert "resuming anyway" in caplog.text
    assert allowed.position == loader.position


def test_a_state_with_other_buckets_or_data_sets_is_refused(sets: dict[str, str]) -> None:
    loader = mixture(sets)
    global_batches([loader], 1)
    state = loader.state_dict()
    with pytest.raises(StokerError, match="saved with buckets"):
        mixture(sets, buckets=BUCKETS[:2]).load_state_dict(state)
    with pytest.raises(StokerError, match="saved with the data sets"):
        StreamingLoader(
            [MixSource("square", sets["square"])], buckets=BUCKETS, num_workers=0, **AV
        ).load_state_dict(state)


def test_a_bucket_batch_that_does_not_split_over_the_ranks_is_refused(
    sets: dict[str, str],
) -> None:
    with pytest.raises(StokerError, match=r"bucket 0 \(32x32x1s\).*batch of 4.*3 ranks"):
        mixture(sets, world_size=3)
