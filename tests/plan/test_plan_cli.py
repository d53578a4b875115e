"""`stoker plan` as a user runs it: a plan written as an experiment file, trained for
real on two CPU ranks, and the run measured against its plan with `--calibrate` (from
its folder, its job id, and a checkpoint it saved, copied away and on S3); the
1b preset planned for a node of 8 x H100 80GB, each rejected candidate explained; the
errors a user meets first. The plan of a partition SLURM describes is
tests/plan/test_plan_slurm.py's (on the cluster, in the cluster tests' process)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from stoker.config import resolve_config
from tests.clirun import stoker, stoker_text

if TYPE_CHECKING:
    from tests.s3_server import S3Server

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "examples" / "tiny.yaml")


def test_plan_write_run_and_calibrate_on_two_cpu_ranks(tmp_path: Path, s3_env: S3Server) -> None:
    planned = tmp_path / "planned.yaml"
    result = stoker_text("plan", TINY, "data.batch_size=4", "--json", "--write", str(planned))
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["target"]["world"] == 2 and plan["target"]["gpu"] == "cpu"
    chosen = plan["chosen"]
    assert chosen["status"] == "chosen" and chosen["buckets"][0]["peak_bytes"] > 0
    cfg = resolve_config(planned, use_profile=False).config
    assert cfg.train.grad_accum == chosen["grad_accum"]
    assert cfg.train.activation_checkpointing == chosen["activation_checkpointing"]
    assert cfg.job.ntasks_per_node == 2 and cfg.data.batch_size == 4
    # No loader workers: the plan is of the ranks' memory; a worker is a fork server
    # preloading torch and av in each rank (seconds of CPU).
    run = stoker("run", str(planned), "train.steps=3", "train.log_every=1",
                 "train.measure_memory=true", "data.num_workers=0", "--json",
                 timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    done = json.loads(run.stdout.strip().splitlines()[-1])
    for which in (done["run_dir"], done["job_id"]):  # a run folder or a ledger job id
        calibrated = stoker_text("plan", "--calibrate", which, "--json")
        assert calibrated.returncode == 0, calibrated.stderr
        report = json.loads(calibrated.stdout)
        (shape,) = report["shapes"]
        assert shape["source"] == "memory tracker" and shape["measured_step_s"] > 0
        # The trainer's own step (noise, metrics, the ranks' agreement) against the plan.
        assert abs(shape["memory_error"]) < 0.10, shape
    text = stoker_text("plan", "--calibrate", done["run_dir"]).stdout
    assert "PEAK RUN" in text and "ERROR" in text

    # A checkpoint carries its config and what the steps had measured when it committed:
    # its root alone calibrates, copied away from the run folder and on S3.
    import s3fs

    away = tmp_path / "bucket" / "checkpoints"
    shutil.copytree(Path(done["run_dir"]) / "checkpoints", away)
    (step,) = [p.name for p in away.iterdir() if p.name.startswith("step-")]
    on_s3 = f"s3://{s3_env.new_bucket()}/exp/checkpoints"
    s3fs.S3FileSystem().put(str(away / step), f"{on_s3}/{step}", recursive=True)
    for root in (str(away), on_s3):
        carried = stoker_text("plan", "--calibrate", root, "--json", env=s3_env.env)
        assert carried.returncode == 0, carried.stderr
        from_checkpoint = json.loads(carried.stdout)
        assert from_checkpoint["source"] == f"{root}/{step}"
        (checked,) = from_checkpoint["shapes"]
        assert checked["measured_bytes"] == shape["measured_bytes"] > 0
        assert checked["planned_bytes"] == shape["planned_bytes"]
    shown = stoker_text("plan", "--calibrate", str(away), env=s3_env.env).stdout
    assert f"Plan against checkpoint {step} (cpu, 2 ranks)" in shown


def test_the_1b_preset_on_eight_h100s_is_chosen_and_explained() -> None:
    result = stoker_text("plan", str(ROOT / "examples" / "plan-1b.yaml"), "--gpus-per-node", "8",
                         "--gpu", "H100", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["target"]["gpu"] == "H100 SXM" and plan["target"]["world"] == 8
    chosen = plan["chosen"]
    assert chosen is not None and chosen["precision"] == "bf16"
    usable = plan["target"]["usable_bytes"]
    # Every bucket gets its micro-batch; the chosen one fits each with its allowances.
    assert [b["micro_batch"] for b in chosen["buckets"]] == [
        128 // 8 // chosen["grad_accum"], 64 // 8 // chosen["grad_accum"],
        32 // 8 // chosen["grad_accum"]]  # fmt: skip
    assert all(0 < b["peak_bytes"] < usable for b in chosen["buckets"])
    others = [c for c in plan["candidates"] if c["status"] != "chosen"]
    assert len(others) == len(plan["candidates"]) - 1 and all(c["reason"] for c in others)
    # Ranked before the chosen one (as fast or faster): each too big, naming the bucket
    # that does not fit and what fills it. After it: slower, said by how much.
    statuses = [c["status"] for c in plan["candidates"]]
    at = statuses.index("chosen")
    before, after = plan["candidates"][:at], plan["candidates"][at + 1 :]
    assert before and all(c["status"] == "too big" and "bucket" in c["reason"]
                          and "activations" in c["reason"] for c in before)  # fmt: skip
    assert all(c["status"] == "slower" and "x the chosen step time" in c["reason"]
               for c in after)  # fmt: skip
    settings = plan["settings"]
    assert settings["train.precision"] == "bf16" and settings["job.gpus_per_node"] == 8


def test_the_plan_says_what_peak_and_needs_are(tmp_path: Path) -> None:
    """PEAK in the tables and `needs` in the verdict differ by the GPU's allowances; a
    line under the tables says so, with the figures the fit is judged by. The plan is
    docs/plan.md's `--gpus-per-node 8 --gpu H200 --nodes 4`, for an experiment whose
    batch splits over 32 ranks."""
    experiment = yaml.safe_load(Path(TINY).read_text())
    experiment["data"]["batch_size"] = 32
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(experiment))
    result = stoker_text("plan", "exp.yaml", "--gpus-per-node", "8", "--gpu", "H200", "--nodes",
                         "4", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "planning for the flags: 4 x 8 H200" in result.stderr
    settings = result.stdout.splitlines()[-1]
    assert settings.startswith("settings: job.nodes=4 job.gpus_per_node=8 job.ntasks_per_node=8 ")
    lines = result.stdout.splitlines()
    legend = next(i for i, line in enumerate(lines) if line.startswith("PEAK: "))
    assert lines[legend] == (
        "PEAK: the most the step's tensors hold at once on a rank (traced); needs: PEAK x 1.10 "
        "(allocator slack) + 768 MiB (CUDA context) + 512 MiB per NCCL communicator, which "
        "must fit in the usable memory (less --margin, 5%)"
    )
    assert ": needs " in lines[legend + 1] and " of 133.9 GiB" in lines[legend + 1]


def test_errors_name_the_value_and_the_fix(tmp_path: Path) -> None:
    no_type = stoker_text("plan", TINY, "--gpus-per-node", "8")
    assert no_type.returncode != 0
    assert "GPU type is not known" in no_type.stderr and "--gpu" in no_type.stderr
    for memory in ([], ["--gpu-memory", "32GB"]):  # no stand-in GPU's figures, either way
        unknown = stoker_text("plan", TINY, "--gpus-per-node", "8", "--gpu", "Voodoo5", *memory)
        assert unknown.returncode != 0 and "'Voodoo5' is not in stoker's table" in unknown.stderr
    # 5 clips split over no data-parallel width: not 4 ranks, not 2 CP groups of 2, and
    # CP 4 does not split a 0.25 s clip's 10 audio tokens.
    odd = stoker_text(
        "plan", TINY, "data.batch_size=5", "data.clip_seconds=0.25", "--gpus-per-node", "4",
        "--gpu", "H100",
    )  # fmt: skip
    assert odd.returncode != 0
    assert "data.batch_size: a global batch of 5 does not split over 4 ranks" in odd.stderr
    assert "use a multiple of 4" in odd.stderr
    empty = tmp_path / "run"
    empty.mkdir()
    nothing = stoker_text("plan", "--calibrate", str(empty))
    assert nothing.returncode != 0 and "has no measured-steps.json" in nothing.stderr
    missing = stoker_text("plan", "--calibrate", "no-such-job")
    assert "neither a run folder, a checkpoint nor a job in the ledger" in missing.stderr


# A newcomer's model: its forward reads a value (`.item()`), which fake tensors lack.
READS_A_VALUE = """\
import torch
from torch import nn

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, batch):
        scale = batch["audio"].abs().max().item()
        return (batch["audio"].float().mean() * self.w).sum() / max(scale, 1.0)

def build(data):
    return Scaled()
"""


def test_a_model_that_reads_values_is_named_with_its_line_from_its_folder(
    tmp_path: Path,
) -> None:
    """From the folder that holds the package, as `stoker run` finds it (the same import
    rule in every command); the planner cannot trace `.item()` on fake tensors, and says
    so with the model's line and what to do, not with FakeTensor's traceback."""
    (tmp_path / "valueplug").mkdir()
    (tmp_path / "valueplug" / "__init__.py").write_text("")
    (tmp_path / "valueplug" / "model.py").write_text(READS_A_VALUE)
    planned = stoker_text("plan", "model.arch=valueplug.model:build", cwd=tmp_path)
    assert planned.returncode == 2, planned.stderr
    model_file = tmp_path / "valueplug" / "model.py"
    assert (
        "valueplug.model:build: the planner runs the model on fake tensors (shapes, no values), "
        f"and its code reads a tensor's value (.item(), float(t), a Python `if` on a tensor) "
        f"at {model_file}:10 (aten._local_scalar_dense.default)"
    ) in planned.stderr, planned.stderr
    assert "fix: keep values in tensors there" in planned.stderr
    assert "Traceback" not in planned.stderr
