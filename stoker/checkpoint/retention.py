"""Which checkpoints to delete: keep the newest `keep_last` and every
`keep_every`-th, and never lose the one a restart would load.

The rules, for the `step-<N>` folders under one root:

- Only folders stoker wrote are ever deleted: committed ones (COMMIT.json) and
  failed saves (stoker's start marker, no COMMIT.json). Anything else under
  the root is left alone, whatever its name.
- The newest checkpoint that verifies (V) is never deleted, and nothing is
  deleted until there is one: a broken newest commit must not take the older
  good ones with it.
- `keep_last` counts verified checkpoints, so broken ones do not use up the
  slots that keep a restart possible.
- Only folders older than V are deleted. A newer uncommitted folder may be a
  save still being written; a newer broken commit is left for a person to look
  at (`stoker ckpt verify`).

Imports no torch: `stoker ckpt prune` runs on login nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stoker.checkpoint import commit as ck

MARKER_NAME = ".stoker-save"
"""Written by the coordinator into step-<N>/ before any shard: the folder is stoker's."""


@dataclass(frozen=True)
class Decision:
    row: ck.Row
    delete: bool
    reason: str


def plan(
    rows: list[ck.Row],
    *,
    keep_last: int,
    keep_every: int | None,
    verified: Callable[[ck.Row], bool],
    stokers: Callable[[ck.Row], bool],
) -> list[Decision]:
    """A decision for every row (rows newest first, as list_checkpoints gives them)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    good = [row.step for row in rows if row.committed and verified(row)]
    newest_good = good[0] if good else None
    kept_last = set(good[:keep_last])
    decisions = []
    for row in rows:
        if not row.committed and not stokers(row):
            decisions.append(Decision(row, False, "not written by stoker"))
        elif newest_good is None:
            decisions.append(Decision(row, False, "no checkpoint verifies yet"))
        elif row.step == newest_good:
            decisions.append(Decision(row, False, "newest verified"))
        elif row.step > newest_good:
            what = "broken commit" if row.committed else "save in progress or cut short"
            decisions.append(Decision(row, False, f"newer than the newest verified ({what})"))
        elif row.step in kept_last:
            decisions.append(Decision(row, False, f"among the last {keep_last}"))
        elif keep_every and row.committed and row.step % keep_every == 0 and row.step in good:
            decisions.append(Decision(row, False, f"multiple of keep_every={keep_every}"))
        elif not row.committed:
            decisions.append(Decision(row, True, "save that never committed"))
        elif row.step not in good:
            reason = f"broken, older than the newest verified step-{newest_good}"
            decisions.append(Decision(row, True, reason))
        else:
            decisions.append(Decision(row, True, f"beyond keep_last={keep_last}"))
    return decisions


def is_stokers(url: str, *, fs_options: dict[str, Any] | None = None) -> bool:
    """Whether stoker wrote this step folder (its start marker or a commit)."""
    return ck.exists(f"{url}/{MARKER_NAME}", fs_options=fs_options) or ck.exists(
        f"{url}/{ck.COMMIT_NAME}", fs_options=fs_options
    )


def prune(
    root_url: str,
    *,
    keep_last: int,
    keep_every: int | None,
    dry_run: bool = False,
    fs_options: dict[str, Any] | None = None,
) -> list[Decision]:
    """Apply the rules under root (quick verification); returns every decision."""
    rows = ck.list_checkpoints(root_url, fs_options=fs_options)
    decisions = plan(
        rows,
        keep_last=keep_last,
        keep_every=keep_every,
        verified=lambda row: not ck.verify(row.path, full=False, fs_options=fs_options),
        stokers=lambda row: is_stokers(row.path, fs_options=fs_options),
    )
    if not dry_run:
        for decision in decisions:
            if decision.delete:
                ck.remove(decision.row.path, fs_options=fs_options)
    return decisions
