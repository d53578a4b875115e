"""The ranks' flight-recorder dumps (<run>/flight/r<R>/rank-<N>.json, PyTorch's JSON
trace of each rank's recent collectives, stoker/runtime/dist/flight_recorder.py): which rank
fell behind, and in which collective the others wait for it.

In each process group every member issues the same collectives in the same order, so
each has a sequence number (`collective_seq_id`). In a hang, the ranks that went on
have entered collective N+1 while the one that fell behind has not: its last number is
the lowest of the group. The first group (in the order torch made them) where the
members disagree names it; where they all agree, the traces say nothing about who.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.protocol import FLIGHT_DIR

_RANK_FILE = re.compile(r"^rank-(\d+)\.json$")


@dataclass(frozen=True)
class Laggard:
    """The rank (or ranks) behind the others in one process group."""

    ranks: list[int]
    group: str
    last_seq: int  # the laggards' last collective
    last_name: str | None
    waiting: list[int]  # the ranks already in the next one
    next_seq: int
    next_name: str | None

    def describe(self) -> str:
        behind = ", ".join(map(str, self.ranks))
        others = ", ".join(map(str, self.waiting))
        last = f"#{self.last_seq} {self.last_name}" if self.last_name else "none"
        who = "rank" if len(self.ranks) == 1 else "ranks"
        return (
            f"{who} {behind} fell behind in process group {self.group}: ranks {others} "
            f"wait in collective #{self.next_seq} ({self.next_name or '?'}), which "
            f"{who} {behind} never entered (last: {last})"
        )


def read_traces(run_dir: Path, restart: int) -> dict[int, list[dict[str, Any]]]:
    """rank -> its dump's collective entries; a file that does not parse is left out."""
    traces: dict[int, list[dict[str, Any]]] = {}
    folder = Path(run_dir) / FLIGHT_DIR / f"r{restart}"
    try:
        paths = sorted(folder.iterdir())
    except OSError:
        return traces
    for path in paths:
        match = _RANK_FILE.match(path.name)
        if not match:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        entries = data.get("entries") if isinstance(data, dict) else None
        if isinstance(entries, list):
            traces[int(match.group(1))] = [e for e in entries if isinstance(e, dict)]
    return traces


def _group(entry: dict[str, Any]) -> tuple[str, str]:
    group = entry.get("process_group")
    if isinstance(group, list) and len(group) == 2:
        return str(group[0]), str(group[1])
    return str(entry.get("pg_id", "?")), str(entry.get("pg_id", "?"))


def find_laggard(traces: dict[int, list[dict[str, Any]]]) -> Laggard | None:
    """The first process group whose members' last collectives differ, and who is behind."""
    # group id -> description, and rank -> (seq -> name) in it; point-to-point left out.
    names: dict[str, str] = {}
    seqs: dict[str, dict[int, dict[int, str]]] = {}
    for rank, entries in traces.items():
        for entry in entries:
            if entry.get("is_p2p"):
                continue
            seq = entry.get("collective_seq_id")
            if not isinstance(seq, int):
                continue
            group, description = _group(entry)
            names[group] = description
            seqs.setdefault(group, {}).setdefault(rank, {})[seq] = str(
                entry.get("profiling_name") or "?"
            )
    for group in sorted(seqs, key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0, g)):
        members = seqs[group]
        last = {rank: max(by_seq) for rank, by_seq in members.items()}
        if len(members) < 2 or len(set(last.values())) == 1:
            continue
        low = min(last.values())
        behind = sorted(r for r, s in last.items() if s == low)
        ahead = sorted(r for r in last if r not in behind)
        nxt = low + 1
        next_name = next((members[r].get(nxt) for r in ahead if nxt in members[r]), None)
        return Laggard(
            behind, names.get(group, group), low, members[behind[0]].get(low), ahead, nxt, next_name
        )
    return None
