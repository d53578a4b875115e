"""A rank killed with SIGKILL leaves no loader process behind: the fork server, its
workers and the resource tracker end with it (stoker/data/stream/parent_death.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.process_table import marked_processes, wait_none_marked

RANK = """\
import sys, time
from stoker.data.stream.loader import StreamingLoader
loader = StreamingLoader(sys.argv[1], batch_size=2, num_workers=2, seed=1, fps=8,
                         size=(32, 32), clip_seconds=1.0, sample_rate=8000,
                         start_method=sys.argv[2])
batches = loader.batches()
next(batches)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_a_sigkilled_rank_leaves_no_loader_process(
    synthetic_av_set: Callable[..., Path], start_method: str
) -> None:
    url = str(synthetic_av_set(clips=8, size=(32, 32), sample_rate=8000))
    marker = f"STOKER_TEST_MARK={uuid.uuid4().hex}"
    name, value = marker.split("=")
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK, url, start_method],
        env={**os.environ, name: value},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None
        assert rank.stdout.readline().strip() == "ready"
        helpers = set(marked_processes(marker)) - {rank.pid}
        # Two workers, plus the fork server and the resource tracker when forkserver.
        assert len(helpers) >= 2, marked_processes(marker)
        rank.send_signal(signal.SIGKILL)
        rank.wait(timeout=60)
        wait_none_marked(marker)
    finally:
        rank.kill()
        rank.wait()
        for pid in marked_processes(marker):
            os.kill(pid, signal.SIGKILL)
