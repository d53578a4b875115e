"""The squeue/sacct parsers, on outputs recorded from the test cluster (SLURM 22.05) with
the exact argv that stoker/launcher/slurm/query.py runs."""

from __future__ import annotations

import time

import pytest

from stoker.launcher.slurm.query import (
    SACCT_FORMAT,
    SQUEUE_FORMAT,
    count_hosts,
    expand_job_id,
    format_elapsed,
    normalise_state,
    parse_elapsed,
    parse_sacct,
    parse_show_config,
    parse_squeue,
)

# squeue --jobs=38,37 -h -r -t all -O <SQUEUE_FORMAT>: a failed job still within
# MinJobAge, a throttled array (%1) with task 0 running and three tasks pending.
SQUEUE_ARRAY_SPLIT = """\
38|FAILED|NonZeroExitCode|1|n1|0:00|0|
37_1|PENDING|JobArrayTaskLimit|1||0:00|0|
37_2|PENDING|JobArrayTaskLimit|1||0:00|0|
37_3|PENDING|JobArrayTaskLimit|1||0:00|0|
37_0|RUNNING|None|1|n1|0:00|0|
"""
# The same without -r: pending tasks folded into one line, with the throttle.
SQUEUE_ARRAY_FOLDED = """\
38|FAILED|NonZeroExitCode|1|n1|0:00|0|
37_[1-3%1]|PENDING|JobArrayTaskLimit|1||0:00|0|
37_0|RUNNING|None|1|n1|0:00|0|
"""
# A requeued job waiting for its begin time, a running 2-node job past a day, a held one.
SQUEUE_REQUEUED = """\
34|PENDING|BeginTime|1||0:00|1|
35|RUNNING|None|2|n[1-2]|1-02:03:04|0|
31|PENDING|JobHeldUser|1||0:00|0|
"""
# sacct -j 31,32,34,38 -X -n -P -D --format=<SACCT_FORMAT>: a held job and a held array
# cancelled before they ran, a job requeued once then cancelled, a job that exited 3.
# Jobs 39 and 40 are written by hand in the same format: this cluster has no cgroups to
# OOM-kill a job, and a signal shows as "0:<signal>".
_SACCT_LINES = """\
31|CANCELLED by 0|0:0|0|1|None assigned|JobHeldUser|2026-11-21T06:02:13|Unknown|Unknown
32_[0-2]|CANCELLED by 0|0:0|0|1|None assigned|JobHeldUser|2026-11-21T06:02:13|Unknown|Unknown
34|REQUEUED|0:0|1|1|n1|None|2026-11-21T06:02:27|2026-11-21T06:02:28|2026-11-21T06:02:29
34|CANCELLED by 0|0:0|0|1|None assigned|None|2026-11-21T06:02:29|Unknown|2026-11-21T06:02:30
38|FAILED|3:0|0|1|n1|None|2026-11-21T06:05:04|2026-11-21T06:05:05|2026-11-21T06:05:05
39|OUT_OF_MEMORY|0:125|61|2|n[1-2]|None|2026-11-21T06:06:00|2026-11-21T06:06:01|2026-11-21T06:07:02
40|CANCELLED by 0|0:15|3725|1|n2|None|2026-11-21T06:07:00|2026-11-21T06:07:01|2026-11-21T07:09:06
"""
# Partition and User close each line.
SACCT = "".join(f"{line}|debug|alice\n" for line in _SACCT_LINES.splitlines())


def test_formats_end_every_squeue_field_with_the_delimiter() -> None:
    # Without the suffix squeue pads each -O field to 20 characters and cuts longer ones.
    assert all(field.endswith(":|") for field in SQUEUE_FORMAT.split(","))
    assert SACCT_FORMAT.split(",")[:2] == ["JobID", "State"]


def test_squeue_split_array_and_finished_job() -> None:
    rows = parse_squeue(SQUEUE_ARRAY_SPLIT)
    assert sorted(rows) == ["37_0", "37_1", "37_2", "37_3", "38"]
    assert rows["37_2"].state == "PENDING" and rows["37_2"].reason == "JobArrayTaskLimit"
    assert rows["37_2"].node_list is None and rows["37_2"].nodes == 1
    assert rows["37_0"].state == "RUNNING" and rows["37_0"].reason is None
    assert rows["37_0"].node_list == "n1"
    assert rows["38"].state == "FAILED"


def test_squeue_folded_pending_array_expands_to_tasks() -> None:
    assert parse_squeue(SQUEUE_ARRAY_FOLDED) == parse_squeue(SQUEUE_ARRAY_SPLIT)


def test_squeue_restart_count_and_long_elapsed() -> None:
    rows = parse_squeue(SQUEUE_REQUEUED)
    assert rows["34"].restarts == 1 and rows["34"].reason == "BeginTime"
    assert rows["35"].elapsed_s == 26 * 3600 + 3 * 60 + 4
    assert rows["35"].nodes == 2 and rows["35"].node_list == "n[1-2]"
    assert rows["31"].reason == "JobHeldUser"


@pytest.mark.parametrize("text", ["", "\n", "   \n"])
def test_empty_output_means_no_jobs(text: str) -> None:
    assert parse_squeue(text) == {}
    assert parse_sacct(text) == {}


def test_sacct_states_exit_codes_and_attempts() -> None:
    rows = parse_sacct(SACCT)
    assert rows["31"][0].state == "CANCELLED"  # "CANCELLED by 0"
    assert rows["31"][0].node_list is None  # "None assigned"
    assert rows["31"][0].reason == "JobHeldUser"
    # A pending array cancelled as a whole is one line for all its tasks.
    assert [r.job_id for rs in rows.values() for r in rs if r.job_id.startswith("32")] == [
        "32_0",
        "32_1",
        "32_2",
    ]
    assert [r.state for r in rows["34"]] == ["REQUEUED", "CANCELLED"]  # -D: both attempts
    failed = rows["38"][0]
    assert (failed.state, failed.exit_code, failed.signal) == ("FAILED", 3, None)
    oom = rows["39"][0]
    assert (oom.exit_code, oom.signal, oom.elapsed_s, oom.nodes) == (0, 125, 61, 2)
    assert rows["40"][0].signal == 15 and rows["40"][0].elapsed_s == 3725


def test_sacct_submit_time_is_local_time() -> None:
    (row,) = parse_sacct(SACCT)["38"]
    assert row.submitted == time.mktime((2026, 11, 21, 6, 5, 4, 0, 0, -1))


def test_sacct_attempt_times_partition_and_user() -> None:
    first, second = parse_sacct(SACCT)["34"]
    # Each attempt of a requeued job has its own start and end: the queue between them
    # is the second's start less the first's end (None while it has not started).
    assert first.ended == time.mktime((2026, 11, 21, 6, 2, 29, 0, 0, -1))
    assert first.started is not None and second.started is None
    assert (second.partition, second.user) == ("debug", "alice")


def test_sacct_ignores_lines_with_another_field_count() -> None:
    assert parse_sacct("38|FAILED|3:0\nsacct: error: something\n") == {}


def test_sacct_attempts_are_sorted_by_submission() -> None:
    text = "\n".join(reversed(SACCT.splitlines()))
    assert [r.state for r in parse_sacct(text)["34"]] == ["REQUEUED", "CANCELLED"]


@pytest.mark.parametrize(
    ("raw", "state"),
    [
        ("CANCELLED by 0", "CANCELLED"),
        ("CANCELLED by 1234", "CANCELLED"),
        ("RUNNING", "RUNNING"),
        ("completed", "COMPLETED"),
        ("OUT_OF_MEMORY", "OUT_OF_MEMORY"),
        ("", "UNKNOWN"),
    ],
)
def test_normalise_state(raw: str, state: str) -> None:
    assert normalise_state(raw) == state


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0:00", 0),
        ("5:07", 307),
        ("1:02:03", 3723),
        ("1-02:03:04", 93784),
        ("10-00:00:00", 864000),
        ("00:01:02.345", 62),
        ("INVALID", None),
        ("UNLIMITED", None),
        ("", None),
    ],
)
def test_parse_elapsed(text: str, seconds: int | None) -> None:
    assert parse_elapsed(text) == seconds
    if seconds is not None and "." not in text:
        assert parse_elapsed(format_elapsed(seconds)) == seconds


@pytest.mark.parametrize(
    ("job_id", "expanded"),
    [
        ("123", ["123"]),
        ("123_4", ["123_4"]),
        ("123_[4-5]", ["123_4", "123_5"]),
        ("123_[1,3-4%2]", ["123_1", "123_3", "123_4"]),
        ("123_[7]", ["123_7"]),
    ],
)
def test_expand_job_id(job_id: str, expanded: list[str]) -> None:
    assert expand_job_id(job_id) == expanded


@pytest.mark.parametrize(
    ("node_list", "count"),
    [("n1", 1), ("n[1-2]", 2), ("n[1-2],gpu[01-04,07],login", 8), ("a-1,b-2", 2)],
)
def test_count_hosts(node_list: str, count: int) -> None:
    assert count_hosts(node_list) == count


def test_show_config_keys_and_values() -> None:
    text = (
        "Configuration data as of 2026-11-21T06:00:00\n"
        "AccountingStorageType   = accounting_storage/slurmdbd\n"
        "ClusterName             = stoker\n"
        "PlugStackConfig         = (null)\n"
        "SlurmctldParameters     = enable_configless,idle_on_node_suspend\n"
        "\n"
        "Cgroup Support Configuration:\n"
    )
    config = parse_show_config(text)
    assert config["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert config["ClusterName"] == "stoker" and config["PlugStackConfig"] == "(null)"
    assert config["SlurmctldParameters"] == "enable_configless,idle_on_node_suspend"
    assert len(config) == 4
