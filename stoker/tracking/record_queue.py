"""The queue between the training thread, which logs, and the writer thread, which sends.

`put` and `take` hold the lock for O(1) work only: a writer preempted while holding
it would stall the trainer. The writer is woken when `max_batch` points wait, or at
once for a record without points (params, tags, artifacts, models).
"""

from __future__ import annotations

import threading
from collections import deque

from stoker.tracking.spool import Record
from stoker.tracking.stderr import warn


class RecordQueue:
    """Records of run `run_id`, waiting for the writer."""

    def __init__(self, run_id: str, max_batch: int) -> None:
        self.run_id = run_id
        self.max_batch = max_batch
        self.wake = threading.Event()
        """Set when the writer should look now rather than at its next flush."""
        self.waiting = 0
        """Metric points queued."""
        self._lock = threading.Lock()
        self._records: deque[Record] = deque()
        self._closed = False
        self._warned_after_close = False

    def put(self, record: Record, points: int) -> None:
        """Queue `record` (holding `points` metric points); after `close()` it is
        dropped, said once on stderr."""
        with self._lock:
            if self._closed:
                if not self._warned_after_close:
                    self._warned_after_close = True
                    warn(f"RunLogger for run {self.run_id} got data after close(): dropped")
                return
            self._records.append(record)
            self.waiting += points
            wake = self.waiting >= self.max_batch or points == 0
        if wake:
            self.wake.set()

    def take(self) -> tuple[deque[Record], int]:
        """Everything queued, and its metric points; the queue is then empty."""
        with self._lock:
            records, self._records = self._records, deque()
            points, self.waiting = self.waiting, 0
        return records, points

    def close(self) -> bool:
        """Take no more records; False if it was closed already."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            return True
