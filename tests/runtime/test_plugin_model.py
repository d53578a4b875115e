"""A model of the user's own (`model.arch: package.module:factory`) in stoker's trainer:
the example package examples/own_model trains under `stoker run` (2 ranks, FSDP2 over
gloo) from the folder it sits in; each way a plugin can be wrong is refused with the
setting, where it came from and the fix, before anything starts."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import pytest

from stoker.config import resolve_config
from stoker.runtime.models import build_model
from stoker.runtime.models.build import ModelSetupError
from stoker.runtime.models.contract import block_slots, loss_and_metrics
from tests.clirun import stoker, stoker_text

REPO = Path(__file__).resolve().parents[2]
OWN_MODEL = REPO / "examples" / "own_model"

PLUGIN = """
from dataclasses import dataclass
import torch
from torch import nn

raise_on_import = {raise_on_import}
if raise_on_import:
    import no_such_dependency_of_the_plugin

@dataclass
class Args:
    width: int = 4

class Flat(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(width, width), nn.Linear(width, width))
        self.w = nn.Parameter(torch.ones(width))

    def blocks(self):
        return list(self.inner)

    def forward(self, batch):
        return batch["audio"].mean(dim=(1, 2)) * self.w.sum()  # one loss per sample: wrong

def build(data, args: Args):
    return Flat(args.width)

def build_plain(data, depth, scale=1.0):
    return Flat(depth)

def build_nothing(data):
    return 42

def build_no_data(width=32, depth=2):  # a newcomer's factory: no data parameter
    return Flat(width)

def build_keywords(*, width=4):
    return Flat(width)

def build_typed(size: int, width=4):
    return Flat(width)

def build_raises(data):
    raise RuntimeError("out of ideas")

NOT_CALLABLE = 3
"""

# Models for the checks past the factory: metrics by rank, a batch member read.
EXTRA = """
import torch
from torch import nn

class ByRank(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, batch):
        import os
        loss = batch["audio"].float().mean() * self.w.sum()
        return loss, {"seen_by_rank_" + os.environ.get("RANK", "0"): loss.detach()}

def build_rank_metrics(data):
    return ByRank()

class Reads(nn.Module):
    def __init__(self, key):
        super().__init__()
        self.key = key
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, batch):
        batch[self.key]
        return batch["audio"].float().mean() * self.w.sum()

def build_reads(data, member="npy"):
    return Reads(member)

class NoForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

def build_no_forward(data):
    return NoForward()

class ReadsValues(nn.Module):  # meta tensors cannot run it; its loss is per sample
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, batch):
        peak = batch["audio"].abs().max().item()
        return batch["audio"].float().mean(dim=(1, 2)) * self.w / max(peak, 1.0)

def build_reads_values(data):
    return ReadsValues()
"""


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding the package `myplug` (importable from it, as from a job's
    working directory)."""
    package = tmp_path / "myplug"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(PLUGIN.format(raise_on_import=False))
    (package / "broken.py").write_text(PLUGIN.format(raise_on_import=True))
    (package / "extra.py").write_text(EXTRA)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _build(*overrides: str) -> object:
    cfg = resolve_config(None, list(overrides)).config
    return build_model(cfg.model, cfg.data)


@pytest.mark.parametrize(
    ("overrides", "key", "message", "fix"),
    [
        (["model.arch=nosuch.models:build"], "model.arch",
         "no module 'nosuch' in", "run stoker from the folder that holds nosuch/"),
        (["model.arch=myplug.broken:build"], "model.arch",
         "importing myplug.broken raised ModuleNotFoundError", "fix the error in myplug.broken"),
        (["model.arch=myplug.models:buld"], "model.arch",
         "module myplug.models", "name one of its callables: Args, Flat, build, build_keywords"),
        (["model.arch=myplug.models:NOT_CALLABLE"], "model.arch",
         "is a int, not a function or class", "name the function"),
        (["model.arch=myplug.models:build", "model.args.width=wide"], "model.args.width",
         "model.args.width: got 'wide'", "Args takes width"),
        (["model.arch=myplug.models:build", "model.args.depth=2"], "model.args.depth",
         "myplug.models.Args has no field 'depth'", "Args takes width"),
        (["model.arch=myplug.models:build_plain", "model.args.dept=2"], "model.args.dept",
         "takes no argument 'dept'", "use one of: depth, scale"),
        (["model.arch=myplug.models:build_plain"], "model.args.depth",
         "model.args.depth is required", "model.args.depth=VALUE"),
        (["model.arch=myplug.models:build_no_data", "model.args.width=16"], "model.arch",
         "must take the data shapes as its first argument (stoker calls "
         "build_no_data(data, **model.args)), but its first parameter 'width' is set by "
         "model.args.width", "def build_no_data(data: DataShapes, width=32, depth=2)"),
        (["model.arch=myplug.models:build_no_data"], "model.arch",
         "its first parameter 'width' has a default (32)",
         "def build_no_data(data: DataShapes, width=32, depth=2)"),
        (["model.arch=myplug.models:build_keywords"], "model.arch",
         "it takes no positional parameter", "def build_keywords(data: DataShapes, *, width=4)"),
        (["model.arch=myplug.models:build_typed"], "model.arch",
         "its first parameter 'size' is annotated int",
         "def build_typed(data: DataShapes, size: int, width=4)"),
        (["model.arch=myplug.models:build_nothing"], "model.arch",
         "returned int, not a torch.nn.Module", "return the nn.Module"),
        (["model.arch=myplug.models:build_raises"], "model.arch",
         "raised RuntimeError: out of ideas", "fix the factory"),
    ],
)  # fmt: skip
def test_each_plugin_mistake_names_the_setting_and_the_fix(
    plugin_dir: Path, overrides: list[str], key: str, message: str, fix: str
) -> None:
    with pytest.raises(ModelSetupError) as info:
        _build(*overrides)
    assert info.value.key == key
    assert message in info.value.message, info.value.message
    assert info.value.fix is not None and fix in info.value.fix, info.value.fix


def test_a_misspelled_factory_is_named_with_the_modules_own_callables(plugin_dir: Path) -> None:
    """`myplug.models:buld`: a did-you-mean, and only what the module defines (not the
    `dataclass` it imports) as the names to choose from."""
    with pytest.raises(ModelSetupError) as info:
        _build("model.arch=myplug.models:buld")
    assert "has no 'buld' (did you mean build?)" in info.value.message, info.value.message
    assert info.value.fix == (
        "name one of its callables: Args, Flat, build, build_keywords, build_no_data, "
        "build_nothing, build_plain, build_raises, build_typed"
    )


def test_declared_arguments_reach_the_factory_and_blocks_are_found(plugin_dir: Path) -> None:
    import torch

    model = _build("model.arch=myplug.models:build", "model.args.width=3")
    assert isinstance(model, torch.nn.Module)
    assert [name for _, name in block_slots(model)] == ["0", "1"]  # in inner (Sequential)
    # Its forward returns one loss per sample: the trainer refuses it by name.
    batch = {"audio": torch.ones(2, 1, 8)}
    with pytest.raises(Exception, match=r"Flat.forward\(batch\) returned \[2\], not a scalar"):
        loss_and_metrics(model, batch)


def test_a_forward_that_breaks_the_contract_is_refused_before_the_ranks_start(
    plugin_dir: Path,
) -> None:
    """The check `stoker run`, `stoker check` and `stoker submit` make first: the model
    built on the meta device and its forward run on a meta batch of the loader's shapes,
    in a child process; a forward that reads values (`.item()`), which meta tensors
    cannot run, run again for real on one sample on the CPU."""
    from stoker.errors import StokerError
    from stoker.launcher.launch.model_fit import check_all_models_fit, check_model_fits

    with pytest.raises(StokerError) as info:
        check_model_fits(resolve_config(None, ["model.arch=myplug.models:build"]))
    assert "Flat.forward(batch) returned [2], not a scalar loss" in info.value.message
    assert "(model.arch from override model.arch=myplug.models:build)" in info.value.message
    assert info.value.fix is not None and "losses.mean()" in info.value.fix
    reads = "model.arch=myplug.extra:build_reads_values"
    with pytest.raises(StokerError) as info:
        check_model_fits(resolve_config(None, [reads]))
    assert "ReadsValues.forward(batch) returned [1], not a scalar loss" in info.value.message
    # The built-in models pass it (forward on meta tensors included), in one child.
    check_all_models_fit(
        [resolve_config(None, [f"model.arch={a}"]) for a in ("av_dit", "audio_ar")]
    )


def test_a_broken_plugin_is_refused_before_stoker_run_starts_anything(
    plugin_dir: Path, isolated_home: Path
) -> None:
    result = stoker_text("run", "model.arch=myplug.models:buld", cwd=plugin_dir)
    assert result.returncode == 2, result.stderr[-2000:]
    assert ("model.arch 'myplug.models:buld': module myplug.models" in result.stderr
            and "(model.arch from override model.arch=myplug.models:buld)" in result.stderr
            ), result.stderr  # fmt: skip
    assert "fix: name one of its callables: Args, Flat, build" in result.stderr
    assert not (isolated_home / ".stoker" / "runs").exists() or not any(
        (isolated_home / ".stoker" / "runs").iterdir()
    )


def test_the_example_plugin_trains_on_two_ranks_from_its_folder(
    synthetic_av_set: Callable[..., Path], isolated_home: Path
) -> None:
    data = synthetic_av_set(clips=16, size=(64, 64))  # 2 s at 8 fps
    result = stoker(
        "run", "--nproc", "2", "--json", "model.arch=own_model.denoiser:build",
        "model.args.width=32", f"data.url={data}", "data.batch_size=4", "data.num_workers=0",
        "data.prefetch_mb=1", "train.steps=30", "train.log_every=5", "optim.lr=1e-3",
        cwd=OWN_MODEL, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["state"] == "COMPLETED" and summary["step"] == 30
    # The built-in experiment's samples are for its own model: nothing said of sampling
    # the user did not ask for, and the run is named after the user's model, not `tiny`.
    assert "sample_every" not in result.stderr, result.stderr[-3000:]
    assert Path(summary["run_dir"]).name.startswith("own_model-"), summary["run_dir"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{isolated_home / '.stoker' / 'mlflow' / 'mlflow.db'}")
    run = client.get_run(summary["run_id"])
    assert run.data.params["model.arch"] == "own_model.denoiser:build"
    assert run.data.params["model.args.width"] == "32"
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
    assert len(losses) == 6 and losses[-1] < 0.8 * losses[0], losses
    # Its own metric, averaged over the window and the ranks, beside the loss.
    noisy = client.get_metric_history(run.info.run_id, "noisy_mse")
    assert [m.step for m in noisy] == [5, 10, 15, 20, 25, 30]
    assert all(0.02 < m.value < 0.06 for m in noisy)  # noise 0.2: about 0.04
    # Sharded at its blocks: the checkpoint holds the layers' parameters.
    run_dir = Path(summary["run_dir"])
    assert (run_dir / "checkpoints" / "step-30" / "COMMIT.json").is_file()

    # One import rule for every command that builds the model: `plan` and `sample`, which
    # build it in their own process, find the package in the folder as the ranks did.
    for name in [m for m in sys.modules if m.split(".")[0] == "own_model"]:
        del sys.modules[name]  # imported afresh, from the current folder
    planned = stoker_text(
        "plan", "model.arch=own_model.denoiser:build", "model.args.width=32",
        f"data.url={data}", "data.batch_size=4", "--json", cwd=OWN_MODEL,
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert json.loads(planned.stdout)["chosen"]["status"] == "chosen"
    sampled = stoker_text("sample", str(run_dir), "--out", str(run_dir / "clips"), cwd=OWN_MODEL)
    # Found and built: refused only because this example model draws no samples.
    assert sampled.returncode == 2 and "no module" not in sampled.stderr, sampled.stderr
    assert "sample(" in sampled.stderr, sampled.stderr


def test_samples_asked_of_a_model_without_sample_name_its_class_and_say_the_fix_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """train.sample_every set by the user for a model without sample(), sharded by FSDP2
    as on the ranks: the note names the user's class (not FSDP's `FSDPDenoiser`) and
    prints its fix once."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from stoker.runtime.dist.dist_env import detect
    from stoker.runtime.train_samples import TrainSampler
    from tests.runtime.trainer_runs import Recorder

    class Denoiser(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 4)

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        model = fully_shard(Denoiser(), mesh=init_device_mesh("cpu", (1,)))
        cfg = resolve_config(None, ["train.sample_every=5"], use_profile=False).config
        sampler = TrainSampler(
            cfg, detect({}), run_dir=tmp_path, sink=Recorder(), ema=None, autocast=nullcontext
        )
        sampler.check(model)
    finally:
        dist.destroy_process_group()
    said = capsys.readouterr().out
    assert said.startswith(
        "train.sample_every: no samples: Denoiser has no sample() method, and stoker samples "
        "only its built-in models (av_dit, audio_ar) without one\n  fix: give the model a method"
    ), said
    assert said.count("or set train.sample_every=0") == 1, said
    assert sampler.every == 0


def test_a_plugin_module_is_imported_by_name_not_by_path(tmp_path: Path) -> None:
    """A file path is refused by the config (it would not import the same way on
    every rank), with the reason."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        textwrap.dedent("""\
        model:
          arch: myplug/models.py:build
        """)
    )
    result = stoker_text("config", "show", str(exp))
    assert result.returncode == 2
    assert f"{exp}:2: model.arch" in result.stderr
    assert "a module's dotted name, not a file path" in result.stderr


def test_submit_checks_the_model_before_anything_is_created_unless_told_not_to(
    plugin_dir: Path, isolated_home: Path
) -> None:
    """`stoker submit` (here `--local`) of a runtime job runs the same check: a broken
    plugin leaves no run folder, MLflow run or ledger entry; `--no-check` submits it,
    and the ranks then fail with the same message (`stoker why`)."""
    refused = stoker_text("submit", "--local", "model.arch=myplug.models:buld", cwd=plugin_dir)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "model.arch 'myplug.models:buld': module myplug.models" in refused.stderr
    runs = isolated_home / ".stoker" / "runs"
    assert not runs.exists() or not any(runs.iterdir())
    listed = stoker_text("status", "--all", "--json")
    assert json.loads(listed.stdout) == []

    buld = "model.arch=myplug.models:buld"
    sent = stoker_text("submit", "--local", "--no-check", "--json", buld, "train.steps=2",
                       cwd=plugin_dir)  # fmt: skip
    assert sent.returncode == 0, sent.stderr[-2000:]
    job_id = json.loads(sent.stdout.strip().splitlines()[-1])["job_id"]
    followed = stoker_text("logs", "-f", job_id)
    assert "FAILED" in followed.stderr and "has no 'buld'" in followed.stderr, followed.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.arch=myplug.broken:build"],
         "importing myplug.broken raised ModuleNotFoundError"),
        (["model.arch=myplug.extra:build_no_forward"], 'missing the required "forward"'),
        (["model.arch=myplug.models:build"], "Flat.forward(batch) returned [2], not a scalar"),
        (["model.arch=myplug.models:build", "model.args.width=wide"],
         "model.args.width: got 'wide'"),
    ],
    ids=["import-fails", "no-forward", "loss-per-sample", "wrong-argument"],
)  # fmt: skip
def test_check_and_submit_refuse_a_broken_plugin_and_queue_nothing(
    plugin_dir: Path, isolated_home: Path, overrides: list[str], message: str
) -> None:
    """Before anything is queued: `stoker check` fails the model line with the message
    and its fix, and `stoker submit` (to SLURM: the check comes before sbatch) refuses
    with the same, leaving no run folder, MLflow run or ledger entry."""
    checked = stoker_text("check", "--json", *overrides, cwd=plugin_dir)
    assert checked.returncode == 1, checked.stderr[-2000:]
    model = {f["check"]: f for f in json.loads(checked.stdout)}["model"]
    assert model["status"] == "fail" and message in model["detail"], model
    assert model["fix"]
    if "forward" in message and "missing" in message:
        assert "define forward(self, batch)" in model["fix"]

    refused = stoker_text("submit", *overrides, cwd=plugin_dir)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert message in refused.stderr and "fix:" in refused.stderr, refused.stderr
    runs = isolated_home / ".stoker" / "runs"
    assert not runs.exists() or not any(runs.iterdir())
    assert json.loads(stoker_text("status", "--all", "--json").stdout) == []
    mlflow_db = isolated_home / ".stoker" / "mlflow" / "mlflow.db"
    if mlflow_db.exists():
        from mlflow.tracking import MlflowClient

        assert MlflowClient(f"sqlite:///{mlflow_db}").search_runs(["0", "1"]) == []


def test_metrics_named_differently_on_two_ranks_fail_the_run_by_name(
    plugin_dir: Path, isolated_home: Path, synthetic_av_set: Callable[..., Path]
) -> None:
    """The ranks' metrics are averaged by name in one all-reduce: names that differ would
    mix values up or hang it. The first log step compares them and says which."""
    data = synthetic_av_set(clips=8, size=(32, 32), seconds=1.0)
    result = stoker(
        "run", "--nproc", "2", "--json", "model.arch=myplug.extra:build_rank_metrics",
        f"data.url={data}", "data.batch_size=4", "data.num_workers=0", "data.prefetch_mb=1",
        "train.steps=4",
        "train.log_every=2", cwd=plugin_dir, timeout=900,
    )  # fmt: skip
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["state"] == "FAILED", result.stderr[-3000:]
    assert "ByRank.forward returned metrics ['seen_by_rank_" in result.stderr, result.stderr
    assert "return the same metric names on every rank" in result.stderr


def test_a_member_only_the_data_set_knows_is_left_to_the_ranks(
    plugin_dir: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The meta batch holds what the config decides (data.modalities); an array member
    of the data set's own, or a key data.transform adds, cannot be checked there."""
    from stoker.runtime.preflight import check_model

    reads = "model.arch=myplug.extra:build_reads"
    check_model(resolve_config(None, [reads, "model.args.member=latent.npy"]).config)
    assert "reads batch['latent.npy']" in capfd.readouterr().err
    check_model(resolve_config(None, [reads, "model.args.member=text",
                                      "data.modalities=[video,audio,text]"]).config)  # fmt: skip
    with pytest.raises(ModelSetupError) as info:
        check_model(resolve_config(None, [reads, "model.args.member=text"]).config)
    assert "raised KeyError: 'text'" in info.value.message
    assert info.value.fix is not None and "add text to data.modalities" in info.value.fix
