"""Secrets (tokens, keys, passwords, AWS_* values) never reach MLflow params or tags, the
frozen config, the job script, the ledger or the console. A literal one in a config is
refused without being echoed; `job.pass_env` hands a variable from the submitting
environment to the job by name, and the value is written nowhere."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from stoker.config import ResolvedConfig, resolve_config
from stoker.launcher.script.render import render_sbatch
from stoker.launcher.script.spec import LaunchSpec
from stoker.redact import REDACTED, hide_url_passwords, secret_assignments, secret_word
from stoker.tracking.runs import config_params
from tests.clirun import stoker, stoker_text
from tests.faults.batch_shim import run_batch_script
from tests.launcher_jobs import submit_json, wait_final, wait_local

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"


def a_secret() -> str:
    return f"sk-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
        "WANDB_API_KEY",
        "DB_PASSWORD",
        "MLFLOW_TRACKING_PASSWD",
        "apiKey",
        "GITHUB_AUTH",
        "SSH_KEYS",
        "google_credentials",
        "APIKEY",
        "x-access-token",
    ],
)
def test_secret_names(name: str) -> None:
    assert secret_word(name)


@pytest.mark.parametrize(
    "name",
    ["keep_last", "MONKEY", "AUTHOR", "NCCL_IB_HCA", "TOKENIZERS_PARALLELISM", "KEYRING", "team"],
)
def test_names_that_only_look_like_secrets(name: str) -> None:
    assert secret_word(name) is None


def test_setup_lines_and_urls() -> None:
    assert secret_assignments("export HF_TOKEN=hf_x; cd /x") == ["HF_TOKEN"]
    assert secret_assignments("DB_PASSWORD='lit' python x.py") == ["DB_PASSWORD"]
    # References are not literals.
    assert secret_assignments('HF_TOKEN=$(cat ~/.hf); API_KEY="$OTHER"; X=1') == []
    assert hide_url_passwords("http://me:hunter2@h:5000/x") == "http://me:***@h:5000/x"
    assert hide_url_passwords("s3://bucket/key and ssh://git@host") == (
        "s3://bucket/key and ssh://git@host"
    )


def nothing_created() -> None:
    home = Path(os.environ["STOKER_HOME"])
    runs = home / "runs"
    assert not runs.exists() or not list(runs.iterdir()), "a run folder was created"
    assert not (home / "ledger.sqlite").exists(), "a ledger entry was written"
    assert not (home / "mlflow").exists(), "the MLflow store was touched"


# (experiment file, overrides, profile, what the error names). {S} is the secret.
REFUSED = {
    "job.env in the file": (
        {"job": {"name": "x", "env": {"HF_TOKEN": "{S}"}}},
        [],
        None,
        ["exp.yaml:4", "job.env.HF_TOKEN", "job.pass_env: [HF_TOKEN]"],
    ),
    "an AWS_* variable": (
        {"job": {"env": {"AWS_DEFAULT_REGION": "{S}"}}},
        [],
        None,
        ["exp.yaml:3", "job.env.AWS_DEFAULT_REGION", "AWS_*", "job.pass_env"],
    ),
    "of the wrong type": (
        {"job": {"env": {"WANDB_API_KEY": ["{S}"]}}},
        [],
        None,
        ["job.env.WANDB_API_KEY", "job.pass_env"],
    ),
    "beside a bad entry": (
        {"job": {"env": {"DB_PASSWORD": "{S}", "1BAD": "x"}}},
        [],
        None,
        ["job.env.DB_PASSWORD", "'1BAD' is not an environment variable name"],
    ),
    "an override": (None, ["job.env.HF_TOKEN={S}"], None, ["override job.env.HF_TOKEN=***"]),
    "a tag": (
        {"tracking": {"tags": {"db_password": "{S}"}}},
        [],
        None,
        ["tracking.tags.db_password", "leave it out"],
    ),
    "a setup line": (
        {"job": {"setup": ["export HF_TOKEN={S}"]}},
        [],
        None,
        ["job.setup", "line 1", "HF_TOKEN", "job.pass_env"],
    ),
    "a URL": (
        None,
        ["tracking.uri=http://me:{S}@mlflow:5000"],
        None,
        ["tracking.uri", "http://me:***@mlflow:5000", "MLFLOW_TRACKING_PASSWORD"],
    ),
    "the site profile": (None, [], {"env": {"HF_TOKEN": "{S}"}}, ["profile.yaml:2", "HF_TOKEN"]),
}


def shown_elsewhere(capfd: pytest.CaptureFixture[str]) -> str:
    """What reached the process's stdout and stderr (file descriptors 1 and 2) outside the
    streams a command run in this process (`stoker_text`) writes to: a logging handler or
    a C library would write there, as it would in a `stoker` process of its own."""
    captured = capfd.readouterr()
    return captured.out + captured.err


@pytest.mark.fresh_home  # nothing_created(): not even the MLflow store
@pytest.mark.parametrize("command", ["submit", "config"])
@pytest.mark.parametrize("case", list(REFUSED))
def test_a_literal_secret_is_refused_and_never_echoed(
    case: str, command: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    experiment, overrides, profile, says = REFUSED[case]
    secret = a_secret()
    args: list[str] = []
    env: dict[str, str] = {}
    if experiment is not None:
        exp = tmp_path / "exp.yaml"
        exp.write_text(yaml.safe_dump(experiment, sort_keys=False).replace("{S}", secret))
        args.append(str(exp))
    if profile is not None:
        prof = tmp_path / "profile.yaml"
        prof.write_text(yaml.safe_dump(profile).replace("{S}", secret))
        env["STOKER_PROFILE"] = str(prof)
    args += [o.replace("{S}", secret) for o in overrides]
    if command == "submit":
        argv = ["submit", "--local", *args, "--", "true"]
    else:
        argv = ["config", "show", *args]
    result = stoker_text(*argv, cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: invalid experiment config")
    for text in says:
        assert text in result.stderr, f"{text!r} not in:\n{result.stderr}"
    assert secret not in result.stdout + result.stderr + shown_elsewhere(capfd)
    assert "Traceback" not in result.stderr
    nothing_created()


@pytest.mark.fresh_home  # nothing_created(): not even the MLflow store
def test_a_secret_in_a_sweep_axis_is_refused(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    secret = a_secret()
    result = stoker_text(
        "sweep", "optim.lr=1e-4,3e-4", f"tracking.tags.api_token={secret}", "--", "true",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2 and "tracking.tags.api_token" in result.stderr
    assert secret not in result.stdout + result.stderr + shown_elsewhere(capfd)
    nothing_created()


@pytest.mark.fresh_home  # nothing_created(): not even the MLflow store
def test_a_tracking_uri_with_a_password_in_the_environment_is_refused(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    secret = a_secret()
    result = stoker_text(
        "submit", "--local", "--", "true",
        cwd=tmp_path, env={"MLFLOW_TRACKING_URI": f"https://me:{secret}@mlflow.example"},
    )  # fmt: skip
    assert result.returncode == 2
    assert "https://me:***@mlflow.example" in result.stderr
    assert "MLFLOW_TRACKING_PASSWORD" in result.stderr and secret not in result.stderr
    assert secret not in shown_elsewhere(capfd)
    nothing_created()


@pytest.mark.fresh_home  # nothing_created(): not even the MLflow store
def test_pass_env_that_is_not_set_is_refused_before_anything_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    result = stoker_text("submit", "--local", "job.pass_env=[HF_TOKEN]", "--", "true", cwd=tmp_path)
    assert result.returncode == 2
    assert "job.pass_env (override job.pass_env=[HF_TOKEN]) names HF_TOKEN" in result.stderr
    assert "export HF_TOKEN=" in result.stderr
    nothing_created()


DIGEST_JOB = """\
import hashlib, json, os, sys
names = sys.argv[1:]
seen = {n: hashlib.sha256(os.environ[n].encode()).hexdigest() for n in names if n in os.environ}
with open(os.path.join(os.environ["STOKER_RUN_DIR"], "seen.json"), "w") as f:
    json.dump(seen, f)
print("checked", sorted(seen))  # names only, never a value
"""


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def files_holding(folder: Path, secrets: list[str]) -> list[Path]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if any(s.encode() in data for s in secrets):
                found.append(path)
    return found


def test_a_passed_secret_reaches_the_job_and_is_written_nowhere(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from mlflow.artifacts import download_artifacts
    from mlflow.tracking import MlflowClient

    values = {"HF_TOKEN": a_secret(), "AWS_SECRET_ACCESS_KEY": a_secret()}
    secrets = list(values.values())
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        yaml.safe_dump(
            {
                "job": {
                    "name": "secrets",
                    "pass_env": list(values),
                    "env": {"GREETING": "hello"},
                    "setup": ['test -n "$HF_TOKEN" || exit 9'],
                },
                "tracking": {"tags": {"team": "av"}},
            }
        )
    )
    job_py = tmp_path / "digest_job.py"
    job_py.write_text(DIGEST_JOB)
    submitted = stoker(
        "submit", "--local", "--json", str(exp), "--", sys.executable, str(job_py), *values,
        cwd=tmp_path, env=values,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout.strip().splitlines()[-1])
    run_dir = Path(job["run_dir"])
    state = wait_local(run_dir)
    assert state.state == "COMPLETED", (run_dir / "logs" / "r0" / "rank-0.log").read_text()
    # The job got each value exactly.
    seen = json.loads((run_dir / "seen.json").read_text())
    assert seen == {name: digest(value) for name, value in values.items()}

    # The script passes them by name.
    script = (run_dir / "job.sbatch").read_text()
    assert "for stoker_name in HF_TOKEN AWS_SECRET_ACCESS_KEY; do" in script

    # What stoker printed, now and when asked again.
    shown = [submitted.stdout, submitted.stderr]
    for args in (
        ["status", job["job_id"], "--json"],
        ["logs", job["job_id"]],
        ["config", "show", str(exp)],
        ["submit", "--explain", str(exp), "--", "true"],
    ):
        result = stoker_text(*args, cwd=tmp_path, env=values)
        assert result.returncode == 0, (args, result.stderr)
        shown += [result.stdout, result.stderr, shown_elsewhere(capfd)]
    assert not [text for text in shown if any(s in text for s in secrets)]

    # Every file stoker or the job wrote: run folder, ledger, MLflow store and artifacts.
    home = Path(os.environ["STOKER_HOME"])
    assert (home / "ledger.sqlite").exists() and (home / "mlflow").is_dir()
    assert files_holding(home, secrets) == []
    assert files_holding(tmp_path, secrets) == []

    # MLflow as its users read it: params, tags, and the artifacts downloaded.
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    run = client.get_run(job["run_id"])
    assert run.data.params["job.pass_env"] == "HF_TOKEN,AWS_SECRET_ACCESS_KEY"
    recorded = [*run.data.params.values(), *run.data.tags.values()]
    assert not [v for v in recorded if any(s in v for s in secrets)]
    local = Path(
        download_artifacts(
            run_id=job["run_id"],
            dst_path=str(tmp_path / "artifacts"),
            tracking_uri=client.tracking_uri,
        )
    )
    assert {p.name for p in local.iterdir()} >= {"config.yaml", "job.sbatch"}
    assert files_holding(local, secrets) == []


@pytest.mark.slurm
def test_a_passed_secret_reaches_a_slurm_job(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    """sbatch hands the job the submitting environment (--export=ALL); the script only
    names the variables, srun hands them to the task."""
    values = {"HF_TOKEN": a_secret(), "WANDB_API_KEY": a_secret()}
    job_py = tmp_path / "digest_job.py"
    job_py.write_text(DIGEST_JOB)
    # As docs/user-guide.md writes it: `stoker submit exp.yaml 'job.pass_env=[HF_TOKEN,
    # WANDB_API_KEY]'` (exp.yaml: the tours' examples/tiny.yaml, two ranks).
    job = submit_json(
        str(TINY), "job.pass_env=[HF_TOKEN, WANDB_API_KEY]", "--time", "5",
        "--", sys.executable, str(job_py), *values,
        cwd=tmp_path, env=values,
    )  # fmt: skip
    assert wait_final(job["job_id"]) == "COMPLETED"
    run_dir = Path(job["run_dir"])
    seen = json.loads((run_dir / "seen.json").read_text())
    assert seen == {name: digest(value) for name, value in values.items()}
    home = Path(os.environ["STOKER_HOME"])
    assert files_holding(home, list(values.values())) == []


def spec_for(overrides: list[str], folder: Path, command: list[str]) -> LaunchSpec:
    resolved = resolve_config(overrides=overrides, use_profile=False)
    (folder / "run").mkdir(exist_ok=True)
    return LaunchSpec(
        resolved,
        run_dir=folder / "run",
        command=command,
        workdir=folder,
        tracking_uri=f"sqlite:///{folder / 'mlflow.db'}",
        mlflow_run_ids=["0123456789abcdef"],
    )


def test_the_script_exports_by_name_and_stops_when_one_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    secret = a_secret()
    probe = 'printf "%s" "$HF_TOKEN" | sha256sum | cut -d" " -f1 > "$SHIM_OUT/task"'
    spec = spec_for(["job.pass_env=[HF_TOKEN]"], tmp_path, ["bash", "-c", probe])
    text = render_sbatch(spec).text
    assert secret not in text
    ran = run_batch_script(text, tmp_path, env={"HF_TOKEN": secret})
    assert ran.returncode == 0, ran.stderr
    assert (ran.out / "task").read_text().strip() == digest(secret)

    (ran.out / "task").unlink()
    missing = run_batch_script(text, tmp_path)
    assert missing.returncode == 1
    assert "job.pass_env: HF_TOKEN is not set in the job's environment" in missing.stderr
    assert not (ran.out / "task").exists(), "the task ran without its variable"


def test_params_hide_a_secret_that_got_into_a_config_built_in_code() -> None:
    resolved = resolve_config(use_profile=False)
    job = resolved.config.job.model_copy(update={"env": {"HF_TOKEN": "hf_x", "N": "1"}})
    cfg = resolved.config.model_copy(update={"job": job})
    params = config_params(ResolvedConfig(cfg, resolved.sources))
    assert params["job.env.HF_TOKEN"] == REDACTED and params["job.env.N"] == "1"
