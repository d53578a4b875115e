"""The run folder: everything one submitted job writes, in one place.

<STOKER_HOME>/runs/<name>-<UTC time>-<4 hex>/
  config.yaml          the frozen experiment config (the job's only input)
  job.sbatch           the exact script given to sbatch
  code/                the code snapshot the tasks run from (see launch/snapshot.py)
  code-<sha12>.tar     the same snapshot as one deterministic tar
  logs/batch.log       the batch shell's output (srun's own messages land here)
  logs/r<R>/rank-<T>.log   task T's stdout+stderr during restart R (0 first)
  attempts             one line per start of the batch script: `<epoch> restart=<R> nodes=<list>`
  events               one line per decision of the batch script (requeue, give up)
  progress.json        the runtime's progress: {"step", "total_steps", "loss", ...}
  stop-requested       exists while a stop (time limit, preemption) is in progress
  local-state.json     `submit --local` only: the supervisor's state and exit codes
  local-launch.json    `submit --local` only: what the supervisor starts
  tasks/<i>/           an array task's own folder with the same layout (sweeps)
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.errors import StokerError
from stoker.home import stoker_home

_RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
_RESTART_DIR = re.compile(r"^r(\d+)$")


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run folder; creating them is the writer's business."""

    path: Path

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    @property
    def script(self) -> Path:
        return self.path / "job.sbatch"

    @property
    def code(self) -> Path:
        return self.path / "code"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def batch_log(self) -> Path:
        return self.logs / "batch.log"

    @property
    def attempts(self) -> Path:
        return self.path / "attempts"

    @property
    def events(self) -> Path:
        return self.path / "events"

    @property
    def progress(self) -> Path:
        return self.path / "progress.json"

    @property
    def local_state(self) -> Path:
        """The local backend's record of its processes (`submit --local` only)."""
        return self.path / "local-state.json"

    @property
    def stop_flag(self) -> Path:
        return self.path / "stop-requested"

    def task(self, index: int) -> RunDir:
        """The folder of array task `index`."""
        return RunDir(self.path / "tasks" / str(index))

    def rank_log(self, restart: int, rank: int) -> Path:
        return self.logs / f"r{restart}" / f"rank-{rank}.log"

    def restarts_logged(self) -> list[int]:
        """Restart indices that have a log folder, oldest first."""
        if not self.logs.is_dir():
            return []
        found = (_RESTART_DIR.fullmatch(p.name) for p in self.logs.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def rank_logs(self, restart: int) -> dict[int, Path]:
        """Task logs of one restart, by rank."""
        folder = self.logs / f"r{restart}"
        if not folder.is_dir():
            return {}
        found = {}
        for path in folder.iterdir():
            match = _RANK_LOG.fullmatch(path.name)
            if match:
                found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    def restarts(self) -> int:
        """Starts of the batch script beyond the first, from `attempts` (0 if none yet)."""
        try:
            lines = self.attempts.read_text().splitlines()
        except OSError:
            return 0
        for line in reversed(lines):
            for field in line.split():
                if field.startswith("restart="):
                    try:
                        return int(field.removeprefix("restart="))
                    except ValueError:
                        break
        return 0

    def configured_checkpoint_root(self) -> str | None:
        """checkpoint.root as the frozen config sets it; None where it is left to its
        default (`checkpoint_root`) or the config is unreadable."""
        import yaml

        try:
            config = yaml.safe_load(self.config.read_text())
        except (OSError, yaml.YAMLError):
            return None
        section = config.get("checkpoint") if isinstance(config, dict) else None
        root = section.get("root") if isinstance(section, dict) else None
        return str(root) if root else None

    def checkpoint_root(self) -> str:
        """Where the job's checkpoints are: checkpoint.root, by default
        <run folder>/checkpoints (as the runtime resolves it)."""
        return self.configured_checkpoint_root() or str(self.path / "checkpoints")

    def read_progress(self) -> dict[str, Any] | None:
        """The runtime's last progress record, or None (absent, or caught mid-write)."""
        try:
            data = json.loads(self.progress.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


def runs_root() -> Path:
    return stoker_home() / "runs"


def new_run_dir(name: str, root: Path | None = None) -> RunDir:
    """Create a fresh, uniquely named run folder for job `name`."""
    base = root or runs_root()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StokerError(
            f"cannot create the runs folder {base}: {exc.strerror}",
            fix="set STOKER_HOME to a writable folder on a file system the compute nodes see",
        ) from exc
    for _ in range(10):
        path = base / f"{name}-{stamp}-{secrets.token_hex(2)}"
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return RunDir(path)
    raise StokerError(f"could not create a unique run folder under {base}")
