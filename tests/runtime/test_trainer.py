"""The training loop on the real data loader and the tiny model, one CPU
process: a stop request saves and exits for a requeue, the next start resumes
where it stopped and gives the same losses as an uninterrupted run; a run of
non-finite losses aborts with a clear error."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from stoker.errors import StokerError
from stoker.job_time import job_time, read_lines
from stoker.protocol import EXIT_REQUEUE
from stoker.runtime.trainer import Outcome, Trainer
from tests.runtime.trainer_runs import Recorder, built_trainer, trainer_config

# Two threads per step of the tiny model cost 8x the CPU of one on a loaded 2-core machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def data_url(synthetic_av_set: Callable[..., Path]) -> str:
    return str(synthetic_av_set(clips=16, size=(64, 64)))


@dataclass
class Requeued:
    """A 6-step run with an EMA (train.ema_decay=0.8), stopped after step 4 and resumed
    to 6, beside the same run uninterrupted (`straight`): the stop tests and the EMA
    tests ask their questions of one set of runs."""

    run: Path
    first: Recorder
    first_outcome: Outcome
    second: Recorder
    second_outcome: Outcome
    resumed: Trainer
    resumed_start_step: int
    straight_dir: Path
    straight_sink: Recorder
    straight: Trainer


@pytest.fixture(scope="module")
def requeued(
    tmp_path_factory: pytest.TempPathFactory, data_url: str, module_home: dict[str, str]
) -> Iterator[Requeued]:
    tmp_path = tmp_path_factory.mktemp("requeued")
    cfg = trainer_config(tmp_path, data_url, 6, "train.ema_decay=0.8")
    stop_file = tmp_path / "stop-requested"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_torch_thread, for the module
    with pytest.MonkeyPatch.context() as monkeypatch:
        for name, value in module_home.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("STOKER_STOP_FILE", str(stop_file))
        # The stop file appears after step 3: step 4 is finished, then saved.
        first = Recorder(stop_file, stop_at=3)
        run = tmp_path / "run"
        run.mkdir()
        (run / "attempts").write_text(f"{int(time.time())} restart=0 job=1 nodes=here\n")
        first_outcome = built_trainer(cfg, run, first).train()

        stop_file.unlink()
        second = Recorder()
        monkeypatch.setenv("STOKER_RESTART", "1")
        with open(run / "attempts", "a") as attempts:
            attempts.write(f"{int(time.time())} restart=1 job=1 nodes=here\n")
        resumed = built_trainer(cfg, run, second)
        start_step = resumed.start_step
        second_outcome = resumed.train()

    straight_sink = Recorder()
    straight = built_trainer(cfg, tmp_path / "straight", straight_sink)
    straight.train()
    yield Requeued(
        run,
        first,
        first_outcome,
        second,
        second_outcome,
        resumed,
        start_step,
        tmp_path / "straight",
        straight_sink,
        straight,
    )
    torch.set_num_threads(threads)


def test_stop_saves_exits_for_requeue_and_resumes_exactly(requeued: Requeued) -> None:
    run, first, second = requeued.run, requeued.first, requeued.second
    outcome = requeued.first_outcome
    assert (outcome.exit_code, outcome.status, outcome.step) == (EXIT_REQUEUE, "REQUEUE", 4)
    assert (run / "checkpoints" / "step-4" / ".metadata").is_file()
    assert sorted(first.saves) == [4] and first.saves[4]["system/checkpoint/bytes"] > 0

    assert requeued.resumed_start_step == 4
    outcome = requeued.second_outcome
    assert (outcome.exit_code, outcome.status, outcome.step) == (0, "FINISHED", 6)
    assert sorted(second.losses) == [5, 6]

    # Each start's time account: its steps, its saves, how it ended; nothing redone
    # (start 1 resumed from the step start 0 saved last).
    account = job_time(run)
    stopped, resumed = account.starts
    assert (stopped.status, stopped.start_step, stopped.last_step) == ("REQUEUE", 0, 4)
    assert (resumed.status, resumed.start_step, resumed.last_step) == ("FINISHED", 4, 6)
    for start in account.starts:
        assert start.productive > 0 and start.lost["checkpoint"] > 0
        # The requeued start's start-up is the requeue's cost.
        began = "startup" if start.restart == 0 else "restart_requeue"
        assert start.lost["redone"] == 0 and start.lost[began] > 0
    assert 0 < account.goodput < 1  # type: ignore[operator]
    # The saves that committed, as the account saw them (a failed job keeps its work
    # through the newest), and each window's throughput.
    commits = [[line["step"] for line in read_lines(run / "accounting" / f"r{k}.jsonl")
                if line["kind"] == "commit"] for k in (0, 1)]  # fmt: skip
    assert commits == [[4], [6]]
    assert account.samples_per_s is not None and account.samples_per_s > 0

    assert requeued.straight_sink.losses == {**first.losses, **second.losses}


def test_non_finite_losses_skip_then_abort(tmp_path: Path, data_url: str) -> None:
    cfg = trainer_config(tmp_path, data_url, steps=20)
    sink = Recorder()
    trainer = built_trainer(cfg, tmp_path / "run", sink)
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    real_forward = trainer.model.forward  # what the trainer calls (stoker/model.py)
    trainer.model.forward = lambda batch, generator=None: real_forward(batch) * math.nan
    with pytest.raises(StokerError, match="5 steps in a row had a non-finite loss") as err:
        trainer.train()
    assert "optim.lr" in str(err.value)
    # Skipped steps never touched the weights.
    for before, after in zip(weights, trainer.model.parameters(), strict=True):
        assert torch.equal(before, after)
    assert all(math.isnan(v) for v in sink.losses.values())


def test_a_samples_noise_does_not_depend_on_its_batch(tmp_path: Path, data_url: str) -> None:
    """Per-sample generators keyed by stream position: the loss of a batch
    equals the mean of its halves' losses, as 2 ranks would split it."""
    cfg = trainer_config(tmp_path, data_url, steps=1)
    trainer = built_trainer(cfg, tmp_path / "run", Recorder())
    batch = next(trainer._batches())
    with torch.no_grad():
        whole = trainer.model.loss(batch, trainer.noise_for(batch))
        halves = [
            trainer.model.loss(part, trainer.noise_for(part))
            for part in (
                {k: v[:2] if isinstance(v, torch.Tensor) else v for k, v in batch.items()},
                {k: v[2:] if isinstance(v, torch.Tensor) else v for k, v in batch.items()},
            )
        ]
    torch.testing.assert_close(whole, torch.stack(halves).mean(), rtol=1e-6, atol=1e-7)


def test_profile_and_held_out_evaluation(tmp_path: Path, data_url: str) -> None:
    cfg = trainer_config(tmp_path, data_url, 4, "train.profile_steps=[2,3]", "train.eval_every=2",
                  "train.eval_batches=2", f"data.eval_url={data_url}")  # fmt: skip
    sink = Recorder()
    trainer = built_trainer(cfg, tmp_path / "run", sink)
    before = trainer.evaluate()
    assert trainer.evaluate() == before  # the same batches and noise each time
    trainer.train()
    assert sorted(s for s, m in sink.metrics.items() if "eval_loss" in m) == [2, 4]
    assert sink.metrics[4]["eval_loss"] < before  # it learned something
    profile = tmp_path / "run" / "profile"
    trace = (profile / "trace-rank0.json").read_text()
    for phase in ("stoker/data", "stoker/forward", "stoker/backward", "stoker/optimizer"):
        assert phase in trace, phase
    assert "aten::" in (profile / "key-averages-rank0.txt").read_text()
    assert sorted(p.name for p, _ in sink.artifacts) == [
        "key-averages-rank0.txt",
        "trace-rank0.json",
    ]
    assert {a for _, a in sink.artifacts} == {"profile"}


def test_activation_checkpointing_recomputes_the_same_step(tmp_path: Path, data_url: str) -> None:
    """Recomputed activations are the saved ones: selective and full
    checkpointing train to the same losses as none (CPU, fp32)."""
    losses = {}
    for mode in ("none", "selective", "full"):
        cfg = trainer_config(tmp_path, data_url, 3, f"train.activation_checkpointing={mode}",
                      "train.precision=fp32")  # fmt: skip
        sink = Recorder()
        trainer = built_trainer(cfg, tmp_path / mode, sink)
        wrapped = sum("CheckpointWrapper" in type(b).__name__ for b in trainer.model.blocks)
        assert wrapped == {"none": 0, "selective": 2, "full": 4}[mode]
        trainer.train()
        losses[mode] = sink.losses
    assert losses["none"] == losses["selective"] == losses["full"]


def test_stream_positions_stay_on_the_host(tmp_path: Path, data_url: str) -> None:
    """noise_for reads the positions: on a GPU, moving them there would cost a
    device-to-host sync per micro-batch."""
    cfg = trainer_config(tmp_path, data_url, steps=1)
    trainer = built_trainer(cfg, tmp_path / "run", Recorder())
    trainer.device = torch.device("meta")  # any device other than the host's
    batch = next(trainer._batches())
    devices = {k: v.device.type for k, v in batch.items() if isinstance(v, torch.Tensor)}
    assert devices.pop("position") == "cpu"
    assert devices and set(devices.values()) == {"meta"}, devices


def test_the_sink_interface_is_what_the_run_logger_offers() -> None:
    """MetricsSink declares every call the trainer makes on its sink, with RunLogger's
    signatures, and the null sink answers them all: nothing is probed."""
    import inspect

    from stoker.runtime.observe.metrics_sink import MetricsSink, NullSink
    from stoker.tracking.logger import RunLogger

    names = sorted(n for n, v in vars(MetricsSink).items() if inspect.isfunction(v) and n[0] != "_")
    assert names == [
        "log_artifact",
        "log_checkpoint",
        "log_final_model",
        "log_metrics",
        "set_tags",
    ]
    for name in names:
        declared = inspect.signature(getattr(MetricsSink, name))
        assert inspect.signature(getattr(RunLogger, name)) == declared, name
        assert inspect.signature(getattr(NullSink, name)) == declared, name


def test_ema_is_checkpointed_and_resumes_bit_exact(requeued: Requeued, tmp_path: Path) -> None:
    """train.ema_decay: the average moves every step, is saved beside the model, and a
    stopped and resumed run ends with the uninterrupted run's average to the bit."""
    resumed, straight = requeued.resumed, requeued.straight
    assert requeued.first_outcome.step == 4
    assert requeued.resumed_start_step == 4 and resumed.ema is not None
    assert straight.ema is not None
    for name, tensor in straight.ema.state_dict().items():
        assert torch.equal(resumed.ema.state_dict()[name], tensor), name
    params = dict(straight.model.named_parameters())
    assert any(not torch.equal(params[n], t) for n, t in straight.ema.state_dict().items())

    # The exported average is the trainer's.
    from stoker.checkpoint.export import export_weights

    out = tmp_path / "ema.safetensors"
    export_weights(str(requeued.straight_dir / "checkpoints"), str(out), weights="ema")
    from safetensors.torch import load_file

    exported = load_file(str(out))
    assert all(torch.equal(exported[n], t) for n, t in straight.ema.state_dict().items())


def test_ema_from_a_checkpoint_without_one_starts_at_its_weights(
    tmp_path: Path, data_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = trainer_config(tmp_path, data_url, 2)
    built_trainer(plain, tmp_path / "run", Recorder()).train()
    from stoker.checkpoint.export import export_weights

    with pytest.raises(StokerError, match="has no EMA weights") as exc:
        export_weights(str(tmp_path / "run" / "checkpoints"), str(tmp_path / "x"), weights="ema")
    assert exc.value.fix and "train.ema_decay" in exc.value.fix

    trainer = built_trainer(trainer_config(tmp_path, data_url, 4, "train.ema_decay=0.9"),
                       tmp_path / "run", Recorder())  # fmt: skip
    assert "step-2 has no EMA weights" in capsys.readouterr().out
    assert trainer.ema is not None
    params = dict(trainer.model.named_parameters())
    assert all(torch.equal(params[n], t) for n, t in trainer.ema.state_dict().items())
