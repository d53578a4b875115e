"""stoker: SLURM-native training of generative video and audio models.

The Python API (stoker/api.py) is here too, loaded on first use so that `import stoker`
stays light on a login node: `stoker.submit(...)` returns a `stoker.Job`
(`state`, `wait`, `logs`, `why`, `cancel`), `stoker.sweep(...)` one per task of a job
array, `stoker.jobs()` lists the ledger. A training loop of your own imports
`from stoker import job` (stoker/job.py) on its ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stoker.version import __version__

if TYPE_CHECKING:
    from stoker.api import Job, jobs, submit, sweep

__all__ = ["Job", "__version__", "jobs", "submit", "sweep"]


def __getattr__(name: str) -> Any:
    if name in ("submit", "sweep", "jobs", "Job"):
        from stoker import api

        return getattr(api, name)
    raise AttributeError(f"module 'stoker' has no attribute {name!r}")
