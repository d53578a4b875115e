"""What follows once `stoker status`, `why` or `logs` sees a job ended.

- How it ended, in one line: `stoker why`'s headline (the first failing rank's
  error, a signature, a time limit...), shortened for the REASON column. It is
  judged once per job (or array task) and kept in the ledger's `extra["reasons"]`.
- Its account (stoker/launcher/watch/job_account.py: the time it was given and where it
  went, the nodes it implicates) is made once and kept in `extra["accounts"]`, for
  `stoker insights`; `stoker why`'s cause is kept in `extra["causes"]`.
- Its MLflow run ends in the job's state (stoker/tracking/run_end.py) if the job
  itself could not: a rank SLURM killed, a batch script cancelled before its last
  line. Runs ended so are kept in `extra["mlflow_ended"]`; a store that cannot be
  reached is tried again after `RETRY_S`, so a store down does not slow every call.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stoker.errors import StokerError
from stoker.launcher.jobs.ledger import Ledger
from stoker.launcher.jobs.targets import Target
from stoker.launcher.slurm.cli import SlurmError
from stoker.launcher.slurm.query import TERMINAL_STATES, AcctRow, query_accounting

if TYPE_CHECKING:
    from stoker.launcher.watch.job_account import JobAccount
    from stoker.launcher.why import Diagnosis

REASON_WIDTH = 72
RETRY_S = 600.0


@dataclass(frozen=True)
class Ended:
    """A job (or array task) seen in an end state."""

    target: Target
    state: str
    # Whether its reason may be judged now (one scontrol and one sacct call for a SLURM
    # job); else only a reason kept in the ledger is read.
    judge: bool = True


def short_reason(summary: str, width: int = REASON_WIDTH) -> str:
    """The headline's first line, cut to `width` characters with an ellipsis."""
    line = summary.strip().splitlines()[0] if summary.strip() else ""
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def ended_reasons(
    ledger: Ledger, ended: Sequence[Ended], known: Mapping[str, Diagnosis] | None = None
) -> dict[str, str]:
    """`{job_id: reason}` for the ended jobs that did not complete, from the ledger,
    `known` (`{job_id: diagnosis}` a caller judged already) or judged now; kept there
    with the diagnosis' cause."""
    return _reasons_and_causes(ledger, ended, known)[0]


def _reasons_and_causes(
    ledger: Ledger, ended: Sequence[Ended], known: Mapping[str, Diagnosis] | None
) -> tuple[dict[str, str], dict[str, str]]:
    """The reasons, and the causes of those judged now (the others' are in the ledger)."""
    from stoker.launcher.why import diagnose

    reasons: dict[str, str] = {}
    causes: dict[str, str] = {}
    learned: dict[str, dict[tuple[str, ...], object]] = {}
    for item in ended:
        if item.state == "COMPLETED" or item.state not in TERMINAL_STATES:
            continue
        target = item.target
        kept = target.record.extra.get("reasons", {})
        reason = kept.get(target.job_id) if isinstance(kept, dict) else None
        if not isinstance(reason, str):
            if known and target.job_id in known:
                diagnosis = known[target.job_id]
            elif item.judge:
                try:
                    diagnosis = diagnose(target)
                except (StokerError, OSError):
                    continue  # the scheduler's own reason stays
            else:
                continue
            reason = short_reason(diagnosis.summary)
            changes = learned.setdefault(target.record.job_id, {})
            changes[("reasons", target.job_id)] = reason
            changes[("causes", target.job_id)] = causes[target.job_id] = diagnosis.cause
        reasons[target.job_id] = reason
    ledger.set_extra(learned)
    return reasons, causes


def _kept_cause(target: Target) -> str | None:
    causes = target.record.extra.get("causes", {})
    cause = causes.get(target.job_id) if isinstance(causes, dict) else None
    return cause if isinstance(cause, str) else None


def keep_accounts(
    ledger: Ledger,
    ended: Sequence[Ended],
    accounting: Mapping[str, list[AcctRow]] | None = None,
    causes: Mapping[str, str] | None = None,
    *,
    asked: bool = False,
) -> None:
    """Make and keep the account of each ended job that has none yet (or one of an
    older format). `accounting`: sacct rows a caller has; the others' are asked in one
    sacct call (none where accounting is off: the run folder's times then stand).
    `asked`: the caller's `accounting` is its one sacct answer (None: sacct failed), so
    SLURM is not asked again; a job it has no rows for yet (slurmdbd lags the end by a
    moment) is left for a later `stoker insights` rather than accounted without its
    allocation times. `causes`: those just judged, not yet in the records."""
    from stoker.launcher.watch.job_account import ACCOUNTS_KEY, JobAccount, make_account

    todo = []
    for item in ended:
        if item.state not in TERMINAL_STATES:
            continue
        kept = item.target.record.extra.get(ACCOUNTS_KEY, {})
        data = kept.get(item.target.job_id) if isinstance(kept, dict) else None
        if JobAccount.from_json(data) is None:
            todo.append(item)
    if not todo:
        return
    rows = dict(accounting or {})
    missing = [
        i.target.job_id
        for i in todo
        if i.target.record.backend == "slurm" and i.target.job_id not in rows
    ]
    if asked and accounting is not None:
        todo = [i for i in todo if i.target.job_id not in missing]
    elif missing and not asked:
        with contextlib.suppress(SlurmError):  # accounting off: the run folder's times
            rows.update(query_accounting(missing))
    changes: dict[str, dict[tuple[str, ...], object]] = {}
    for item in todo:
        target = item.target
        cause = (causes or {}).get(target.job_id) or _kept_cause(target)
        account = make_account(target, item.state, rows.get(target.job_id, []), cause)
        changes.setdefault(target.record.job_id, {})[(ACCOUNTS_KEY, target.job_id)] = (
            account.to_json()
        )
        if item.state != "COMPLETED" and item.judge:
            _log_account(target, account)
    ledger.set_extra(changes)


def _log_account(target: Target, account: JobAccount) -> None:
    """The account of a job that did not complete, on its MLflow run (the runtime logs
    it itself only at a finished job's end), with the tag `stoker.goodput`."""
    run_id, uri = target.mlflow_run_id, target.record.tracking_uri
    if not run_id or not uri:
        return
    from stoker.tracking.ended_run_metrics import log_to_ended_run
    from stoker.tracking.store import resolve_tracking_uri

    tags = {"stoker.goodput": f"{account.goodput:.3f}"} if account.goodput is not None else {}
    try:
        log_to_ended_run(
            resolve_tracking_uri(uri), run_id, account.metrics(), tags, account.last_step or 0
        )
    except StokerError as exc:
        first = str(exc).splitlines()[0]
        print(
            f"stoker: could not log job {target.job_id}'s time account to MLflow: {first}",
            file=sys.stderr,
        )


def end_mlflow_runs(ledger: Ledger, ended: Sequence[Ended], *, now: float | None = None) -> None:
    """End the MLflow runs of `ended` that are still open; an array's parent run once
    every task of it is in `ended`. Best effort: a store that cannot be reached is said
    on stderr and tried again after RETRY_S."""
    now = time.time() if now is None else now
    from stoker.tracking.run_end import MARK_FILE

    todo: dict[str, dict[str, str]] = {}  # job_id -> {run_id: job state}
    known_ended: dict[str, list[str]] = {}  # job_id -> runs the job's own end closed
    records = {}
    for item in ended:
        record = item.target.record
        done = record.extra.get("mlflow_ended", {})
        tried = record.extra.get("mlflow_end_tried")
        if isinstance(tried, (int, float)) and now - tried < RETRY_S:
            continue
        runs = todo.setdefault(record.job_id, {})
        records[record.job_id] = record
        run_id = item.target.mlflow_run_id
        if not run_id or run_id in done:
            continue
        if (item.target.run.path / MARK_FILE).exists():
            known_ended.setdefault(record.job_id, []).append(run_id)  # by the job's end
        else:
            runs[run_id] = item.state
    for job_id, runs in todo.items():
        record = records[job_id]
        if record.array_size and record.mlflow_run_id:
            states = [e.state for e in ended if e.target.record.job_id == job_id]
            if len(states) == record.array_size and record.mlflow_run_id not in record.extra.get(
                "mlflow_ended", {}
            ):
                whole = "COMPLETED" if set(states) == {"COMPLETED"} else "FAILED"
                runs[record.mlflow_run_id] = whole
    changes: dict[str, dict[tuple[str, ...], object]] = {
        job_id: {("mlflow_ended", run_id): True for run_id in run_ids}
        for job_id, run_ids in known_ended.items()
    }
    for job_id, runs in todo.items():
        record = records[job_id]
        if not runs or not record.tracking_uri:
            continue
        from stoker.tracking.run_end import end_runs
        from stoker.tracking.store import resolve_tracking_uri

        try:
            end_runs(resolve_tracking_uri(record.tracking_uri), runs)
        except StokerError as exc:
            first = str(exc).splitlines()[0]
            print(f"stoker: could not end the MLflow run of job {job_id}: {first}", file=sys.stderr)
            changes.setdefault(job_id, {})[("mlflow_end_tried",)] = now
            continue
        # Kept whether this call or the job ended it: either way it is closed.
        changes.setdefault(job_id, {}).update({("mlflow_ended", r): True for r in runs})
    ledger.set_extra(changes)


def settle(
    ledger: Ledger,
    ended: Sequence[Ended],
    known: Mapping[str, Diagnosis] | None = None,
    accounting: Mapping[str, list[AcctRow]] | None = None,
    *,
    asked: bool = False,
) -> dict[str, str]:
    """The above for the jobs in an end state; returns the reasons. `accounting` and
    `asked`: as for `keep_accounts`."""
    ended = [e for e in ended if e.state in TERMINAL_STATES]
    reasons, causes = _reasons_and_causes(ledger, ended, known)
    # Only those seen ending now: a state kept in the ledger costs no SLURM call (the
    # accounts of jobs ended before accounts were kept are made by `stoker insights`).
    keep_accounts(ledger, [e for e in ended if e.judge], accounting, causes, asked=asked)
    end_mlflow_runs(ledger, ended)
    return reasons
