"""A job's time account from its run folder's records: a start killed after its
checkpoint and requeued, a resumed start that finished, a hang; the figures are the
arithmetic of the records, to the second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stoker.job_time import CAUSES, job_time


def write_start(run_dir: Path, restart: int, *lines: dict[str, object]) -> None:
    folder = run_dir / "accounting"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"r{restart}.jsonl", "a") as out:
        for line in lines:
            out.write(json.dumps(line) + "\n")


def window(at: float, step: int, step_s: float, data_s: float, checkpoint_s: float = 0.0,
           sample_s: float = 0.0, steps: int = 10) -> dict[str, object]:  # fmt: skip
    return {"kind": "window", "at": at, "step": step, "steps": steps, "step_s": step_s,
            "data_s": data_s, "checkpoint_s": checkpoint_s, "sample_s": sample_s}  # fmt: skip


def requeued_job(run_dir: Path) -> None:
    """Start 0 (2 ranks): 10 s of start-up, steps 1-20, checkpoint at 10, killed without
    an end line; requeued, start 1 resumes from step 10 and finishes step 20."""
    (run_dir / "attempts").write_text(
        "1000 restart=0 job=7 nodes=n[1-2]\n1100 restart=1 job=7 nodes=n[2-3]\n"
    )
    write_start(run_dir, 0,
                {"kind": "start", "at": 1009, "restart": 0, "start_step": 0, "ranks": 2},
                {"kind": "first_step", "at": 1010},
                window(1030, 10, step_s=20, data_s=2, checkpoint_s=1),
                window(1050, 20, step_s=20, data_s=2))  # fmt: skip
    write_start(run_dir, 1,
                {"kind": "start", "at": 1104, "restart": 1, "start_step": 10, "ranks": 2},
                {"kind": "first_step", "at": 1105},
                window(1125, 20, step_s=20, data_s=1, checkpoint_s=2),
                {"kind": "end", "at": 1127, "step": 20, "status": "FINISHED"})  # fmt: skip


def test_a_requeued_job_accounts_for_every_second(tmp_path: Path) -> None:
    requeued_job(tmp_path)
    account = job_time(tmp_path)
    first, second = account.starts
    assert (first.allocated, second.allocated) == (50.0, 27.0)  # killed: its last line
    assert first.productive == 17.0 and second.productive == 17.0
    none = dict.fromkeys(CAUSES, 0.0)
    assert first.lost == {**none, "startup": 10.0, "data_wait": 2.0, "checkpoint": 1.0,
                          "redone": 20.0}  # fmt: skip
    # The requeued start's start-up is the requeue's cost.
    assert second.lost == {**none, "restart_requeue": 5.0, "data_wait": 1.0, "checkpoint": 2.0,
                           "after_last_step": 2.0}  # fmt: skip
    assert (first.status, second.status) == (None, "FINISHED")
    assert account.queue_after_requeue == 50.0
    assert account.allocated_rank_s == 2 * 77.0
    assert account.goodput == pytest.approx(34 / 77)
    lost = account.lost_rank_s()
    assert account.productive_rank_s + sum(lost.values()) == account.allocated_rank_s
    assert list(account.to_dict()["lost_rank_hours"]) == list(CAUSES)
    metrics = account.metrics()
    assert metrics["system/goodput/goodput"] == pytest.approx(34 / 77)
    assert metrics["system/goodput/lost_redone_rank_hours"] == pytest.approx(2 * 20 / 3600)
    assert (
        metrics["system/goodput/queue_after_requeue_s"] == 50.0
        and metrics["system/goodput/starts"] == 2
    )


def test_a_hang_and_the_tail_of_a_failed_last_start(tmp_path: Path) -> None:
    """A start that hung: the stall until the watchdog's detection is `hang`; steps past
    the last checkpoint of a job that failed for good are lost with its tail."""
    (tmp_path / "attempts").write_text("2000 restart=0 job=8 nodes=n1\n")
    write_start(tmp_path, 0,
                {"kind": "start", "at": 2001, "restart": 0, "start_step": 0, "ranks": 1},
                {"kind": "first_step", "at": 2002},
                window(2012, 10, step_s=10, data_s=0),
                window(2022, 20, step_s=10, data_s=0),
                {"kind": "end", "at": 2060, "step": 20, "status": "FAILED"})  # fmt: skip
    hang = tmp_path / "heartbeat" / "r0"
    hang.mkdir(parents=True)
    (hang / "hang.json").write_text(json.dumps({"stalled_s": 30.5, "rank": 0}))
    start = job_time(tmp_path, kept_through=10).starts[0]
    assert start.lost["hang"] == 30.5
    # 38 s from the last log step to the end: 30.5 hung, the rest and steps 11-20 lost.
    assert start.lost["after_last_step"] == pytest.approx(7.5 + 10.0)
    assert start.productive == 10.0 and start.lost["redone"] == 0.0


def test_a_start_that_never_stepped_and_a_line_cut_short(tmp_path: Path) -> None:
    (tmp_path / "attempts").write_text(
        "3000 restart=0 job=9 nodes=n1\n3100 restart=1 job=9 nodes=n2\n"
    )
    write_start(tmp_path, 0, {"kind": "start", "at": 3050, "restart": 0, "start_step": 0,
                              "ranks": 4})  # fmt: skip
    with open(tmp_path / "accounting" / "r0.jsonl", "a") as out:
        out.write('{"kind": "first_st')  # killed mid-line
    account = job_time(tmp_path, ended_at=3200)
    never = account.starts[0]
    assert never.allocated == 50.0 and never.lost["startup"] == 50.0 and never.productive == 0
    # The last start wrote nothing at all: the job's end closes it, all of it start-up.
    # (a start after a requeue: the requeue's cost).
    assert account.starts[1].allocated == 100.0
    assert account.starts[1].lost["restart_requeue"] == 100.0


def test_slurm_allocations_bound_each_start(tmp_path: Path) -> None:
    """sacct's Start and End of each attempt: the prolog before the batch script's
    `attempts` line is start-up, the teardown after the last line is lost after the
    last step, and the queue is SLURM's gap between the attempts."""
    requeued_job(tmp_path)
    account = job_time(tmp_path, allocations={0: (995.0, 1060.0), 1: (1090.0, 1130.0)})
    first, second = account.starts
    assert (first.allocated, second.allocated) == (65.0, 40.0)
    assert first.lost["startup"] == 15.0 and second.lost["restart_requeue"] == 15.0
    assert first.lost["after_last_step"] == 10.0  # killed 10 s after its last line
    assert second.lost["after_last_step"] == 5.0  # 2 s to its end line, 3 s teardown
    assert account.queue_after_requeue == 30.0
    lost = account.lost_rank_s()
    assert account.productive_rank_s + sum(lost.values()) == account.allocated_rank_s


def test_a_restart_in_place_and_a_spare_node(tmp_path: Path) -> None:
    """job.spare_nodes=1: attempt 0 trains on n1, n2 with n3 spare, loses a rank after
    its checkpoint at step 10 and is given up at 1060; attempt 1 runs in place on n1, n3
    (no spare left) from step 10. The allocation is held throughout: no queue, the
    failed attempt's tail until the next began lost, the restart's start-up its own
    cause, and the spare's seconds charged in full (one node: as many ranks as one
    training node runs)."""
    (tmp_path / "attempts").write_text(
        "1000 restart=0 job=7 nodes=n1,n2 how=start spares=n3\n"
        "1060 restart=1 job=7 nodes=n1,n3 how=in-place\n"
    )
    write_start(tmp_path, 0,
                {"kind": "start", "at": 1009, "restart": 0, "start_step": 0, "ranks": 2},
                {"kind": "first_step", "at": 1010},
                window(1030, 10, step_s=20, data_s=2, checkpoint_s=1),
                window(1050, 20, step_s=20, data_s=2))  # fmt: skip
    write_start(tmp_path, 1,
                {"kind": "start", "at": 1064, "restart": 1, "start_step": 10, "ranks": 2},
                {"kind": "first_step", "at": 1066},
                window(1086, 20, step_s=20, data_s=1),
                {"kind": "end", "at": 1086, "step": 20, "status": "FINISHED"})  # fmt: skip
    account = job_time(tmp_path, allocations={0: (995.0, None), 1: (None, 1090.0)})
    first, second = account.starts
    assert (first.how, second.how) == ("start", "in-place")
    assert (first.allocated, second.allocated) == (65.0, 30.0)  # 995-1060, 1060-1090
    assert first.spare_ranks == 1.0 and second.spare_ranks == 0.0
    assert first.lost["spare_nodes"] == 65.0 / 2  # per rank: 65 spare-rank-seconds
    assert first.lost["after_last_step"] == 10.0  # from its last line to the next attempt
    assert first.lost["startup"] == 15.0 and second.lost["restart_in_place"] == 6.0
    assert second.lost["startup"] == 0.0 and account.queue_after_requeue == 0.0
    assert account.allocated_rank_s == 65.0 * 3 + 30.0 * 2
    lost = account.lost_rank_s()
    assert lost["spare_nodes"] == 65.0 and lost["restart_in_place"] == 12.0
    assert account.productive_rank_s + sum(lost.values()) == pytest.approx(account.allocated_rank_s)


def test_throughput_mfu_and_straggling_hosts(tmp_path: Path) -> None:
    (tmp_path / "attempts").write_text("4000 restart=0 job=10 nodes=n[1-2]\n")
    slow = {"rank": 1, "host": "n2", "ratio": 1.6}
    write_start(tmp_path, 0,
                {"kind": "start", "at": 4001, "restart": 0, "start_step": 0, "ranks": 2},
                {"kind": "first_step", "at": 4002},
                {**window(4012, 10, 10, 0), "mfu": 0.30, "samples_per_s": 8.0},
                {**window(4022, 20, 10, 0), "mfu": 0.20, "samples_per_s": 6.0,
                 "straggler": slow},
                {**window(4032, 30, 10, 0), "mfu": 0.25, "samples_per_s": 7.0,
                 "straggler": slow})  # fmt: skip
    account = job_time(tmp_path)
    assert account.mfu == 0.25 and account.samples_per_s == 7.0
    assert account.stragglers() == {"n2": 2}
    assert account.to_dict()["stragglers"] == {"n2": 2}


def test_a_failed_job_keeps_its_work_through_its_newest_commit(tmp_path: Path) -> None:
    """Ended for good (failed, cancelled): steps after the newest committed checkpoint
    are lost with the tail; the commit lines of the account say which one that is."""
    (tmp_path / "attempts").write_text("5000 restart=0 job=11 nodes=n1\n")
    write_start(tmp_path, 0,
                {"kind": "start", "at": 5001, "restart": 0, "start_step": 0, "ranks": 1},
                {"kind": "first_step", "at": 5002},
                window(5012, 10, step_s=10, data_s=0),
                {"kind": "commit", "at": 5013, "step": 10},
                window(5022, 20, step_s=10, data_s=0),
                window(5032, 30, step_s=10, data_s=0))  # fmt: skip
    start = job_time(tmp_path, failed=True, ended_at=5040).starts[0]
    assert start.productive == 10.0
    assert start.lost["after_last_step"] == 20.0 + 8.0
    # Not failed: every step it ran is kept.
    assert job_time(tmp_path, ended_at=5040).starts[0].productive == 30.0
