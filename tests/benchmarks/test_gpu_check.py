"""scripts/gpu-check, rehearsed on the CPU: `--dry-run` runs every part at tiny shapes
(kernels in Triton's interpreter, one tiny inductor compile, the rest eager) with
mlflow, av, soundfile, submitit and moto blocked, as on the GPU machine where they are
missing; a part past its deadline is stopped and keeps what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check"
PARTS = ("kernels", "plan", "step", "tests", "sample", "run", "more_steps")


# At nice 19 beside the cluster tests, parts took 2-3x their dry-run deadlines
# (benchmarks/gpu_check/parts.py): the test asks whether each part works, so it gives
# them 4x; a part that hangs still ends at its deadline, and the whole within the bound.
@pytest.mark.timeout(1500)
def test_the_dry_run_passes_every_part_without_the_modules_the_gpu_machine_lacks(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--deadline-scale", "4", str(out)],
        capture_output=True, text=True, timeout=1450, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    # What the device tool brings back: at most 8 files, all at the top of $OUT.
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert files == sorted([*(f"{p}.json" for p in PARTS), "gpu-check.log"])
    docs = {p: json.loads((out / f"{p}.json").read_text()) for p in PARTS}
    for name, doc in docs.items():
        assert doc["status"] == "ok", (name, doc.get("log_tail"))
        env = doc["environment"]
        assert env["torch"] and env["triton"] and env["python"], env
        # The blocker held in every part's process, though the suite has them all.
        assert {"mlflow", "av", "soundfile", "submitit", "moto"} <= set(env["unavailable"])
    kernels = docs["kernels"]["rows"]
    assert {r["kernel"] for r in kernels} >= {"rms_norm", "swiglu", "rope", "cross_entropy"}
    # The interpreter ran stoker's kernels: they agree with the fp64 reference.
    assert all(r["error"]["stoker_fwd"] < 1e-5 and r["error"]["stoker_bwd"] < 1e-5 for r in kernels)
    assert any("compile" in r["ms"] for r in kernels)  # the one inductor compile
    assert docs["plan"]["rows"][0]["planned_peak_bytes"] > 0
    assert {r["variant"] for r in docs["step"]["rows"]} == {"stoker", "reference"}
    assert docs["tests"]["rows"][0]["skipped"] >= 3  # the GPU-only tests collect and skip
    assert docs["sample"]["skipped"], "data encode is skipped with its reason"
    run = docs["run"]["rows"][0]
    assert run["exit_code"] == 0 and run["loss_records"] and run["committed"]
    assert any(r.get("setup") == "latent" for r in docs["more_steps"]["rows"])
    table = done.stdout[done.stdout.rindex("GPU check on") :]
    assert all(f" {p} " in table for p in PARTS) and "torch" in table


def test_a_part_past_its_deadline_is_stopped_and_keeps_its_rows(tmp_path: Path) -> None:
    (tmp_path / "slow_part.py").write_text(
        textwrap.dedent("""
        import time
        from benchmarks.gpu_check.result import PartResult

        def main(out_dir, *, dry_run):
            result = PartResult(out_dir, "slow", dry_run=dry_run)
            result.add_row({"finished": 1})
            print("row written", flush=True)
            time.sleep(600)
    """)
    )
    driver = textwrap.dedent(f"""
        import io, json, sys
        from pathlib import Path
        from benchmarks.gpu_check import orchestrate
        from benchmarks.gpu_check.parts import Part

        out = Path({str(tmp_path / "out")!r}); out.mkdir()
        env = orchestrate._child_env(None, True, out)
        env["PYTHONPATH"] = {str(tmp_path)!r} + ":" + env["PYTHONPATH"]
        env[orchestrate.ENV_VARIABLE] = json.dumps({{"torch": "-", "python": "-"}})
        part = Part("slow", "z", "slow_part", 3, 3, "sleeps")
        doc = orchestrate.run_part(part, out, env, 3, True, io.StringIO())
        print(json.dumps(doc))
    """)
    done = subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    assert doc["status"] == "timeout" and doc["rows"] == [{"finished": 1}]
    assert doc["wall_s"] < 60 and "row written" in doc["log_tail"]


def test_a_deadline_scale_is_for_the_dry_run_only(tmp_path: Path) -> None:
    for args, says in (
        (["--deadline-scale", "3", str(tmp_path)], "--deadline-scale 3.0 is for --dry-run only"),
        (["--dry-run", "--deadline-scale", "0", str(tmp_path)], "give a factor above 0"),
    ):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())  # refused before anything ran
