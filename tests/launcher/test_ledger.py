"""The ledger under concurrent CLI calls: no lost record, no 'database is locked'."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from stoker.launcher.jobs.ledger import JobRecord, Ledger


def _writer(path: str, worker: int, count: int) -> None:
    ledger = Ledger(Path(path))
    for i in range(count):
        job_id = f"{worker * 1000 + i}"
        ledger.add(JobRecord(job_id, "slurm", "c", f"job{i}", f"/runs/{job_id}", "h", "default"))
        ledger.update_many({job_id: (1, None)})
        ledger.list(active_only=True, limit=5)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records = Ledger(path).list()
    assert len(records) == 160
    assert all(r.restarts == 1 for r in records)


def test_restarts_never_go_down_and_final_state_can_be_reopened(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.add(JobRecord("7", "slurm", "c", "n", "/r", "h", "default"))
    ledger.update("7", restarts=2, final_state="COMPLETED")
    ledger.update("7", restarts=1)
    record = ledger.require("7")
    assert record.restarts == 2 and record.final_state == "COMPLETED"
    assert ledger.list(active_only=True) == []
    ledger.reopen("7")
    assert [r.job_id for r in ledger.list(active_only=True)] == ["7"]


def test_local_ids_are_reserved_once(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite")
    assert [ledger.reserve_local_id() for _ in range(3)] == ["local-1", "local-2", "local-3"]


def test_the_config_digest_keeps_its_column_name(tmp_path: Path) -> None:
    """`JobRecord.config_digest` is stored in the column `config_hash`, as ledgers
    written before the field's rename have it."""
    import sqlite3

    path = tmp_path / "l.sqlite"
    Ledger(path).add(JobRecord("7", "slurm", "c", "n", "/r", "ab" * 32, "default"))
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT config_hash FROM jobs").fetchone() == ("ab" * 32,)
    assert Ledger(path).require("7").config_digest == "ab" * 32


def test_extra_values_are_set_by_path_and_a_requeue_forgets_how_it_ended(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite")
    ledger.add(JobRecord("8", "slurm", "c", "n", "/r", "h", "default",
                         extra={"child_run_ids": ["a", "b"]}))  # fmt: skip
    ledger.set_extra(
        {"8": {("reasons", "8_1"): "rank 2: no data set", ("mlflow_ended", "a"): True}}
    )
    ledger.set_extra({"8": {("reasons", "8_0"): "exit 3"}})
    extra = ledger.require("8").extra
    assert extra["reasons"] == {"8_0": "exit 3", "8_1": "rank 2: no data set"}  # "8_1": a key
    assert extra["mlflow_ended"] == {"a": True} and extra["child_run_ids"] == ["a", "b"]
    ledger.reopen("8")  # requeued: it runs again, and will end its own way
    assert ledger.require("8").extra == {"child_run_ids": ["a", "b"]}
    with pytest.raises(ValueError, match="cannot be a key"):
        ledger.set_extra({"8": {("reasons", 'x"y'): "no"}})
