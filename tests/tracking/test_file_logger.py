"""FileRunLogger (tracking.uri none): RunLogger's calls as records of the spool's format in
one file, the step rule across attempts, every line whole under concurrent writers, and
no mlflow import; `tracking_off` and what refuses the setting."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stoker.errors import StokerError
from stoker.tracking.dataset_inputs import TRAINING, DataSetInput
from stoker.tracking.file_logger import METRICS_FILE, FileRunLogger
from stoker.tracking.spool import Spool
from stoker.tracking.store import resolve_tracking_uri, tracking_off


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_call_is_one_record_of_the_spool_format(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    logger = FileRunLogger(path, "job-7")
    logger.start()
    logger.set_tags({"stoker.device": "cpu"})
    logger.log_params({"train.steps": 4})
    for step in (1, 2, 3):
        logger.log_metrics({"loss": 1.0 / step, "lr": 0.001}, step)
    logger.log_metrics({"loss": float("nan")}, 4)  # a NaN loss is a value like any other
    logger.log_artifact(tmp_path / "samples", "samples/step-4")
    logger.log_checkpoint(4, "/ckpt/step-4", bytes=1000, blocking_s=0.5, background_s=1.5)
    (tmp_path / "final").mkdir()
    logger.log_final_model(tmp_path / "final", step=4)
    logger.log_dataset_inputs(
        [DataSetInput("train", TRAINING, "/data/set", "0123456789abcdef", samples=16)]
    )
    logger.close("FINISHED")

    records = list(Spool(path, "job-7").records())  # the spool's reader reads it
    assert records == lines(path) and all(r["run"] == "job-7" for r in records)
    loss = [(p[3], p[1]) for r in records for p in r.get("m", ()) if p[0] == "loss"]
    assert [s for s, _ in loss] == [1, 2, 3, 4] and loss[0][1] == 1.0
    assert records[0]["t"] == {"stoker.device": "cpu"} and records[1]["p"] == {"train.steps": "4"}
    (artifact,) = [r["a"] for r in records if "a" in r]
    assert artifact == [str(tmp_path / "samples"), "samples/step-4"]
    checkpoint, final = [r["lm"] for r in records if "lm" in r]
    assert checkpoint["name"] == "step-4" and checkpoint["params"]["uri"] == "/ckpt/step-4"
    assert [p[0] for p in checkpoint["metrics"]] == [
        "system/checkpoint/bytes",
        "system/checkpoint/blocking_s",
        "system/checkpoint/background_s",
        "system/checkpoint/bytes_per_s",
    ]
    assert final["name"] == "final" and final["dir"] == str(tmp_path / "final")
    (datasets,) = [r["ds"] for r in records if "ds" in r]
    assert datasets[0]["name"] == "train" and datasets[0]["digest"] == "0123456789abcdef"
    assert records[-1] == {"run": "job-7", "status": "FINISHED"}
    assert logger.written == 2 * 3 + 1 + 4 and logger.dropped == 0


def test_a_requeued_attempt_keeps_each_step_of_a_key_once(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    first = FileRunLogger(path, "123")
    first.start()
    for step in (10, 20, 30):
        first.log_metrics({"loss": float(step)}, step)
    first.close(None)  # stopped for a requeue: no status line
    started = first.run_start_s

    again = FileRunLogger(path, "123")
    again.start()  # resumed from the checkpoint at step 20: steps 30 and 40 again
    assert again.run_start_s is not None and started is not None
    assert again.run_start_s <= started + 1  # the run's start: the first attempt's points
    again.log_metrics({"loss": 31.0, "grad_norm": 1.0}, 30)
    again.log_metrics({"loss": 40.0}, 40)
    again.close("FINISHED")

    points = [p for r in Spool(path, "123").records() for p in r.get("m", ())]
    assert [(p[0], p[3], p[1]) for p in points] == [
        ("loss", 10, 10.0), ("loss", 20, 20.0), ("loss", 30, 30.0),
        ("grad_norm", 30, 1.0), ("loss", 40, 40.0),
    ]  # fmt: skip
    assert again.dropped == 1
    assert lines(path)[-1] == {"run": "123", "status": "FINISHED"}


def test_concurrent_writers_leave_whole_lines(tmp_path: Path) -> None:
    # The trainer, the checkpoint thread and the system sampler share one logger.
    logger = FileRunLogger(tmp_path / METRICS_FILE, "r")
    logger.start()

    def write(name: str) -> None:
        for step in range(1, 301):
            logger.log_metrics({f"{name}/a": step, f"{name}/b": -step}, step)
            logger.set_tags({f"stoker.{name}": str(step)})

    threads = [threading.Thread(target=write, args=(f"t{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    logger.close("FINISHED")
    records = lines(tmp_path / METRICS_FILE)  # every line parses
    assert sum(len(r.get("m", ())) for r in records) == 4 * 300 * 2 == logger.written


def test_a_name_mlflow_would_refuse_raises_at_once(tmp_path: Path) -> None:
    logger = FileRunLogger(tmp_path / METRICS_FILE, "r")
    logger.start()
    with pytest.raises(StokerError, match="metric"):
        logger.log_metrics({"bad key!": 1.0}, 1)
    logger.close(None)


def test_an_unwritable_run_folder_is_an_error_at_start(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StokerError, match="metrics file"):
        FileRunLogger(tmp_path / "file" / METRICS_FILE, "r").start()


def test_nothing_imports_mlflow(tmp_path: Path) -> None:
    # What the GPU machine (no mlflow installed) runs: the logger and the sampler.
    code = f"""
import sys
from pathlib import Path
from stoker.tracking.file_logger import FileRunLogger
from stoker.tracking.system_metrics import SystemSampler
logger = FileRunLogger(Path({str(tmp_path / METRICS_FILE)!r}), "r")
logger.start()
sampler = SystemSampler(logger, interval_s=60)
sampler.start()
logger.log_checkpoint(1, "/c/step-1", bytes=1, blocking_s=0.1, background_s=0.1)
sampler.stop()
logger.close("FINISHED")
assert "mlflow" not in sys.modules, "mlflow imported"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    keys = {p[0] for r in lines(tmp_path / METRICS_FILE) for p in r.get("m", ())}
    assert any(k.startswith("system/") and k.endswith("/memory_gb") for k in keys), keys


def test_tracking_none_is_no_store() -> None:
    assert tracking_off("none") and tracking_off(" None ") and not tracking_off(None)
    assert not tracking_off("sqlite:////x/mlflow.db")
    with pytest.raises(StokerError, match=r"tracking\.uri is none") as caught:
        resolve_tracking_uri("none")
    assert "sqlite:///" in (caught.value.fix or "")


def test_the_setting_is_spelt_none_and_refuses_register_final(tmp_path: Path) -> None:
    from stoker.config import resolve_config
    from stoker.launcher.launch.checks import check_launch

    exp = tmp_path / "exp.yaml"
    exp.write_text("tracking:\n  uri: None\n")  # no YAML null: the word
    resolved = resolve_config(exp, ["train.register_final=av-dit"], use_profile=False)
    assert resolved.config.tracking.uri == "none"
    with pytest.raises(StokerError, match="register_final") as caught:
        check_launch(resolved, None)
    assert "train.register_final=null" in (caught.value.fix or "")
