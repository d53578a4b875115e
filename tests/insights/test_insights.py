"""`stoker insights` over accounts made from real run-folder records: a job's hours
by cause from its time account and sacct's attempt times, the nodes its failures
implicate, the sums by user, partition and experiment, and the three outputs (the
terminal and JSON, Prometheus' text format checked by promtool, the HTML report
checked in headless Chromium). The cluster's own mix of jobs: test_cluster_mix.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.errors import StokerError
from stoker.launcher.insights.report import parse_since, summarise
from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.jobs.targets import Target
from stoker.launcher.slurm.query import AcctRow
from stoker.launcher.watch.job_account import (
    HANG,
    KILLED_TASK,
    STRAGGLER,
    JobAccount,
    NodeBlame,
    make_account,
)
from tests.browser import headless_page
from tests.clirun import stoker_text
from tests.test_job_time import window, write_start

SLOW = {"rank": 1, "host": "n2", "ratio": 1.7}


def _row(job: str, state: str, started: float, ended: float, nodes: str) -> AcctRow:
    return AcctRow(job, state, 0, None, int(ended - started), 1, nodes, None, started - 5,
                   started, ended, "gpu", "alice")  # fmt: skip


def requeued_gpu_job(run: Path) -> list[AcctRow]:
    """8 GPUs on one node, 8 ranks. Start 0 on n2: a task killed after step 20 (its
    checkpoint at 10), the batch script left n2 out; start 1 on n3 resumed from 10 and
    finished. n2 held the straggler in two windows of start 0."""
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(
        "job:\n  gpus_per_node: 8\n  partition: gpu\ntracking:\n  experiment: video-dit\n"
    )
    (run / "attempts").write_text("1000 restart=0 job=7 nodes=n2\n1100 restart=1 job=7 nodes=n3\n")
    (run / "failures").write_text("1052 restart=0 exit=137 node=n2 kind=n2: task 1: Killed\n")
    write_start(run, 0,
                {"kind": "start", "at": 1009, "restart": 0, "start_step": 0, "ranks": 8},
                {"kind": "first_step", "at": 1010},
                {**window(1030, 10, step_s=20, data_s=2, checkpoint_s=1), "straggler": SLOW,
                 "mfu": 0.4, "samples_per_s": 2.0},
                {"kind": "commit", "at": 1031, "step": 10},
                {**window(1050, 20, step_s=20, data_s=2), "straggler": SLOW, "mfu": 0.4,
                 "samples_per_s": 2.0})  # fmt: skip
    write_start(run, 1,
                {"kind": "start", "at": 1104, "restart": 1, "start_step": 10, "ranks": 8},
                {"kind": "first_step", "at": 1105},
                {**window(1125, 20, step_s=20, data_s=1, checkpoint_s=2), "mfu": 0.5,
                 "samples_per_s": 2.5},
                {"kind": "end", "at": 1127, "step": 20, "status": "FINISHED"})  # fmt: skip
    return [_row("7", "NODE_FAIL", 995, 1055, "n2"), _row("7", "COMPLETED", 1098, 1130, "n3")]


def _record(run: Path, job_id: str, *, backend: str = "slurm", user: str = "alice",
            state: str | None = None) -> JobRecord:  # fmt: skip
    return JobRecord(job_id=job_id, backend=backend, cluster="c", name=f"job{job_id}",
                     run_dir=str(run), config_digest="0", template="default",
                     submitted_at=time.time() - 3600, final_state=state,
                     extra={"user": user})  # fmt: skip


def test_an_allocation_holds_the_attempts_started_in_place(tmp_path: Path) -> None:
    """One allocation (one sacct row), two attempts: the killed task's node replaced in
    place by the spare. SLURM's Start bounds the first attempt, its End the second; the
    restart's start-up and the spare's seconds are their own causes."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("job:\n  gpus_per_node: 8\n  spare_nodes: 1\n")
    (run / "attempts").write_text("1000 restart=0 job=8 nodes=n1 how=start spares=n2\n"
                                  "1060 restart=1 job=8 nodes=n2 how=in-place\n")  # fmt: skip
    (run / "failures").write_text(
        "1058 restart=0 exit=137 node=n1 how=in-place kind=n1: task 3: Killed\n"
    )
    write_start(run, 0,
                {"kind": "start", "at": 1009, "restart": 0, "start_step": 0, "ranks": 8},
                {"kind": "first_step", "at": 1010},
                window(1050, 20, step_s=40, data_s=0))  # fmt: skip
    write_start(run, 1,
                {"kind": "start", "at": 1064, "restart": 1, "start_step": 20, "ranks": 8},
                {"kind": "first_step", "at": 1070},
                window(1090, 40, step_s=20, data_s=0),
                {"kind": "end", "at": 1090, "step": 40, "status": "FINISHED"})  # fmt: skip
    rows = [_row("8", "COMPLETED", 995, 1095, "n[1-2]")]
    account = make_account(Target(_record(run, "8")), "COMPLETED", rows, None)
    # 995-1060 with a spare node (8 ranks' worth), 1060-1095 without.
    assert account.allocated_h == pytest.approx((65 * 16 + 35 * 8) / 3600)
    assert account.lost_h["spare_nodes"] == pytest.approx(65 * 8 / 3600)
    assert account.lost_h["restart_in_place"] == pytest.approx(10 * 8 / 3600)
    assert account.lost_h["startup"] == pytest.approx(15 * 8 / 3600)
    assert account.queue_after_requeue_h == 0.0 and account.starts == 2
    assert [(n.node, n.kind) for n in account.nodes] == [("n1", "killed task")]


def test_a_jobs_account_joins_its_run_folder_and_sacct(tmp_path: Path) -> None:
    rows = requeued_gpu_job(tmp_path / "run")
    account = make_account(Target(_record(tmp_path / "run", "7")), "COMPLETED", rows, None)
    # SLURM's allocations bound the starts: 60 s and 32 s, 8 GPUs each.
    assert account.resource == "GPU" and account.per_rank == 1.0
    assert account.allocated_h == pytest.approx(8 * (60 + 32) / 3600)
    assert account.productive_h == pytest.approx(8 * (17 + 17) / 3600)
    assert account.lost_h["redone"] == pytest.approx(8 * 20 / 3600)  # steps 11-20 of start 0
    assert account.lost_h["startup"] == pytest.approx(8 * 15 / 3600)
    assert account.lost_h["restart_requeue"] == pytest.approx(8 * 7 / 3600)  # the requeued start
    assert account.queue_after_requeue_h == pytest.approx(43 / 3600)
    assert sum(account.lost_h.values()) + account.productive_h == pytest.approx(account.allocated_h)
    assert (account.partition, account.user, account.experiment) == ("gpu", "alice", "video-dit")
    # n2: the task killed there (the script left it out), the NODE_FAIL of its only
    # node, and two windows as the straggler.
    assert sorted((b.node, b.kind) for b in account.nodes) == [
        ("n2", KILLED_TASK), ("n2", "node failure"), ("n2", STRAGGLER)]  # fmt: skip
    assert account.mfu == 0.4 and account.samples_per_s == 2.0
    assert account.cause is None and account.goodput == pytest.approx(34 / 92)
    # Kept in the ledger as JSON and read back the same.
    assert JobAccount.from_json(json.loads(json.dumps(account.to_json()))) == account
    assert JobAccount.from_json({**account.to_json(), "format": 0}) is None


def test_a_command_that_kept_no_account_is_left_out_of_goodput(tmp_path: Path) -> None:
    """A user's own command (not the stoker runtime) writes no time account: its hours
    count as allocated, not as lost, and goodput is that of the jobs that kept one."""
    run = tmp_path / "own"
    run.mkdir()
    (run / "attempts").write_text("1000 restart=0 job=9 nodes=n1\n")
    record = _record(run, "9")
    record.extra["command"] = ["python", "my_train.py"]
    rows = [_row("9", "COMPLETED", 1000, 1360, "n1")]
    own = make_account(Target(record), "COMPLETED", rows, None)
    assert not own.accounted and own.goodput is None and own.allocated_h == pytest.approx(0.1)
    assert own.productive_h == 0 and sum(own.lost_h.values()) == 0
    record.extra["command"] = [sys.executable, "-m", "stoker.runtime.train"]
    runtime = make_account(Target(record), "COMPLETED", rows, None)
    assert runtime.accounted and runtime.lost_h["startup"] == pytest.approx(0.1)  # it never began
    report = summarise([own, _account("1", hours=1.0, productive=0.5)])
    gpu, cpu = report.totals["GPU"], report.totals["CPU"]
    assert gpu.goodput == 0.5 and cpu.goodput is None and cpu.unaccounted_h == pytest.approx(0.1)


def test_status_asks_sacct_once_and_leaves_a_job_it_has_no_rows_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`stoker status` makes the accounts of the jobs it sees end from its one sacct
    answer: a job slurmdbd has not recorded yet is left for `insights`, not accounted
    without its allocation times and not asked about in a second sacct call."""
    from stoker.launcher.watch import job_end

    asked: list[list[str]] = []
    monkeypatch.setattr(job_end, "query_accounting", lambda ids: asked.append(ids) or {})
    ledger = Ledger(tmp_path / "ledger.sqlite")
    rows = requeued_gpu_job(tmp_path / "run7")
    (tmp_path / "run8").mkdir()
    seen, unseen = _record(tmp_path / "run7", "7"), _record(tmp_path / "run8", "8")
    ledger.add(seen)
    ledger.add(unseen)
    ended = [job_end.Ended(Target(r), "COMPLETED") for r in (seen, unseen)]
    job_end.keep_accounts(ledger, ended, {"7": rows}, asked=True)
    kept = {r.job_id: r.extra.get("accounts", {}) for r in ledger.list()}
    assert asked == [] and list(kept["7"]) == ["7"] and kept["8"] == {}
    # sacct failed (None): the run folder's times stand, still with no second call.
    job_end.keep_accounts(ledger, [ended[1]], None, asked=True)
    again = ledger.get("8")
    assert again is not None and asked == [] and list(again.extra["accounts"]) == ["8"]
    # A caller without an answer (insights, why) asks for the ones it lacks, once.
    ledger.reopen("8")
    reopened = ledger.get("8")
    assert reopened is not None and "accounts" not in reopened.extra
    job_end.keep_accounts(ledger, [job_end.Ended(Target(reopened), "FAILED")])
    assert asked == [["8"]]


def _account(job: str, *, state: str = "COMPLETED", cause: str | None = None, user: str = "a",
             nodes: list[NodeBlame] | None = None, mfu: float | None = None,
             hours: float = 1.0, productive: float = 0.5) -> JobAccount:  # fmt: skip
    lost = dict.fromkeys(("startup", "data_wait", "checkpoint", "sampling", "redone", "hang",
                          "after_last_step", "other"), 0.0)  # fmt: skip
    lost["hang" if cause == "hung" else "startup"] = hours - productive
    return JobAccount(job, f"n{job}", "exp", user, "gpu", state, cause, 0.0, 86400.0 * 3,
                      "GPU", 1.0, hours, productive, lost, 0.0, 1, mfu, 1.0,
                      nodes or [])  # fmt: skip


def test_sums_failure_classes_and_nodes_in_two_incidents() -> None:
    accounts = [
        _account("1", mfu=0.2, user="a"),
        _account("2", mfu=0.4, user="b"),
        _account("3", state="FAILED", cause="hung", nodes=[NodeBlame("n7", HANG, 0)]),
        _account("4", state="FAILED", cause="hung", nodes=[NodeBlame("n7", KILLED_TASK, 0)]),
        _account("5", state="TIMEOUT", cause="time-limit", nodes=[NodeBlame("n8", HANG, 0)]),
        # Stopped on purpose (`stoker cancel`): its hours count, but it is no failure.
        _account("6", state="CANCELLED", cause="cancelled"),
    ]
    report = summarise(accounts, until=86400.0 * 4)
    gpu = report.totals["GPU"]
    assert (gpu.jobs, gpu.allocated_h, gpu.productive_h, gpu.failed_jobs) == (6, 6.0, 3.0, 3)
    assert gpu.failed_h == 3.0
    assert gpu.goodput == 0.5 and gpu.lost_h["hang"] == 1.0
    assert report.failures == {"hung": 2, "time-limit": 1}
    assert [n.node for n in report.nodes] == ["n7"]  # n8: one incident only
    assert report.nodes[0].kinds == {HANG: 1, KILLED_TASK: 1} and report.nodes[0].jobs == ["3", "4"]
    users, operators = report.nodes[0].advice()
    assert "exclude" in users and operators.startswith("scontrol update NodeName=n7 State=DRAIN")
    assert report.by_user[("a", "GPU")].jobs == 5 and report.by_user[("b", "GPU")].jobs == 1
    assert (report.mfu.count, report.mfu.p50) == (2, pytest.approx(0.3))
    assert report.mfu.histogram[2] == 1 and report.mfu.histogram[4] == 1


def test_the_html_escapes_what_the_ledger_holds() -> None:
    from stoker.launcher.insights.html import render

    hostile = '<img src=x onerror="alert(1)">'
    nodes = [NodeBlame(hostile, HANG, 0), NodeBlame(hostile, HANG, 1)]
    page = render(summarise([_account("1", state="FAILED", cause=hostile, nodes=nodes)]))
    assert hostile not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page
    assert "<script" not in page and "http" not in page  # nothing fetched, nothing run


@pytest.mark.parametrize(("text", "seconds"), [("7d", 604800), ("12h", 43200), ("90s", 90),
                                                ("2w", 1209600), ("1.5h", 5400)])  # fmt: skip
def test_since_durations(text: str, seconds: float) -> None:
    assert parse_since(text) == seconds


def test_a_bad_since_names_the_value_and_the_forms() -> None:
    with pytest.raises(StokerError, match="'seven days'") as caught:
        parse_since("seven days")
    assert "7d" in (caught.value.fix or "")


@pytest.fixture
def ledger_of_jobs(tmp_path: Path) -> Ledger:
    """Local jobs in the ledger (no SLURM to ask): one requeued that completed, one of
    another user's, one that ran on a node it implicates a second time."""
    ledger = Ledger()
    requeued_gpu_job(tmp_path / "a")
    ledger.add(_record(tmp_path / "a", "local-1", backend="local", state="COMPLETED"))
    requeued_gpu_job(tmp_path / "b")
    ledger.add(_record(tmp_path / "b", "local-2", backend="local", user="bob", state="FAILED"))
    return ledger


def test_cli_terminal_json_prometheus_and_html(
    ledger_of_jobs: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOGNAME", "alice")  # getpass.getuser(): whose jobs are "mine"
    text = stoker_text("insights", "--since", "all").stdout
    assert "Lost hours by cause" in text and "redone" in text
    mine = json.loads(stoker_text("insights", "--since", "all", "--json", "--per-job").stdout)
    assert [j["job_id"] for j in mine["jobs"]] == ["local-1"]  # bob's is not mine
    assert mine["totals"]["GPU"]["jobs"] == 1 and mine["by_partition"][0]["partition"] == "local"
    prom, html = tmp_path / "insights.prom", tmp_path / "report.html"
    outputs = ("--prometheus", str(prom), "--html", str(html))
    everyone = json.loads(
        stoker_text("insights", "--since", "all", "--all-users", "--json", *outputs).stdout
    )
    assert "jobs" not in everyone and everyone["job_count"] == 2
    assert everyone["totals"]["GPU"]["jobs"] == 2 and everyone["failures"][0]["jobs"] == 1
    # n2 was implicated in both jobs (killed task, straggler): named, with the fix.
    assert everyone["nodes"][0]["node"] == "n2" and everyone["nodes"][0]["incidents"] == 4
    assert "n2" in prom.read_text()
    check_with_promtool(prom)
    check_in_browser(html, goodput=everyone["totals"]["GPU"]["goodput"])


def check_with_promtool(path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "no promtool: `python tests/promtool.py install` (`make test` runs it)"
    result = subprocess.run([promtool, "check", "metrics"], input=path.read_text(),
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert not result.stdout.strip() and not result.stderr.strip(), result.stdout + result.stderr


def check_in_browser(path: Path, *, goodput: float) -> None:
    """It opens from the file alone (every request is refused), with no console error,
    and its charts are drawn: bars of non-zero size in each."""
    with headless_page() as page:
        errors: list[str] = []
        requests: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.route("**/*", lambda route: (requests.append(route.request.url),
                                          route.continue_() if route.request.url.startswith("file:")
                                          else route.abort()))  # fmt: skip
        page.goto(path.as_uri())
        assert errors == [] and all(url.startswith("file:") for url in requests), (errors, requests)
        charts = page.eval_on_selector_all(
            "svg[data-chart]",
            "els => els.map(s => [s.dataset.chart, [...s.querySelectorAll('rect')]"
            ".filter(r => r.getBBox().width > 0 && r.getBBox().height > 0).length])",
        )
        drawn = dict(charts)
        for name in ("hours by day", "lost GPU-hours by cause", "failures by class",
                     "failures by node", "MFU histogram"):  # fmt: skip
            assert drawn.get(name, 0) > 0, f"chart {name!r} is not drawn: {drawn}"
        shown = page.inner_text('[data-goodput="GPU"]')
        assert shown == f"{100 * goodput:.1f}%"
