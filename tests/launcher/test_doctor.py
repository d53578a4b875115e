"""`stoker doctor` on the real cluster and on broken setups: each problem is reported
with its fix, the other checks still run, and the exit code says whether any failed."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from stoker.errors import StokerError
from stoker.launcher.doctor import (
    Finding,
    SlurmProbe,
    check_tracking_store,
    describe_partition,
    mount_of,
    parse_sinfo,
    plugstack_mentions_pyxis,
    run_checks,
    summarize_gpus,
)
from stoker.launcher.slurm.cli import CALLS
from stoker.tracking.store import TrackingTarget, resolve_tracking_uri
from tests.clirun import STOKER, stoker_in_tty, stoker_text
from tests.cluster.localslurm import ClusterSettings
from tests.mlflow_server import Server, free_port

slurm = pytest.mark.slurm


def doctor_json(
    env: dict[str, str] | None = None,
) -> tuple[dict[str, dict[str, Any]], subprocess.CompletedProcess[str]]:
    result = stoker_text("doctor", "--json", env=env)
    findings = json.loads(result.stdout)  # fails unless stdout is the JSON document alone
    assert all(set(f) == {"check", "status", "detail", "fix"} for f in findings)
    assert all(f["status"] in ("ok", "warn", "fail") for f in findings)
    return {f["check"]: f for f in findings}, result


# --------------------------------------------------------------------------- real cluster


@slurm
@pytest.mark.fresh_home  # checking the store creates none
def test_doctor_reports_the_cluster(slurm_cluster: ClusterSettings, isolated_home: Path) -> None:
    checks, result = doctor_json(env={"NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"})
    assert result.returncode == 0, result.stdout

    version = subprocess.run(
        ["scontrol", "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    assert checks["slurm"]["status"] == "ok"
    assert checks["slurm"]["detail"].startswith(f"{version}, cluster {slurm_cluster.cluster_name}")
    assert "up" in checks["slurm"]["detail"]
    if not slurm_cluster.external:
        assert version.startswith("22.05")

    partition = checks[f"partition {slurm_cluster.partition}"]
    assert partition["status"] == "ok"
    assert f"{len(slurm_cluster.node_names)} nodes" in partition["detail"]
    assert f"gpu:{slurm_cluster.gpus_per_node} per node" in partition["detail"]

    assert checks["accounting"]["status"] == "ok"
    assert "sacct answers" in checks["accounting"]["detail"]
    assert checks["requeue"]["status"] == "ok"
    if not slurm_cluster.external:  # localslurm.py writes JobRequeue=1
        assert checks["requeue"]["detail"].startswith("JobRequeue=1 (jobs requeue by default")

    runs = isolated_home / ".stoker" / "runs"
    assert checks["run folder"]["status"] != "fail"
    assert f"{runs} writable" in checks["run folder"]["detail"]
    assert list(runs.iterdir()) == []  # the write probe was removed
    assert checks["mlflow"]["status"] != "fail", checks["mlflow"]
    assert not list(isolated_home.rglob("*.db"))  # checking the store creates no database

    assert checks["nccl env"]["detail"].startswith("NCCL_DEBUG=WARN, NCCL_SOCKET_IFNAME=lo")
    assert {"pyxis", "apptainer", "profile", "gpus"} <= set(checks)


@slurm
def test_plain_lines_when_piped_and_a_table_on_a_terminal(slurm_cluster: ClusterSettings) -> None:
    checks, _ = doctor_json()
    result = stoker_text("doctor")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert len(lines) == len(checks)
    assert re.match(r"^ok +slurm +\d+\.\d+\.\d+, cluster \S+, controller \S+ up$", lines[0])
    assert all(re.match(r"^(ok|warn|fail) +\S", line) for line in lines)
    # A warning carries its fix on the same line, so `grep warn` shows both.
    assert all("  fix: " in line for line in lines if line.startswith(("warn", "fail")))
    assert f"{len(checks)} checks: 0 failed" in result.stderr

    screen = stoker_in_tty("doctor")
    assert "finding" in screen and f"partition {slurm_cluster.partition}" in screen


@slurm
def test_few_scheduler_calls(slurm_cluster: ClusterSettings) -> None:
    before = CALLS.copy()
    findings = run_checks()
    assert not [f for f in findings if f.status == "fail"], findings
    # `sinfo --version` and `srun --help` stay on this machine; ping, config, one sinfo
    # for every partition and one sacct reach the controller and slurmdbd.
    assert CALLS - before == {"sinfo": 2, "scontrol": 2, "sacct": 1, "srun": 1}


# --------------------------------------------------------------------------- broken setups


@slurm
def test_slurm_missing_from_path_fails_and_the_rest_still_runs(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "stoker").symlink_to(STOKER)  # its #! names the venv's python by full path
    checks, result = doctor_json(env={"PATH": str(bin_dir)})
    assert result.returncode == 1
    assert checks["slurm"]["status"] == "fail"
    assert "not found on PATH" in checks["slurm"]["detail"]
    assert "login node" in checks["slurm"]["fix"]
    for name in ("partitions", "accounting", "requeue", "pyxis"):
        assert checks[name]["status"] == "warn"
        assert checks[name]["detail"].startswith("not checked")
    assert checks["run folder"]["status"] != "fail"
    assert checks["mlflow"]["status"] != "fail"
    assert checks["gpus"]["status"] == "ok" and "no nvidia-smi" in checks["gpus"]["detail"]
    assert "nccl env" in checks


@slurm
def test_controller_down_fails_within_seconds(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    conf = Path(slurm_cluster.slurm_conf).read_text()
    port = free_port()
    moved, n = re.subn(r"(?m)^SlurmctldPort=\d+$", f"SlurmctldPort={port}", conf)
    assert n == 1
    (tmp_path / "slurm.conf").write_text(moved)
    start = time.monotonic()
    checks, result = doctor_json(env={"SLURM_CONF": str(tmp_path / "slurm.conf")})
    assert time.monotonic() - start < 8
    assert result.returncode == 1
    assert checks["slurm"]["status"] == "fail"
    assert "controller does not answer" in checks["slurm"]["detail"]
    assert str(tmp_path / "slurm.conf") in checks["slurm"]["detail"]
    assert "slurmctld" in checks["slurm"]["fix"]
    assert checks["partitions"]["detail"].startswith("not checked")
    # srun reads slurm.conf, not the controller, for its options: pyxis is still checked.
    assert not checks["pyxis"]["detail"].startswith("not checked")


@slurm
def test_slurm_conf_naming_no_file_fails_at_once(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    # SLURM commands, even `sinfo --version`, retry a missing slurm.conf for 60 s.
    missing = tmp_path / "slurm.conf"
    start = time.monotonic()
    checks, result = doctor_json(env={"SLURM_CONF": str(missing)})
    assert time.monotonic() - start < 5
    assert result.returncode == 1
    assert checks["slurm"]["detail"] == f"SLURM_CONF={missing} names no file"
    assert "SLURM_CONF" in checks["slurm"]["fix"]
    assert checks["pyxis"]["detail"] == "not checked: SLURM_CONF names no file"


@slurm
def test_unreachable_mlflow_server_fails_with_the_fix(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    profile = tmp_path / "profile.yaml"
    profile.write_text(f"tracking_uri: {uri}\n")
    checks, result = doctor_json(env={"STOKER_PROFILE": str(profile)})
    assert result.returncode == 1
    assert checks["profile"] == {
        "check": "profile",
        "status": "ok",
        "detail": f"{profile} is valid",
        "fix": None,
    }
    mlflow = checks["mlflow"]
    assert mlflow["status"] == "fail"
    assert f"cannot reach {uri}/health" in mlflow["detail"]
    assert "mlflow server" in mlflow["fix"]


@slurm
def test_broken_profile_is_reported_and_mlflow_not_checked(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text("partiton: gpu\n")
    checks, result = doctor_json(env={"STOKER_PROFILE": str(profile)})
    assert result.returncode == 1
    assert checks["profile"]["status"] == "fail"
    assert "partiton" in checks["profile"]["detail"]
    assert checks["mlflow"]["detail"] == "not checked: the site profile does not load"


@slurm
def test_a_profile_partition_or_account_the_cluster_lacks_fails_naming_the_fix(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    """A new user's profile names a partition (and an account) this cluster does not
    have: doctor fails on it, naming each and what to set, before SLURM refuses a submit;
    a profile that names the cluster's own passes."""
    profile = tmp_path / "profile.yaml"
    profile.write_text("partition: gpu-a100\naccount: no-such-account\n")
    checks, result = doctor_json(env={"STOKER_PROFILE": str(profile)})
    assert result.returncode == 1
    target = checks["profile job target"]
    assert target["status"] == "fail"
    assert "partition 'gpu-a100' is not a partition of this cluster" in target["detail"]
    assert slurm_cluster.partition in target["detail"]
    assert "account 'no-such-account' is not one of" in target["detail"]
    assert str(profile) in target["detail"]
    assert (
        f"`partition: {slurm_cluster.partition}`" in target["fix"] and str(profile) in target["fix"]
    )

    profile.write_text(f"partition: {slurm_cluster.partition}\n")
    checks, result = doctor_json(env={"STOKER_PROFILE": str(profile)})
    assert checks["profile job target"]["status"] == "ok"
    assert f"partition {slurm_cluster.partition} exists" in checks["profile job target"]["detail"]


@slurm
def test_unwritable_stoker_home_fails(slurm_cluster: ClusterSettings, tmp_path: Path) -> None:
    # Tests run as root, which ignores permission bits: a path under a file cannot be created.
    (tmp_path / "file.txt").write_text("")
    home = tmp_path / "file.txt" / "sub"
    checks, result = doctor_json(env={"STOKER_HOME": str(home)})
    assert result.returncode == 1
    run_folder = checks["run folder"]
    assert run_folder["status"] == "fail"
    assert run_folder["detail"].startswith(f"cannot create {home / 'runs'}")
    assert "STOKER_HOME" in run_folder["fix"]


@slurm
def test_run_folder_on_a_node_local_file_system_warns(slurm_cluster: ClusterSettings) -> None:
    home = Path("/dev/shm") / f"stoker-doctor-{secrets.token_hex(4)}"
    try:
        checks, result = doctor_json(env={"STOKER_HOME": str(home)})
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert result.returncode == 0  # warnings do not fail
    run_folder = checks["run folder"]
    assert run_folder["status"] == "warn"
    assert "on tmpfs" in run_folder["detail"]
    assert "compute nodes must see this path" in run_folder["detail"]
    assert "shared file system" in run_folder["fix"]


# --------------------------------------------------------------------------- parsers, rules


def test_one_raising_check_does_not_stop_the_others() -> None:
    def ok() -> list[Finding]:
        return [Finding("a", "ok", "fine")]

    def boom() -> list[Finding]:
        raise RuntimeError("surprise")

    def user_error() -> list[Finding]:
        raise StokerError("bad value", fix="change it")

    findings = run_checks([("a", ok), ("boom", boom), ("user", user_error), ("c", ok)])
    assert [f.check for f in findings] == ["a", "boom", "user", "a"]
    assert findings[1].status == "fail" and "RuntimeError: surprise" in findings[1].detail
    assert findings[2] == Finding("user", "fail", "bad value", "change it")


def test_sqlite_store_is_checked_without_creating_it(tmp_path: Path) -> None:
    target = resolve_tracking_uri(f"sqlite:///{tmp_path}/ml/mlflow.db")
    finding = check_tracking_store(target)
    assert finding.status != "fail"
    assert "folder writable, database created by the first submit" in finding.detail
    assert list(tmp_path.iterdir()) == []  # not even the folder

    (tmp_path / "file.txt").write_text("")
    under_a_file = TrackingTarget(
        uri=f"sqlite:///{tmp_path}/file.txt/mlflow.db",
        artifact_root=None,
        source="MLFLOW_TRACKING_URI",
    )
    finding = check_tracking_store(under_a_file)
    assert finding.status == "fail"
    assert f"{tmp_path}/file.txt is not a folder" in finding.detail
    assert "MLFLOW_TRACKING_URI" in finding.detail and finding.fix


# `sinfo --noheader --format='%P|%a|%l|%D|%T|%G'` on a cluster with drained and down nodes.
SINFO = """\
gpu*|up|2-00:00:00|6|mixed|gpu:h100:8(S:0-1)
gpu*|up|2-00:00:00|2|drained|gpu:h100:8(S:0-1)
gpu*|up|2-00:00:00|1|down*|gpu:h100:8(S:0-1)
cpu|up|1-00:00:00|10|idle~|(null)
maint|down|infinite|4|idle|gpu:a100:4
broken|up|infinite|1|drained|(null)
broken|up|infinite|1|idle*|(null)
"""


def test_partitions_from_sinfo() -> None:
    findings = {f.check: f for f in map(describe_partition, parse_sinfo(SINFO))}
    assert list(findings) == [
        "partition gpu",
        "partition cpu",
        "partition maint",
        "partition broken",
    ]
    gpu = findings["partition gpu"]
    assert gpu.status == "ok"
    assert gpu.detail == (
        "default, up, 9 nodes (6 mixed, 2 drained, 1 down*), gpu:h100:8(S:0-1) per node, "
        "time limit 2-00:00:00"
    )
    assert findings["partition cpu"].status == "ok"  # powered-down nodes start on demand
    assert "no GRES" in findings["partition cpu"].detail
    assert findings["partition maint"].status == "warn"
    assert "scontrol show partition maint" in (findings["partition maint"].fix or "")
    assert findings["partition broken"].status == "warn"  # drained + not responding
    assert "sinfo -R -p broken" in (findings["partition broken"].fix or "")


def test_preemption_that_cancels_warns() -> None:
    probe = SlurmProbe(
        blocked=None,
        config={
            "JobRequeue": "0",
            "PreemptType": "preempt/partition_prio",
            "PreemptMode": "CANCEL",
        },
    )
    (finding,) = probe.check_requeue()
    assert finding.status == "warn"
    assert "JobRequeue=0" in finding.detail and "PreemptMode=CANCEL" in finding.detail
    assert "stoker requeue" in (finding.fix or "")
    probe.config["PreemptMode"] = "REQUEUE"
    assert probe.check_requeue()[0].status == "ok"


# /proc/mounts of a login node: shared home and scratch, local /tmp, a path with a space.
MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw,nosuid 0 0
nfs1:/export/home /home nfs4 rw,vers=4.2 0 0
10.0.0.5@o2ib:/scratch /scratch lustre rw,flock 0 0
/dev/sdb1 /data\\040disk xfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/home/ada/.stoker/runs", ("/home", "nfs4")),
        ("/scratch/ada", ("/scratch", "lustre")),
        ("/tmp/x", ("/tmp", "tmpfs")),
        ("/tmpfoo", ("/", "ext4")),  # a prefix of the name is not a mount point
        ("/data disk/runs", ("/data disk", "xfs")),
    ],
)
def test_mount_of_a_path(path: str, expected: tuple[str, str]) -> None:
    assert mount_of(Path(path), MOUNTS) == expected


def test_pyxis_found_through_a_plugstack_include(tmp_path: Path) -> None:
    (tmp_path / "plugstack.conf.d").mkdir()
    (tmp_path / "plugstack.conf.d" / "pyxis.conf").write_text(
        "required /usr/lib/slurm/spank_pyxis.so\n"
    )
    plugstack = tmp_path / "plugstack.conf"
    plugstack.write_text("include plugstack.conf.d/*.conf\n")
    assert plugstack_mentions_pyxis(plugstack)
    plugstack.write_text(f"include {tmp_path}/plugstack.conf.d/*.conf\n")
    assert plugstack_mentions_pyxis(plugstack)
    plugstack.write_text("# nothing\n")
    assert not plugstack_mentions_pyxis(plugstack)


def test_gpu_summary_from_nvidia_smi() -> None:
    csv = "NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB\n" * 8
    assert summarize_gpus(csv) == "8x NVIDIA H100 80GB HBM3 (81559 MiB), driver 550.54.15"
    assert summarize_gpus("") == "nvidia-smi lists no GPU"


@slurm
def test_reachable_mlflow_server_is_ok(
    slurm_cluster: ClusterSettings, mlflow_server: Server
) -> None:
    checks, _ = doctor_json(env={"MLFLOW_TRACKING_URI": mlflow_server.url})
    mlflow = checks["mlflow"]
    assert mlflow["status"] == "ok", mlflow
    assert mlflow_server.url in mlflow["detail"]
