"""A part's result file, `<OUT_DIR>/<part>.json`, rewritten whole (write, then
rename) each time the part has something new: a part stopped at its deadline leaves
every row it finished. `status` is "running" until the part says "ok"; the
orchestrator sets "timeout" or "failed" when the part did not."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_check.environment import environment


class PartResult:
    """The document one part fills: `rows` (its measurements), `summary` (the
    headline figures the closing table shows), `checks` (each target held against
    what was measured: name, target, measured, met)."""

    def __init__(self, out_dir: Path, part: str, *, dry_run: bool) -> None:
        self.path = out_dir / f"{part}.json"
        self._began = time.monotonic()
        self.doc: dict[str, Any] = {
            "part": part,
            "status": "running",
            "dry_run": dry_run,
            "environment": environment(),
            "rows": [],
            "summary": {},
            "checks": [],
            "skipped": [],
        }
        out_dir.mkdir(parents=True, exist_ok=True)
        self.write()

    def add_row(self, row: dict[str, Any]) -> None:
        self.doc["rows"].append(row)
        self.write()

    def check(self, name: str, target: str, measured: Any, met: bool | None) -> None:
        """One target against its measurement; `met` None: not measurable here."""
        self.doc["checks"].append(
            {"name": name, "target": target, "measured": measured, "met": met}
        )
        self.write()

    def skip(self, what: str, reason: str) -> None:
        self.doc["skipped"].append({"what": what, "reason": reason})
        self.write()

    def set(self, **fields: Any) -> None:
        self.doc.update(fields)
        self.write()

    def finish(self) -> None:
        self.doc["status"] = "ok"
        self.write()

    def write(self) -> None:
        self.doc["seconds"] = round(time.monotonic() - self._began, 1)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str) + "\n")
        tmp.replace(self.path)
