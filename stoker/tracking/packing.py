"""Records into store calls: `log_batch` calls within MLflow's limits, one artifact upload,
logged model or set of dataset inputs each, in order, keeping every metric key's steps
increasing.

Exactly once, per metric key: a requeued job resumes from its last checkpoint and
computes some steps again, and a batch the store took just as the connection broke
is sent again from the spool. So the steps of a key must increase: a point whose
step is at or below the highest step already logged for its key (in the store, or
sent or spooled by this logger) is dropped. The store's highest step per key is
learned when the writer connects, from the run's latest metrics (MLflow keeps, per
key, the point with the highest step). The first value logged for a (key, step)
wins. A param already in the run is not sent again; one with another value is not
sent at all (MLflow refuses to change a param) and said once on stderr.

One `log_batch` of 500 points took 0.03 s, against 1.3 s as 500 `log_metric` calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from stoker.tracking.limits import (
    ENTITIES_PER_BATCH,
    MAX_BATCH_CHARS,
    PARAMS_PER_BATCH,
    TAGS_PER_BATCH,
)
from stoker.tracking.spool import Record
from stoker.tracking.stderr import warn


@dataclass
class Batch:
    """What one store call sends: a log_batch, one artifact upload, one logged model (a
    few calls), or dataset inputs (two calls)."""

    metrics: list[list[Any]] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifact: list[str | None] | None = None
    model: dict[str, Any] | None = None
    datasets: list[dict[str, Any]] | None = None
    chars: int = 0

    @property
    def points(self) -> int:
        return len(self.metrics)

    def empty(self) -> bool:
        return not (
            self.metrics or self.params or self.tags or self.artifact or self.model or self.datasets
        )

    def full(self, chars: int) -> bool:
        entities = len(self.metrics) + len(self.params) + len(self.tags)
        return entities >= ENTITIES_PER_BATCH or self.chars + chars > MAX_BATCH_CHARS

    def record(self, run_id: str) -> Record:
        """The batch as a record again, for the spool."""
        if self.artifact is not None:
            return {"run": run_id, "a": self.artifact}
        if self.model is not None:
            return {"run": run_id, "lm": self.model}
        if self.datasets is not None:
            return {"run": run_id, "ds": self.datasets}
        record: Record = {"run": run_id}
        if self.metrics:
            record["m"] = self.metrics
        if self.params:
            record["p"] = self.params
        if self.tags:
            record["t"] = self.tags
        return record


class Packer:
    """Packs the records of run `run_id` into batches of at most `batch_points` points,
    remembering the highest step per key and the params already sent."""

    def __init__(self, run_id: str, batch_points: int) -> None:
        self.run_id = run_id
        self.batch_points = batch_points
        self.maxes: dict[str, int] = {}
        """Per metric key, the highest step in the store or sent or spooled."""
        self.params: dict[str, str] = {}
        """The run's params, in the store or sent or spooled."""
        self.dropped = 0
        """Points dropped by the step rule."""
        self._warned_params: set[str] = set()

    def learn(self, maxes: dict[str, int], params: dict[str, str]) -> None:
        """What the store holds, read when the writer connects."""
        self.maxes, self.params = maxes, params

    def pack(self, records: Iterable[Record]) -> Iterator[Batch]:
        """Batches within MLflow's limits, in order, without the points at or below a
        step already logged for their key, nor params already in the run."""
        batch = Batch()
        for record in records:
            if "a" in record:
                if not batch.empty():
                    yield batch
                    batch = Batch()
                yield Batch(artifact=list(record["a"]))
                continue
            if "ds" in record:
                if not batch.empty():
                    yield batch
                    batch = Batch()
                yield Batch(datasets=[dict(entry) for entry in record["ds"]])
                continue
            taken: set[tuple[str, int]] = set()
            for key, value, stamp, step in record.get("m", ()):
                if step <= self.maxes.get(key, -1):
                    self.dropped += 1
                    continue
                self.maxes[key] = step
                taken.add((key, step))
                if len(batch.metrics) >= self.batch_points or batch.full(len(key) + 40):
                    yield batch
                    batch = Batch()
                batch.metrics.append([key, value, stamp, step])
                batch.chars += len(key) + 40
            for key, value in record.get("p", {}).items():
                known = self.params.get(key)
                if known == value:
                    continue
                if known is not None:
                    if key not in self._warned_params:
                        self._warned_params.add(key)
                        warn(
                            f"param {key!r} of run {self.run_id} is {known!r} in MLflow; the "
                            f"new value {value!r} is not logged (MLflow refuses to change a "
                            "param: log it as a metric or a tag, or start a new run)"
                        )
                    continue
                self.params[key] = value
                size = len(key) + len(value) + 20
                if len(batch.params) >= PARAMS_PER_BATCH or batch.full(size):
                    yield batch
                    batch = Batch()
                batch.params[key] = value
                batch.chars += size
            for key, value in record.get("t", {}).items():
                size = len(key) + len(value) + 20
                if key not in batch.tags and (
                    len(batch.tags) >= TAGS_PER_BATCH or batch.full(size)
                ):
                    yield batch
                    batch = Batch()
                batch.tags[key] = value
                batch.chars += size
            if "lm" in record:
                model = dict(record["lm"])
                if "m" in record:  # as logged: model metrics for the points the run takes
                    model["metrics"] = [
                        p for p in model.get("metrics", ()) if (p[0], p[3]) in taken
                    ]
                if not batch.empty():  # the run's points go first
                    yield batch
                    batch = Batch()
                yield Batch(model=model)
        if not batch.empty():
            yield batch
