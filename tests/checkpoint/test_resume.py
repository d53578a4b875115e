"""Resuming training from checkpoints, through the real Trainer and
Checkpointer (DCP, COMMIT.json), on a local folder and on s3:// (the S3 API
server):

- bit-exact: 20 steps straight vs 10, stop, save, load, 10 give identical
  losses and identical final weights (one CPU process);
- 4 ranks save, 2 ranks resume: the same samples at every step as a straight
  run on 2 ranks, and losses within floating-point tolerance;
- a rank SIGKILLed inside an async save leaves that step uncommitted; the next
  start resumes from the one before;
- a flipped byte in a committed shard: `ckpt verify` fails naming the
  file, the next start falls back with a warning; a folder cut short (no
  .metadata) is passed over.

The straight runs the resumes are compared with are the same for either storage: each
runs once per module, on a local folder (a 2-rank one, started by torchrun, costs ~16
CPU-s, most of it start-up). The other multi-rank runs are started by tests/local_ranks.py,
which sets torchrun's variables without torchrun's own imports. fp32 throughout: the
tests compare losses across processes (`train.precision: auto` is bf16 on a CPU with
native bf16).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from stoker.checkpoint import commit as ck
from stoker.config import ExperimentConfig, resolve_config
from stoker.data.synthetic.shapes import synth_dataset
from stoker.errors import StokerError
from stoker.protocol import EXIT_REQUEUE
from stoker.runtime.dist.dist_env import detect
from stoker.runtime.observe.metrics_sink import MetricsOnlySink
from stoker.runtime.trainer import Trainer
from tests import local_ranks
from tests.clirun import stoker_text
from tests.s3_server import S3Server

REPO = Path(__file__).resolve().parents[2]
RANK_MAIN = Path(__file__).with_name("rank_main.py")


@pytest.fixture(scope="module")
def data_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("data") / "synth")
    synth_dataset(url, clips=16, seconds=2.0, size=(64, 64), fps=8)
    return url


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where checkpoints go: a local folder, or a bucket on the S3 API server."""
    if request.param == "local":
        return str(tmp_path / "checkpoints")
    server: S3Server = request.getfixturevalue("s3_env")
    import s3fs

    bucket = f"ckpt-{os.getpid()}-{time.monotonic_ns()}"
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": server.endpoint}).mkdir(bucket)
    return f"s3://{bucket}/run"


def _experiment(tmp_path: Path, data_url: str, root: str, **sections: dict[str, Any]) -> Path:
    spec: dict[str, Any] = {
        "data": {"url": data_url, "batch_size": 4, "num_workers": 0},
        "train": {"steps": 20, "log_every": 1, "seed": 3, "precision": "fp32"},
        "optim": {"warmup_steps": 2},
        "checkpoint": {"root": root, "every": 5, "keep_last": 2},
    }
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    path = tmp_path / f"exp-{len(list(tmp_path.glob('exp-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


class Recorder(MetricsOnlySink):
    def __init__(self, stop_file: Path | None = None, stop_at: int | None = None) -> None:
        self.losses: dict[int, float] = {}
        self.saves: dict[int, dict[str, float]] = {}
        self.stop_file, self.stop_at = stop_file, stop_at

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        if "loss" in metrics:
            self.losses[step] = metrics["loss"]
        if "system/checkpoint/bytes" in metrics:
            self.saves[step] = metrics
        if step == self.stop_at and self.stop_file is not None:
            self.stop_file.touch()


def _train(cfg: ExperimentConfig, run_dir: Path, sink: Recorder) -> tuple[Trainer, int]:
    trainer = Trainer(cfg, detect({}), torch.device("cpu"), run_dir=run_dir, sink=sink)
    trainer.build()
    outcome = trainer.train()
    trainer.checkpointer.close()
    return trainer, outcome.exit_code


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.fixture(scope="module")
def straight_twenty_steps(
    tmp_path_factory: pytest.TempPathFactory, data_url: str
) -> tuple[dict[int, float], dict[str, torch.Tensor]]:
    """test_resume_is_bit_exact's run without a stop, saving to a local folder: its
    losses and final weights."""
    tmp_path = tmp_path_factory.mktemp("straight-20")
    exp = _experiment(tmp_path, data_url, str(tmp_path / "checkpoints"))
    cfg = resolve_config(exp, use_profile=False).config
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_torch_thread
    try:
        straight = Recorder()
        reference, _ = _train(cfg, tmp_path / "run", straight)
    finally:
        torch.set_num_threads(threads)
    return straight.losses, _weights(reference)


@pytest.mark.usefixtures("one_torch_thread")  # 13 s, but 164 s on 2 busy threads
def test_resume_is_bit_exact(
    tmp_path: Path,
    data_url: str,
    root: str,
    monkeypatch: pytest.MonkeyPatch,
    straight_twenty_steps: tuple[dict[int, float], dict[str, torch.Tensor]],
) -> None:
    cfg = resolve_config(_experiment(tmp_path, data_url, root), use_profile=False).config
    stop_file = tmp_path / "stop-requested"
    monkeypatch.setenv("STOKER_STOP_FILE", str(stop_file))

    first = Recorder(stop_file, stop_at=9)  # the stop is seen in step 10: saved there
    _, code = _train(cfg, tmp_path / "run", first)
    assert code == EXIT_REQUEUE and sorted(first.losses) == list(range(1, 11))
    assert sorted(first.saves) == [5, 10]  # every save reported with its metrics
    assert all(m["system/checkpoint/bytes"] > 0 and m["system/checkpoint/blocking_s"] >= 0
               for m in first.saves.values())  # fmt: skip
    assert [r.step for r in ck.list_checkpoints(root) if r.committed] == [10, 5]

    stop_file.unlink()
    second = Recorder()
    resumed, code = _train(cfg, tmp_path / "run", second)
    assert code == 0 and resumed.start_step == 10 and sorted(second.losses) == list(range(11, 21))

    straight_losses, expected = straight_twenty_steps
    assert straight_losses == {**first.losses, **second.losses}  # identical, not close
    final = _weights(resumed)
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[k], expected[k]) for k in final)
    # Retention: the last two, of 5, 10, 15, 20.
    assert [r.step for r in ck.list_checkpoints(root)] == [20, 15]


@pytest.mark.usefixtures("one_torch_thread")
def test_broken_newest_checkpoint_falls_back_with_a_warning(
    tmp_path: Path,
    data_url: str,
    root: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    exp = _experiment(tmp_path, data_url, root, train={"steps": 10}, checkpoint={"keep_last": 5})
    cfg = resolve_config(exp, use_profile=False).config
    _train(cfg, tmp_path / "run", Recorder())
    assert [r.step for r in ck.list_checkpoints(root)] == [10, 5]

    from fsspec.core import url_to_fs

    fs, base = url_to_fs(root)
    shard = f"{base}/step-10/__0_0.distcp"
    data = bytearray(fs.cat_file(shard))
    data[len(data) // 2] ^= 0x01
    fs.pipe_file(shard, bytes(data))
    # A save cut short at step 15: shards but no .metadata, no commit.
    fs.makedirs(f"{base}/step-15", exist_ok=True)
    fs.pipe_file(f"{base}/step-15/__0_0.distcp", b"x" * 100)

    quick = stoker_text("ckpt", "verify", f"{root}/step-10", "--sizes-only")
    assert quick.returncode == 0, quick.stderr  # same size: only the checksum shows it
    full = stoker_text("ckpt", "verify", f"{root}/step-10")
    assert full.returncode == 1 and "__0_0.distcp: sha256" in full.stdout + full.stderr

    capsys.readouterr()
    more = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 12})})
    trainer, code = _train(more, tmp_path / "run", Recorder())
    err = capsys.readouterr().err
    assert trainer.start_step == 5 and code == 0
    assert "falling back to step-5: step-15 is broken: not committed" in err
    assert "falling back to step-5: step-10 is broken: __0_0.distcp: sha256" in err

    # Every committed checkpoint broken: the run stops, naming each, and trains nothing
    # again from step 0, unless told to.
    for row in ck.list_checkpoints(root):
        if row.committed:
            shard = f"{url_to_fs(row.path)[1]}/__0_0.distcp"
            data = bytearray(fs.cat_file(shard))
            data[len(data) // 2] ^= 0x01
            fs.pipe_file(shard, bytes(data))
    committed = [r.step for r in ck.list_checkpoints(root) if r.committed]
    stopped = Trainer(more, detect({}), torch.device("cpu"), run_dir=tmp_path / "run",
                      sink=Recorder())  # fmt: skip
    with pytest.raises(StokerError) as info:
        stopped.build()
    assert f"{len(committed)} committed checkpoint(s) under {root}, none verifies" in str(
        info.value
    )
    for step in committed:
        assert f"step-{step} is broken: __0_0.distcp: sha256" in info.value.message
    assert "checkpoint.if_none_verifies=start_fresh" in (info.value.fix or "")
    fresh_cfg = more.model_copy(update={
        "checkpoint": more.checkpoint.model_copy(update={"if_none_verifies": "start_fresh"})
    })  # fmt: skip
    fresh = Trainer(fresh_cfg, detect({}), torch.device("cpu"), run_dir=tmp_path / "run",
                    sink=Recorder())  # fmt: skip
    capsys.readouterr()
    fresh.build()
    fresh.checkpointer.close()
    assert fresh.start_step == 0
    assert "starting from step 0 (checkpoint.if_none_verifies=start_fresh)" in (
        capsys.readouterr().err
    )


def _ranks(nproc: int, *args: str, run_dir: Path, out: Path, timeout: float = 300,
           wait: bool = True, torchrun: bool = False) -> subprocess.Popen[str]:  # fmt: skip
    """rank_main.py on `nproc` ranks: started by tests/local_ranks.py, which gives them
    torchrun's variables without torchrun's 2.5 CPU-s of imports, or by torchrun itself
    (one run of the module: the ranks as docs/runtime.md says torchrun starts them)."""
    from tests.mlflow_server import free_port

    rank_args = [str(RANK_MAIN), "--run-dir", str(run_dir), "--out", str(out), *args]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-port", str(free_port()), *rank_args]  # fmt: skip
    else:
        cmd = local_ranks.command(nproc, *rank_args)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run_dir.mkdir(parents=True, exist_ok=True)
    log = (run_dir / f"ranks-{out.stem}.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    if wait:
        proc.wait(timeout=timeout)
    return proc


def _log(run_dir: Path, name: str) -> str:
    return (run_dir / f"ranks-{name}.log").read_text()


def _result(out: Path) -> dict[str, Any]:
    data = json.loads(out.read_text())
    data["losses"] = {int(k): v for k, v in data["losses"].items()}
    data["positions"] = {int(k): v for k, v in data["positions"].items()}
    return data


def _four_ranks_experiment(tmp_path: Path, data_url: str, root: str) -> Path:
    return _experiment(tmp_path, data_url, root, data={"batch_size": 8},
                       checkpoint={"every": 0}, train={"steps": 12})  # fmt: skip


@pytest.fixture(scope="module")
def straight_two_ranks(tmp_path_factory: pytest.TempPathFactory, data_url: str) -> dict[str, Any]:
    """test_four_ranks_save_two_ranks_resume's run on 2 ranks without a stop, saving to
    a local folder: rank_main.py's OUT.json."""
    tmp_path = tmp_path_factory.mktemp("straight-2-ranks")
    straight_exp = _four_ranks_experiment(tmp_path, data_url, str(tmp_path / "checkpoints"))
    ref = _ranks(2, "--config", str(straight_exp), run_dir=tmp_path / "straight",
                 out=tmp_path / "c.json", torchrun=True)  # fmt: skip
    assert ref.returncode == 0, _log(tmp_path / "straight", "c")
    return _result(tmp_path / "c.json")


def test_four_ranks_save_two_ranks_resume(
    tmp_path: Path, data_url: str, root: str, straight_two_ranks: dict[str, Any]
) -> None:
    exp = _four_ranks_experiment(tmp_path, data_url, root)
    run = tmp_path / "run"
    four = _ranks(4, "--config", str(exp), "--stop-at", "5", run_dir=run,
                  out=tmp_path / "a.json")  # fmt: skip
    assert four.returncode == 0, _log(run, "a")
    saved = _result(tmp_path / "a.json")
    assert saved["exit_code"] == EXIT_REQUEUE and sorted(saved["losses"]) == list(range(1, 7))
    commit = ck.read_commit(f"{root}/step-6")
    assert commit is not None and commit.world_size == 4

    (run / "stop-requested").unlink()
    two = _ranks(2, "--config", str(exp), run_dir=run, out=tmp_path / "b.json")
    assert two.returncode == 0, _log(run, "b")
    resumed = _result(tmp_path / "b.json")
    assert resumed["start_step"] == 6 and resumed["exit_code"] == 0

    straight = straight_two_ranks
    # The exact data stream: the same samples at every step, 4 ranks then 2.
    assert {**saved["positions"], **resumed["positions"]} == straight["positions"]
    for step in range(1, 13):
        expected = straight["losses"][step]
        got = saved["losses"].get(step, resumed["losses"].get(step))
        assert got == pytest.approx(expected, rel=1e-4), step
    # Resharding loses nothing: 2 ranks hold exactly the state 4 ranks saved.
    stopped = torch.load(tmp_path / "a.pt", weights_only=True)
    loaded = torch.load(tmp_path / "b.loaded.pt", weights_only=True)
    _assert_equal(loaded, stopped)


def _assert_equal(got: Any, expected: Any, where: str = "state") -> None:
    if isinstance(expected, dict):
        assert got.keys() == expected.keys(), where
        for key in expected:
            _assert_equal(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, torch.Tensor):
        assert torch.equal(got, expected), where
    else:
        assert got == expected, where


def test_rank_killed_during_async_save_leaves_it_uncommitted(
    tmp_path: Path, data_url: str, root: str
) -> None:
    exp = _experiment(tmp_path, data_url, root, train={"steps": 14}, checkpoint={"keep_last": 5})
    run = tmp_path / "run"
    proc = _ranks(2, "--config", str(exp), "--hold-step", "10", run_dir=run,
                  out=tmp_path / "a.json", wait=False)  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not list(run.glob("held-*")):
            assert proc.poll() is None, _log(run, "a")
            assert time.monotonic() < deadline, "rank 1 never reached the write of step-10"
            time.sleep(0.2)
        (held,) = run.glob("held-*")
        os.kill(int(held.name.removeprefix("held-")), signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    rows = {r.step: r for r in ck.list_checkpoints(root)}
    assert rows[5].committed and not rows[10].committed
    assert ck.read_commit(f"{root}/step-10") is None

    again = _ranks(2, "--config", str(exp), run_dir=run, out=tmp_path / "b.json")
    assert again.returncode == 0, _log(run, "b")
    result = _result(tmp_path / "b.json")
    assert result["start_step"] == 5 and result["exit_code"] == 0
    assert "falling back to step-5: step-10 is broken: not committed" in _log(run, "b")
    assert [r.step for r in ck.list_checkpoints(root) if r.committed] == [14, 10, 5]
