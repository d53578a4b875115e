"""What global rank 0 tells people while it trains: the progress file that
`stoker status` reads (stoker/launcher/watch/status.py documents its keys) and a
line on the console (a rich live line in a terminal, a plain line per log
interval otherwise, which is what a SLURM log wants)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stoker import metric_names as names
from stoker.atomic_write import write_text_atomic
from stoker.protocol import ENV_PROGRESS_FILE, is_straggler

if TYPE_CHECKING:
    from stoker.runtime.observe.stragglers import Slowest


class Progress:
    def __init__(self, total_steps: int, start_step: int, path: Path | None = None) -> None:
        env_path = os.environ.get(ENV_PROGRESS_FILE)
        self.path = path or (Path(env_path) if env_path else None)
        self.total_steps = total_steps
        self.start_step = start_step
        self.started = time.time()
        self._live: Any = None
        if sys.stdout.isatty():
            from rich.console import Console
            from rich.live import Live

            self._live = Live(console=Console(), auto_refresh=False, transient=False)
            self._live.start()

    def eta_s(self, step: int) -> float | None:
        done = step - self.start_step
        if done <= 0:
            return None
        rate = done / max(time.time() - self.started, 1e-9)
        return (self.total_steps - step) / rate

    def update(self, step: int, metrics: dict[str, float], slowest: Slowest | None = None) -> None:
        """`slowest`: the log window's slowest rank (several ranks only)."""
        eta = self.eta_s(step)
        record: dict[str, Any] = {
            "step": step,
            "total_steps": self.total_steps,
            "loss": metrics.get("loss"),
            "samples_per_s": metrics.get(names.SAMPLES_PER_S),
            "tokens_per_s": metrics.get(names.TOKENS_PER_S),
            "eta_s": eta,
            "time": time.time(),
            "started": self.started,
            "start_step": self.start_step,
        }
        if slowest is not None:
            record.update(
                {
                    "slowest_rank": slowest.rank,
                    "slowest_host": slowest.host,
                    "slowest_ratio": slowest.ratio,
                    "slowest_step_s": slowest.step_s,
                    "median_step_s": slowest.median_step_s,
                    "slowest_data_wait_s": slowest.data_wait_s,
                    "median_data_wait_s": slowest.median_data_wait_s,
                }
            )
        if self.path is not None:
            # Whole-file replace: `stoker status` never reads half a record.
            write_text_atomic(self.path, json.dumps(record) + "\n")
        line = self.line(step, metrics, eta, slowest)
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(line), refresh=True)
        else:
            print(line, flush=True)

    def line(
        self,
        step: int,
        metrics: dict[str, float],
        eta: float | None,
        slowest: Slowest | None = None,
    ) -> str:
        parts = [f"step {step}/{self.total_steps}", f"loss {metrics.get('loss', float('nan')):.4f}"]
        if "grad_norm" in metrics:
            parts.append(f"gnorm {metrics['grad_norm']:.3g}")
        if "lr" in metrics:
            parts.append(f"lr {metrics['lr']:.3g}")
        if names.SAMPLES_PER_S in metrics:
            parts.append(f"{metrics[names.SAMPLES_PER_S]:.1f} samples/s")
        if names.MFU in metrics:
            parts.append(f"MFU {100 * metrics['mfu']:.1f}%")
        if eta is not None:
            parts.append(f"ETA {_duration(eta)}")
        if slowest is not None and is_straggler(slowest.ratio, step - self.start_step):
            parts.append(f"straggler: rank {slowest.rank} on {slowest.host} {slowest.ratio:.2f}x")
        return "  ".join(parts)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
