"""Helpers of the trainer tests: an experiment on a data set, a metrics sink that
records (and can ask for a stop), and a built trainer, all in one CPU process."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import yaml

from stoker.config import ExperimentConfig, resolve_config
from stoker.runtime.dist.dist_env import detect
from stoker.runtime.observe.metrics_sink import MetricsOnlySink
from stoker.runtime.trainer import Trainer


def trainer_config(tmp_path: Path, data_url: str, steps: int, *overrides: str) -> ExperimentConfig:
    """Batches of 4 clips fetched ahead by 1 MB (about 25 clips of the synthetic sets):
    the default 256 MB is some 6,000 small clips read at each loader start, 3 CPU-s of a
    6-step run that take 1."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        "data": {"url": data_url, "batch_size": 4, "num_workers": 0, "prefetch_mb": 1},
        "train": {"steps": steps, "log_every": 1, "seed": 3},
        "optim": {"warmup_steps": 2},
        "checkpoint": {"every": 0, "keep_last": 2},
    }))  # fmt: skip
    return resolve_config(exp, list(overrides), use_profile=False).config


class Recorder(MetricsOnlySink):
    """The trainer's metrics sink; can ask for a stop at a given step."""

    def __init__(self, stop_file: Path | None = None, stop_at: int | None = None) -> None:
        self.losses: dict[int, float] = {}
        self.metrics: dict[int, dict[str, float]] = {}
        self.saves: dict[int, dict[str, float]] = {}
        self.artifacts: list[tuple[Path, str | None]] = []
        self.stop_file, self.stop_at = stop_file, stop_at

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if "system/checkpoint/bytes" in metrics:  # a committed save (MetricsOnlySink)
            self.saves[step] = dict(metrics)
            return
        self.losses[step] = metrics["loss"]
        self.metrics[step] = dict(metrics)
        if step == self.stop_at and self.stop_file is not None:
            self.stop_file.touch()

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.artifacts.append((path, artifact_path))


def built_trainer(cfg: ExperimentConfig, run_dir: Path, sink: Recorder) -> Trainer:
    trainer = Trainer(cfg, detect({}), torch.device("cpu"), run_dir=run_dir, sink=sink)
    trainer.build()
    return trainer
