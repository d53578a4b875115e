"""The records of the job's MLflow writer, and the spool file that keeps them through an outage.

Every call of a RunLogger becomes one record; the queue holds them in memory, and
when the store does not answer they are appended to the spool, one JSON object per
line (fsync'd), to be replayed in order once it answers again, or by the next
attempt's `start()` if the job is killed meanwhile:

    {"run": id, "m": [[key, value, ms, step], ...], "p": {key: value}, "t": {key: value}}
    {"run": id, "a": [local_path, artifact_path]}           one artifact upload
    {"run": id, "lm": {"name", "step", "params", "tags", "metrics", "dir"}}
                                                            one logged model
    {"run": id, "ds": [{"name", "digest", "source_type", "source", "schema",
                        "profile", "context"}, ...]}        dataset inputs

`log_checkpoint` queues "m" and "lm" in one record; the model metrics are then the
points the run takes, so that a point dropped by the step rule does not come back
as a model metric. "dir" is None for an external model, else the folder whose
files are uploaded. A record with none of these keys (a later version's kind) is
skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from stoker.errors import StokerError
from stoker.tracking import stderr

Record = dict[str, Any]
"""One queue entry, one spool line; the kinds are in the module docstring."""


def metric_points(records: Iterable[Record]) -> int:
    """The metric points the records hold."""
    return sum(len(record.get("m", ())) for record in records)


class Spool:
    """The spool file of one RunLogger: records of run `run_id`, appended and replayed."""

    def __init__(self, path: Path, run_id: str) -> None:
        self.path = path
        self.run_id = run_id
        self.points = 0
        """Metric points in the file, as far as this process knows."""

    def count(self) -> None:
        """Learn `points` from the file (what an earlier attempt left)."""
        self.points = metric_points(self.records(warn=False))

    def append(self, records: list[Record]) -> None:
        """Append `records`, fsync'd. A failed write is reported on stderr (its points
        are lost), never raised: training goes on."""
        if not records:
            return
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            stderr.warn(
                f"cannot write the MLflow spool {self.path}: {exc}; "
                f"{metric_points(records)} points are lost"
            )
            return
        self.points += metric_points(records)

    def records(self, *, warn: bool = True) -> Iterator[Record]:
        """The records of this run, in order; lines cut short by a kill and other runs'
        records are skipped (said on stderr when `warn`). StokerError if unreadable."""
        try:
            handle: IO[str] = self.path.open()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StokerError(
                f"cannot read the MLflow spool {self.path}: {exc}",
                fix="make it readable, or move it away (its points are then not sent)",
            ) from exc
        with handle:
            yield from self._parse(handle, warn=warn)

    def _parse(self, handle: IO[str], *, warn: bool) -> Iterator[Record]:
        bad_lines = 0
        other_runs: set[str] = set()
        for line in handle:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad_lines += 1  # a write cut short when the job was killed
                continue
            if not isinstance(record, dict):
                bad_lines += 1
            elif record.get("run") != self.run_id:
                other_runs.add(str(record.get("run")))
            else:
                yield record
        if warn and bad_lines:
            stderr.warn(f"{bad_lines} unreadable lines of {self.path} skipped")
        if warn and other_runs:
            stderr.warn(
                f"{self.path} holds data of other runs ({', '.join(sorted(other_runs))}); "
                f"not sent to run {self.run_id}, and dropped with the spool"
            )

    def clear(self) -> None:
        """Truncate the file (fsync'd): everything in it is in the store."""
        with self.path.open("r+") as handle:
            handle.truncate(0)
            os.fsync(handle.fileno())
        self.points = 0

    def has_data(self) -> bool:
        try:
            return self.path.stat().st_size > 0
        except OSError:
            return False
