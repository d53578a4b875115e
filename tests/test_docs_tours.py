"""The docs' tours, run: each page's shell blocks in the order a reader meets them, every
`stoker` command in this process (tests.clirun.stoker_text: the installed command's
argument splitting, errors and exit status, no new interpreter per command), in a
temporary folder with its own HOME and STOKER_HOME. The blocks are read by
tests/test_docs_commands.py's reader, which also checks every line against the CLI.

A command runs as the page writes it, with:
- its stand-ins made real by what the tour made before: RUN, `<run>` and `runs/exp1` the
  tour's newest run folder (`.../checkpoints/step-2000` its newest checkpoint), JOB,
  1234 and `local-1` its newest job; `exp.yaml` is examples/tiny.yaml copied into the
  folder; paths outside it (`~/`, `/tmp/`, `/shared/`, `/var/lib/`) moved into it;
  `s3://bucket/...` a bucket of the suite's S3 server; `~/raw-media`, "your media", a
  few loose clips from `stoker data synth --files`;
- `train.steps=2 data.num_workers=0 train.sample_every=0` appended to a `stoker run`
  (two steps, the loader in the rank, no samples: the tour is about the commands, the
  training is tested elsewhere), whose built-in synthetic set is a small one linked
  into STOKER_HOME (8 clips instead of 256 written on first use).
A command shown with its output (a ```console block) is checked loosely against it: each
output line's first two words on one line of what it printed, the exit status non-zero
when the page shows an `error:` (or the command is a SHOWN_FAILING one).

What cannot run here cheaply is named in COVERED with the existing test that runs it:
SLURM jobs (the cluster tests are the suite's critical path: no new job for this),
`stoker plan` traces, data a user has (`mypkg.encoders`), the suite itself. The test
checks that each named test exists and that every entry is still a command of a page;
VARIANTS says which of them their test runs otherwise than as written, how and why (GPUs,
a user's package); NOT_RUN_YET lists, with why, what no test runs yet.
"""

from __future__ import annotations

import ast
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.clirun import stoker_text
from tests.test_docs_commands import COMMANDS, REPO, SHOWN_FAILING, DocCommand, shell_commands

TRAIN_FAST = ("train.steps=2", "data.num_workers=0", "train.sample_every=0")

# A command (its words as the shell splits them, comment dropped) -> the test that runs it.
_DOCS = "tests/test_docs.py::"
_OWN_CODE, _CLUSTER, _DATA = (
    _DOCS + "test_own_code_tour_runs_in_order",  # 20 steps of a plugin and of the own loop
    "tests/test_docs_cluster.py::test_jobs_tour_runs_on_the_cluster",
    _DOCS + "test_data_tour_runs_in_order",  # pack, encode, inspect, bench: ~10 CPU-s
)
_STATUS, _LOGS, _WHY = (
    "tests/launcher/test_status.py::",
    "tests/launcher/test_logs.py::",
    "tests/launcher/test_why.py::",
)
_SUBMIT, _PLAN = "tests/launcher/test_submit.py::", "tests/plan/test_plan_cli.py::"
_PLAN_1B = _PLAN + "test_the_1b_preset_on_eight_h100s_is_chosen_and_explained"  # 2 min of tracing
_PLAN_RUN = _PLAN + "test_plan_write_run_and_calibrate_on_two_cpu_ranks"
_PLAN_SLURM = "tests/plan/test_plan_slurm.py::test_a_partitions_gpus_come_from_sinfo"
_LS_VERIFY = "tests/checkpoint/test_commit.py::test_cli_ls_and_verify"
_EXPORT = "tests/checkpoint/test_export.py::"
_BUILTIN_RUN = "tests/runtime/test_run_cli.py::test_stoker_run_trains_the_builtin_experiment"
_PACK = "tests/data/test_pack.py::test_slurm_array_packs_like_local"
COVERED = {
    # README: its own-code, SLURM and data tours, as written, in tests/test_docs.py.
    "stoker init --plugin my_model my-model": _OWN_CODE,
    "stoker check experiment.yaml": _OWN_CODE,
    "stoker run experiment.yaml train.steps=20": _OWN_CODE,
    "stoker run examples/own_loop/experiment.yaml train.steps=20 -- python "
    "examples/own_loop/train.py": _OWN_CODE,
    "stoker run examples/own_loop/experiment.yaml -- python examples/own_loop/train.py": _OWN_CODE,
    "stoker doctor": _CLUSTER,
    "stoker submit examples/own_loop/experiment.yaml --nodes 2 --explain -- python "
    "examples/own_loop/train.py": _CLUSTER,
    "stoker submit --nodes 2 --ntasks-per-node 2 -- python -c import os; "
    "print(os.environ['RANK'], os.environ['WORLD_SIZE'])": _CLUSTER,
    "stoker status --all": _CLUSTER,
    "stoker submit --local --ntasks-per-node 2 -- python -c import os; "
    "print(os.environ['RANK'])": _CLUSTER,
    "stoker data synth raw --clips 16 --seconds 4 --files": _DATA,
    "stoker data pack raw packed --clip-seconds 2 --workers 2 --json": _DATA,
    "stoker data encode packed latents -e stoker.data.tiny_encoder:build": _DATA,
    "stoker data inspect packed --frames 2": _DATA,
    "stoker data bench packed --workers 2 --batches 8": _DATA,
    # docs/bring-your-own.md: a package of the user's (mypkg), SLURM jobs.
    "stoker check exp.yaml model.args.width=256": "tests/cli/test_check.py::"
    "test_a_sound_experiment_passes_every_check",
    "stoker run model.arch=own_model.denoiser:build model.args.width=32": "tests/runtime/"
    "test_plugin_model.py::test_the_example_plugin_trains_on_two_ranks_from_its_folder",
    "stoker submit experiment.yaml": "tests/runtime/test_slurm_plugin.py::"
    "test_the_plugin_model_resumes_bit_exact_after_a_requeue_under_hsdp",
    "stoker submit examples/own_loop/experiment.yaml --nodes 2 --ntasks-per-node 8 -- python "
    "examples/own_loop/train.py --width 256": "tests/runtime/own_loop/test_slurm_own_loop.py::"
    "test_the_own_loop_resumes_bit_exact_after_a_requeue_under_hsdp",
    # docs/checkpoints.md's synopses; README's tour runs each on a run of its own.
    "stoker ckpt ls PATH --json": _LS_VERIFY,
    "stoker ckpt verify PATH --sizes-only": _LS_VERIFY,
    "stoker ckpt export PATH OUT --format safetensors --dtype bf16 --full --force --json "
    "--register NAME --tracking-uri URI": "tests/checkpoint/test_export.py::test_cli",
    "stoker ckpt prune PATH --keep-last K --keep-every M --dry-run --json": "tests/checkpoint/"
    "test_retention.py::test_prune_command",
    # docs/data.md: a user's encoder and data set, a SLURM array, a latent run.
    "stoker data encode /shared/av-v1 /shared/av-v1-vae8 -e mypkg.encoders:build --args "
    "weights=/ckpt/vae.safetensors --args channels=8 data.resolution=[256,256] "
    "data.clip_seconds=2 --batch-size 16": "tests/data/test_encode.py::"
    "test_latents_are_the_encoders_output_and_the_manifest_names_encoder_and_source",
    "stoker data encode /shared/av-v1 /shared/av-v1-vae8 -e mypkg.encoders:build --slurm "
    "--gpus-per-node 1 --time 4:00:00 -p gpu": "tests/data/test_encode_slurm.py::"
    "test_an_encode_array_killed_in_one_task_is_finished_by_a_rerun",
    "stoker data inspect /shared/av-v1-vae8": "tests/data/test_encode.py::"
    "test_latents_are_the_encoders_output_and_the_manifest_names_encoder_and_source",
    "stoker run data.url=/shared/av-v1-vae8 data.modalities=[latent]": "tests/runtime/"
    "test_latent_training.py::test_the_av_dit_learns_on_latents_on_two_ranks",
    # docs/jobs.md: SLURM jobs, each command run by the test of the module that owns it.
    "stoker submit exp.yaml train.steps=2000 --nodes 2 --gpus-per-node 8 --time 04:00:00": (
        _SUBMIT + "test_dry_run_script_passes_sbatch_test_only"
    ),
    "stoker submit --nodes 2 --ntasks-per-node 2 -- python my_train.py --lr 3e-4": (
        _SUBMIT + "test_two_nodes_four_ranks_all_reduce"
    ),
    "stoker submit exp.yaml --json": "tests/runtime/test_slurm_training.py::"
    "test_four_ranks_on_two_nodes_train_like_one",
    "stoker status": _STATUS + "test_plain_output_is_aligned_and_colourless",
    "stoker status 1234 --json": _STATUS + "test_array_id_and_task_id_select_rows",
    "stoker status --watch": _STATUS + "test_watch_refreshes_on_a_terminal_until_ctrl_c",
    "stoker logs 1234 -f": _LOGS + "test_follow_crosses_the_requeue_and_ends_with_the_job",
    "stoker logs 1234 --rank 3 --grep loss": _LOGS + "test_rank_grep_tail_and_restart_filters",
    "stoker why 1234": _WHY + "test_failing_rank_and_its_traceback",
    "stoker cancel 1234": "tests/launcher/test_local_backend.py::"
    "test_cancel_stops_a_local_job_and_requeue_continues_it_in_its_run_folder",
    "stoker requeue 1234": _SUBMIT + "test_stoker_requeue_restarts_without_the_hold",
    "stoker requeue 1234 --hold": "tests/faults/test_load.py::"
    "test_a_finished_job_requeued_with_hold_waits_for_its_release",
    "stoker sweep exp.yaml optim.lr=1e-4,3e-4,1e-3 train.seed=1,2 --max-parallel 2": (
        "tests/launcher/test_sweep.py::test_six_task_sweep_is_one_array_with_six_child_runs"
    ),
    # docs/plan.md: traces of a 1B model, a partition's GPUs from sinfo.
    "stoker plan examples/plan-1b.yaml --gpus-per-node 8 --gpu H100": _PLAN_1B,
    "stoker plan EXP.yaml k=v --partition gpu": _PLAN_SLURM,
    "stoker plan EXP.yaml --gpus-per-node 8 --gpu H200 --nodes 4": _PLAN
    + "test_the_plan_says_what_peak_and_needs_are",
    "stoker plan EXP.yaml --partition gpu --write planned.yaml": _PLAN_SLURM,
    "stoker submit planned.yaml": _PLAN_SLURM,
    "stoker plan --calibrate RUN": _PLAN_RUN,
    "stoker plan --calibrate s3://bucket/exp1/checkpoints": _PLAN_RUN,
    # docs/runtime.md: the built-in experiment's 1200 steps; a run without MLflow or PyAV
    # (blocked); the synopses of `sample` and `bench step` (GPU options, a CPU here).
    "stoker run": _BUILTIN_RUN,
    "stoker run model.args.prediction=data model.args.loss=data model.args.time_shift=3 "
    "model.args.pixel_patch=[2,16,16] optim.lr=0.003 train.steps=1000": _BUILTIN_RUN,
    "stoker run train.steps=50": "tests/tracking/test_outage.py::"
    "test_tracking_server_outage_mid_run_loses_and_repeats_no_step",
    "stoker run --nproc 1 tracking.uri=none data.modalities=[latent]": "tests/runtime/"
    "test_run_without_mlflow.py::test_one_rank_trains_on_synthetic_latents_without_mlflow_or_pyav",
    "stoker sample CHECKPOINT_OR_RUN --out DIR --seed S --steps N --method heun --prompt P "
    "--cfg W --weights auto --device cuda --log": "tests/runtime/test_conditioning.py::"
    "test_stoker_sample_takes_prompts_and_guidance",
    "stoker bench step --arch av_dit --size 1b --batch-size N --variants "
    "stoker,reference,compile,stoker+compile --steps 20 --warmup 5 --resolution 256x256 --fps 8 "
    "--clip-seconds 2 --activation-checkpointing none --device auto --out benchmarks/results "
    "--json": "tests/runtime/test_bench_step.py::test_bench_step_writes_the_result_document",
    # docs/kernels.md: the kernels benchmark's synopsis (its sizes take minutes on a CPU).
    "stoker bench kernels --kernels rms_norm,... --tokens 4096,16384,65536 --hidden "
    "1024,2048,3072,4096 --vocab 8192,32768,65536 --modes fwd,bwd,fwd+bwd --baselines "
    "eager,compile,compile_max_autotune,liger --reps 30 --json": "tests/kernels/test_bench.py::"
    "test_bench_kernels_writes_the_result_document",
    # docs/data.md: a pack as a SLURM array, its rows and a failed task's story.
    "stoker data pack ./raw /shared/av-v1 --clip-seconds 4 --slurm --time 2:00:00 -p cpu": _PACK,
    "stoker status 1234": _PACK,
    "stoker why 1234_3": _PACK,
    # docs/runtime.md: export's synopsis; a registered export on an MLflow server.
    "stoker ckpt export PATH OUT --format safetensors --dtype bf16 --full --force --json": (
        "tests/checkpoint/test_export.py::test_cli"
    ),
    "stoker ckpt export runs/exp1/checkpoints model.safetensors --register av-dit-small "
    "--tracking-uri URI": "tests/tracking/test_model_registry.py::"
    "test_a_version_carries_the_lineage_and_the_exported_bytes",
    # docs/user-guide.md: a secret passed to a SLURM job.
    "stoker submit exp.yaml job.pass_env=[HF_TOKEN, WANDB_API_KEY]": "tests/faults/"
    "test_secrets.py::test_a_passed_secret_reaches_a_slurm_job",
}

# The COVERED commands whose test runs them otherwise than as written (beyond the
# stand-ins made real and fewer steps), and why: what this suite cannot run as written.
VARIANTS = {
    "stoker submit exp.yaml train.steps=2000 --nodes 2 --gpus-per-node 8 --time 04:00:00": (
        "--gpus-per-node 4 (the local nodes' GPUs, which are GRES counts, not GPUs), "
        "--dry-run and `sbatch --test-only`: a trainer job on GPUs needs GPUs"
    ),
    "stoker submit experiment.yaml": "the plugin's settings as overrides, 2 nodes x 2 ranks, "
    "a few steps: its 300 steps on 256 clips are minutes of CPU on the cluster",
    "stoker submit examples/own_loop/experiment.yaml --nodes 2 --ntasks-per-node 8 -- python "
    "examples/own_loop/train.py --width 256": "--ntasks-per-node 2: the local nodes have 2 CPUs",
    "stoker data encode /shared/av-v1 /shared/av-v1-vae8 -e mypkg.encoders:build --args "
    "weights=/ckpt/vae.safetensors --args channels=8 data.resolution=[256,256] "
    "data.clip_seconds=2 --batch-size 16": "the suite's tiny encoder and data set for a "
    "user's VAE and theirs; resolution, clip length and batch size in tests of their own",
    "stoker data encode /shared/av-v1 /shared/av-v1-vae8 -e mypkg.encoders:build --slurm "
    "--gpus-per-node 1 --time 4:00:00 -p gpu": "the suite's tiny encoder, on the CPU",
    "stoker plan EXP.yaml k=v --partition gpu": "the local GRES names no GPU model: the test "
    "sees it refused with the fix (--gpu), then runs it with --gpu H100",
    "stoker submit planned.yaml": "--dry-run for a partition's plan (a rank per GPU), "
    "`stoker run` for the local CPUs' plan",
    "stoker sample CHECKPOINT_OR_RUN --out DIR --seed S --steps N --method heun --prompt P "
    "--cfg W --weights auto --device cuda --log": "on the CPU; --weights in test_export.py's "
    "sample test, --log in test_model_registry.py's",
    "stoker bench step --arch av_dit --size 1b --batch-size N --variants "
    "stoker,reference,compile,stoker+compile --steps 20 --warmup 5 --resolution 256x256 --fps 8 "
    "--clip-seconds 2 --activation-checkpointing none --device auto --out benchmarks/results "
    "--json": "on the CPU, at the tiny size: a 1B step is a GPU's work",
    "stoker bench kernels --kernels rms_norm,... --tokens 4096,16384,65536 --hidden "
    "1024,2048,3072,4096 --vocab 8192,32768,65536 --modes fwd,bwd,fwd+bwd --baselines "
    "eager,compile,compile_max_autotune,liger --reps 30 --json": "on the CPU, at small sizes",
    "stoker sweep exp.yaml optim.lr=1e-4,3e-4,1e-3 train.seed=1,2 --max-parallel 2": (
        "with a command that prints each task's settings in the trainer's place (six "
        "trainer jobs: a minute of CPU each)"
    ),
    "stoker submit exp.yaml job.pass_env=[HF_TOKEN, WANDB_API_KEY]": "with a command that "
    "digests what it got, not the trainer",
    "stoker submit exp.yaml --json": "with --nodes 2 --ntasks-per-node 2 and a few steps",
    "stoker logs 1234 --rank 3 --grep loss": "rank 1 and its `line=N` lines: the test's job has "
    "2 ranks that print no loss",
    "stoker run train.steps=50": "with MLflow's server behind a proxy taken down mid-run",
    "stoker run model.args.prediction=data model.args.loss=data model.args.time_shift=3 "
    "model.args.pixel_patch=[2,16,16] optim.lr=0.003 train.steps=1000": "the built-in "
    "experiment, whose settings these are, for its 1200 steps",
}

# Commands no test runs yet, and why: a known gap, kept in sight.
NOT_RUN_YET: dict[str, str] = {}

# Commands that are not the user's: the suite's own, for those who work on stoker.
THE_SUITE_ITSELF = ("make", ".venv/bin/", "scripts/")


@dataclass
class Tour:
    """What a reader has made so far, following one page."""

    folder: Path
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    runs: list[Path] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    buckets: dict[str, str] = field(default_factory=dict)
    waiting: list[DocCommand] = field(default_factory=list)
    ran: int = 0


class NoRunYet(Exception):
    """The command names a run or job, and the tour has made none yet."""


def covered_key(words: list[str]) -> str:
    return " ".join(words)


def pages() -> dict[str, list[DocCommand]]:
    found: dict[str, list[DocCommand]] = {}
    for command in COMMANDS:
        found.setdefault(command.where.split(":")[0], []).append(command)
    return found


PAGES = pages()


def shown_output(command: DocCommand) -> list[str]:
    """The output lines a page shows under a `$ ` command, up to the next command."""
    page, line = command.where.split(":")
    lines = (REPO / page).read_text().splitlines()[int(line) - 1 :]
    if not lines[0].startswith("$ "):
        return []
    shown = []
    for text in lines[1:]:
        if text.startswith(("$ ", "```")):
            break
        if text.strip() and text.strip() != "...":
            shown.append(text)
    return shown


def real_word(word: str, tour: Tour) -> str:
    """A page's stand-in made real by what the tour made before (see the docstring)."""
    if word in ("RUN", "<run>") or word.startswith("runs/exp1"):
        if not tour.runs:
            raise NoRunYet(word)
        run = tour.runs[-1]
        if word.endswith("/step-2000"):
            return str(max((run / "checkpoints").glob("step-*/COMMIT.json")).parent)
        return str(run) + word.removeprefix("runs/exp1").removeprefix("RUN").removeprefix("<run>")
    if word in ("JOB", "1234", "local-1"):
        if not tour.jobs:
            raise NoRunYet(word)
        return tour.jobs[-1]
    if word.startswith("s3://bucket/"):
        return "s3://" + tour.buckets["bucket"] + word.removeprefix("s3://bucket")
    if "=" in word and not word.startswith("-"):
        key, value = word.split("=", 1)
        return f"{key}={real_word(value, tour)}" if value else word
    if word.startswith("~/"):
        return str(Path.home() / word[2:])
    for outside in ("/tmp/", "/shared/", "/var/lib/"):
        if word.startswith(outside):
            return str(tour.folder / outside.strip("/") / word.removeprefix(outside))
    return word


def linked_small_set(words: list[str], cwd: Path) -> None:
    """The built-in synthetic set of this `stoker run`'s data settings, small (8 clips):
    linked where `data.url: null` looks for it, so the run writes no 256 clips."""
    from stoker.config import resolve_config
    from stoker.data.synthetic.default_set import MIN_SECONDS, synthetic_data_path
    from stoker.data.synthetic.shapes import synth_dataset

    args = words[: words.index("--")] if "--" in words else words
    experiment = next((cwd / w for w in args if w.endswith(".yaml")), None)
    overrides = [w for w in args if "=" in w and not w.startswith("-")]
    data = resolve_config(experiment, overrides, use_profile=False).config.data
    link = synthetic_data_path(data)
    if data.url is not None or "latent" in data.modalities or link.exists():
        return
    small = link.with_name(link.name + "-small")
    synth_dataset(
        str(small),
        clips=8,
        seconds=max(MIN_SECONDS, 2 * data.clip_seconds),
        size=(data.resolution[0], data.resolution[1]),
        fps=data.fps,
        sample_rate=data.sample_rate,
    )
    link.symlink_to(small, target_is_directory=True)


def run_stoker(words: list[str], command: DocCommand, tour: Tour) -> None:
    words = [real_word(w, tour) for w in words]
    if words[1] == "run":
        at = words.index("--") if "--" in words else len(words)
        words[at:at] = TRAIN_FAST
        linked_small_set(words[1:], tour.cwd)
    result = stoker_text(*words[1:], cwd=tour.cwd, env=tour.env)
    printed = result.stdout + result.stderr
    shown = shown_output(command)
    failing = (bool(shown) and shown[0].startswith("error:")) or any(
        word in command.line for word in SHOWN_FAILING
    )
    said = f"{command.where}: {' '.join(words)} exited {result.returncode}:\n{printed[-3000:]}"
    assert (result.returncode != 0) == failing, said
    if any(word in command.line for word in SHOWN_FAILING):  # a config error: usage, 2
        assert result.returncode == 2 and "(did you mean " in printed, said
    for line in shown:
        first, second = [*line.split(), ""][:2]
        headline = rf"{re.escape(first)}\s+{re.escape(second)}"
        assert re.search(headline, printed), f"{command.where}: no `{first} {second}`\n{printed}"
    tour.runs += [Path(p) for p in re.findall(r"^run folder:? (\S+)$", printed, re.M)]
    tour.jobs += re.findall(r"^job (local-\d+) ", printed, re.M)
    tour.ran += 1


def walk(command: DocCommand, tour: Tour) -> None:
    """One command line of the page; one on a run the page has not made yet (README's
    checkpoints, before its samples) waits for the page's first run."""
    try:
        walk_now(command, tour)
    except NoRunYet:
        tour.waiting.append(command)
        return
    while tour.runs and tour.waiting:
        walk_now(tour.waiting.pop(0), tour)


def walk_now(command: DocCommand, tour: Tour) -> None:
    for words in shell_commands(command.line):
        if words[0] == "cd":
            tour.cwd = (tour.cwd / real_word(words[1], tour)).resolve()
        elif words[0] == "export":
            name, value = words[1].split("=", 1)
            tour.env[name] = real_word(value, tour)
        elif covered_key(words) in COVERED or covered_key(words) in NOT_RUN_YET:
            continue
        elif words[0] == "stoker":
            run_stoker(words, command, tour)
        else:
            assert words[0].startswith(THE_SUITE_ITSELF), f"{command.where}: {words}"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_pages_tour_runs_in_order(
    page: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each page's shell blocks in order, in one folder, as the module docstring says."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    shutil.copy(REPO / "examples" / "tiny.yaml", tmp_path / "exp.yaml")
    (Path.home() / "proj").mkdir()  # user-guide.md's `cd ~/proj`
    shutil.copy(REPO / "examples" / "tiny.yaml", Path.home() / "proj" / "exp.yaml")
    tour = Tour(folder=tmp_path, cwd=tmp_path)
    if any("~/raw-media" in c.line for c in PAGES[page]):  # "your media": two 8 s clips
        media = ("synth", str(Path.home() / "raw-media"), "--clips", "2", "--seconds", "8")
        stoker_text("data", *media, "--files", check=True)
    if any("s3://bucket/" in c.line for c in PAGES[page]):
        tour.buckets["bucket"] = request.getfixturevalue("s3_env").new_bucket()
    for command, before in zip(PAGES[page], [None, *PAGES[page]], strict=False):
        if before is not None and before.block != command.block:
            tour.cwd = tmp_path  # each block starts where the page does: a clone's root
        walk(command, tour)
    assert not tour.waiting, f"{page} uses a run it never makes: {tour.waiting}"


def test_every_command_of_a_page_is_run_or_covered() -> None:
    """COVERED names tests that exist, and only commands a page still shows."""
    shown = {covered_key(w) for c in COMMANDS for w in shell_commands(c.line)}
    assert sorted((set(COVERED) | set(NOT_RUN_YET)) - shown) == []
    assert sorted(set(VARIANTS) - set(COVERED)) == []
    ran_here = {k for k in shown if k.startswith("stoker ")} - set(COVERED) - set(NOT_RUN_YET)
    assert len(ran_here) >= 28, sorted(ran_here)  # the tours run most of what they show
    for test in set(COVERED.values()):
        path, name = test.split("::")
        tree = ast.parse((REPO / path).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in names, f"{test} is no test"
