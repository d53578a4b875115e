"""`submit`'s steps without SLURM or MLflow: the request it checks and freezes, the
digest of the frozen configs, and the undo when SLURM refuses the job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stoker.config import resolve_config
from stoker.errors import StokerError
from stoker.launcher.jobs.ledger import Ledger
from stoker.launcher.jobs.rundir import runs_root
from stoker.launcher.launch import submit as submit_module
from stoker.launcher.launch.submit import SubmitOptions, frozen_config_digest, submit
from stoker.tracking.runs import CreatedRun


def test_the_digest_is_of_the_frozen_values_not_the_header() -> None:
    body = "job:\n  name: a\n"
    digest = frozen_config_digest([f"# frozen at 12:00\n{body}"])
    assert digest == frozen_config_digest([f"# frozen at 13:00\n{body}"])
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert digest != frozen_config_digest([body.replace("a", "b")])


def test_a_refused_job_marks_its_run_failed_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = CreatedRun("run-1", "0", "sqlite:///x.db", "link", "artifacts")
    made: list[dict[str, Any]] = []
    failed: list[tuple[str, str]] = []

    def precreate_run(target: Any, **kwargs: Any) -> CreatedRun:
        made.append(kwargs)
        return created

    def refuse(script: Path) -> None:
        assert script.is_file()  # rendered and written before SLURM judges it
        raise StokerError("SLURM refused the job: no such partition")

    monkeypatch.setattr(submit_module, "precreate_run", precreate_run)
    monkeypatch.setattr(submit_module, "_cluster_name", lambda: "c")
    monkeypatch.setattr(submit_module, "preflight", refuse)
    monkeypatch.setattr(
        submit_module,
        "mark_run_failed_to_submit",
        lambda target, run_id, reason: failed.append((run_id, reason)),
    )
    options = SubmitOptions(command=["true"], cwd=tmp_path, snapshot=False)
    with pytest.raises(StokerError, match="no such partition"):
        submit(resolve_config(overrides=["job.name=refused"]), options)

    assert len(made[0]["tags"]["stoker.config_hash"]) == 64  # the digest, under its old key
    assert failed == [("run-1", "SLURM refused the job: no such partition")]
    assert not list(runs_root().glob("refused-*"))  # the run folder is gone
    assert Ledger().list() == []
