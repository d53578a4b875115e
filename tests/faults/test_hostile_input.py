"""Hostile and bad input through the real CLI entry point and the config and render
functions: wrong types, unknown keys, negative and huge sizes, unicode, shell
metacharacters, path traversal. Every case is either one clear error (exit 2, the
message names the key, no traceback, nothing created: no run folder, no ledger entry, no
MLflow run) or a safe job (a script that `bash -n` accepts, a run folder inside the runs
folder, values that reach the task verbatim and never execute)."""

from __future__ import annotations

import functools
import io
import json
import os
import shlex
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest
import typer
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from stoker.cli.main import main
from stoker.config import ExperimentConfig, resolve_config
from stoker.config.keys import dotted, leaf_paths
from stoker.errors import StokerError
from stoker.launcher.launch.checks import check_run_root
from stoker.launcher.script.render import render_sbatch
from stoker.launcher.script.spec import LaunchSpec
from tests.faults.batch_shim import run_batch_script

# Each would leave a file named PWNED behind if a shell ever ran it.
INJECTIONS = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "'; touch PWNED; '",
    '"; touch PWNED; "',
    "a\ntouch PWNED",
    "x;touch PWNED",
    "|touch PWNED",
    "&& touch PWNED #",
    "$(IFS=,;touch${IFS}PWNED)",
    "\\'$(touch PWNED)",
]
ODD = [
    "../../../../tmp/evil",
    "..",
    "/etc/passwd",
    "",
    " ",
    "-rf",
    "--help",
    "é",
    "名前",
    "🎬",
    "\t",
    "\r\n",
    "%j%%",
    "#",
    "{{ 7*7 }}",
    "{% raw %}",
    "*",
    "~",
    "$HOME",
    "\\",
    "a b",
    "null",
    "[1, 2",
    "\x00",
    "\udcff",  # a byte that is not UTF-8, as Python decodes it from argv
]
TEXT = st.one_of(
    st.sampled_from(INJECTIONS + ODD),
    st.text(max_size=24),
    st.lists(st.sampled_from(INJECTIONS + ODD), min_size=2, max_size=3).map("".join),
)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
)
SCALARS = st.one_of(TEXT, NUMBERS, st.booleans(), st.none())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
    max_leaves=6,
)

DEFAULTS = ExperimentConfig().model_dump(mode="json", by_alias=True)
SECTIONS: dict[str, list[str]] = {}
for _path in leaf_paths(ExperimentConfig):
    SECTIONS.setdefault(_path[0], []).append(_path[1])
# Keys where any text may be a valid value.
TEXT_KEYS = {
    "tracking.run_name",
    "tracking.experiment",
    "data.url",
    "data.eval_url",
    "checkpoint.root",
    "job.constraint",
    "job.env.A",
    "tracking.tags.t",
}
FREE_KEYS = st.sampled_from(["A", "NCCL_IB_HCA", "HF_TOKEN", "AWS_REGION", "1BAD", "a b", "t"])


@st.composite
def experiment_docs(draw: st.DrawFn) -> object:
    """A YAML document: the right sections and keys, with values that are the default,
    hostile text, a number out of range, or of the wrong type; or, one time in two,
    hostile text only where the schema takes any text (a job may well come of it)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(VALUES)  # not a mapping at all
    plausible = draw(st.booleans())
    doc: dict[str, object] = {}
    for _ in range(draw(st.integers(0, 3))):
        section = draw(st.sampled_from(list(SECTIONS)) if plausible else st.one_of(
            st.sampled_from(list(SECTIONS)), TEXT
        ))  # fmt: skip
        if section not in SECTIONS or (not plausible and draw(st.integers(0, 9)) == 0):
            doc[section] = draw(VALUES)
            continue
        body: dict[str, object] = {}
        for _ in range(draw(st.integers(0, 4))):
            keys = st.sampled_from(SECTIONS[section])
            key = draw(keys if plausible else st.one_of(keys, TEXT))
            default = DEFAULTS[section].get(key)
            if isinstance(default, dict):  # job.env, tracking.tags
                names = FREE_KEYS if not plausible else st.sampled_from(["A", "NCCL_X", "t"])
                body[key] = draw(st.dictionaries(names, TEXT if plausible else SCALARS, max_size=3))
            elif plausible:
                takes_text = f"{section}.{key}" in TEXT_KEYS
                body[key] = draw(
                    st.one_of(st.just(default), TEXT) if takes_text else st.just(default)
                )
            else:
                body[key] = draw(st.one_of(st.just(default), TEXT, NUMBERS, VALUES))
        doc[section] = body
    return doc


KEYS = [dotted(p) for p in leaf_paths(ExperimentConfig)] + ["job.env.A", "tracking.tags.t"]
OVERRIDES = st.one_of(
    st.lists(
        st.tuples(st.one_of(st.sampled_from(KEYS), TEXT), st.one_of(TEXT, NUMBERS.map(str))).map(
            "=".join
        ),
        max_size=3,
    ),
    st.lists(st.tuples(st.sampled_from(sorted(TEXT_KEYS)), TEXT).map("=".join), max_size=3),
)
FLAG_NAMES = ["--nodes", "--ntasks-per-node", "--gpus-per-node", "--time", "--mem", "--name"]
FLAG_NAMES += ["--partition", "--after"]
# (--help as a value would print the help and exit 0, as it should.)
FLAG_VALUES = st.one_of(TEXT, NUMBERS.map(str)).filter(lambda v: v not in ("--help", "-h"))
FLAGS = st.lists(
    st.tuples(st.sampled_from(FLAG_NAMES), FLAG_VALUES).map(list),
    max_size=2,
).map(lambda pairs: [item for pair in pairs for item in pair])
# argv cannot hold NUL; everything else can reach the command.
COMMANDS = st.lists(TEXT.filter(lambda s: "\x00" not in s), max_size=3)


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str


_get_command = typer.main.get_command


@functools.cache
def _click_command(app: typer.Typer) -> object:
    """The click command typer builds from the app, built once: a `stoker` process builds
    it once, and building it is most of an in-process call's cost (40 of 50 s for the
    450 calls of the property test below)."""
    return _get_command(app)


def run_cli(*args: str) -> CliResult:
    """`stoker ARGS` in this process, through the console entry point (`main`) that
    turns a StokerError into one message and exit 2. Any other exception propagates
    and fails the test: that is a traceback a user would see."""
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with (
        redirect_stdout(out),
        redirect_stderr(err),
        mock.patch.object(sys, "argv", ["stoker", *args]),
        mock.patch.object(typer.main, "get_command", _click_command),
    ):
        try:
            main()
        except SystemExit as exc:
            code = exc.code
    assert isinstance(code, int | None), f"exit with {code!r}"
    return CliResult(code or 0, out.getvalue(), err.getvalue())


@contextmanager
def stoker_home() -> Iterator[Path]:
    """A fresh STOKER_HOME (and working folder) for one example."""
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ):
        os.environ["STOKER_HOME"] = str(Path(tmp) / "home")
        yield Path(tmp)


@contextmanager
def working_folder(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def assert_clear_error(result: CliResult) -> None:
    assert result.code == 2, result
    assert "Traceback" not in result.stderr
    # One stoker message, or click's usage error for a flag of the wrong type.
    assert result.stderr.startswith(("error: ", "Usage: ", "Error: ")), result.stderr
    assert result.stdout == ""


def assert_nothing_created(home: Path) -> None:
    runs = home / "runs"
    assert not runs.exists() or not list(runs.iterdir()), "a run folder was created"
    assert not (home / "ledger.sqlite").exists(), "a ledger entry was written"
    store = home / "mlflow" / "mlflow.db"  # made already in a test's own home (conftest.py)
    assert not store.exists() or _runs_in(store) == 0, "an MLflow run was created"


def _runs_in(store: Path) -> int:
    with closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)) as db:
        return int(db.execute("SELECT count(*) FROM runs").fetchone()[0])


def assert_safe_script(text: str, home: Path) -> None:
    check = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    (output,) = [line for line in text.splitlines() if line.startswith("#SBATCH --output=")]
    log = Path(shlex.split(output.removeprefix("#SBATCH --output="))[0])
    runs = (home / "runs").resolve()
    assert runs in Path(os.path.normpath(log)).parents, f"{log} is outside {runs}"


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=st.one_of(experiment_docs(), experiment_docs(), st.binary(max_size=64)),
    overrides=OVERRIDES,
    flags=st.one_of(st.just([]), FLAGS),
    command=st.one_of(st.none(), COMMANDS),
)
def test_any_experiment_is_a_safe_job_or_one_clear_error(
    doc: object, overrides: list[str], flags: list[str], command: list[str] | None
) -> None:
    with stoker_home() as tmp:
        exp = tmp / "exp.yaml"
        if isinstance(doc, bytes):
            exp.write_bytes(doc)  # not YAML, maybe not UTF-8
        else:
            exp.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
        args = [str(exp), *overrides, *flags]
        tail = [] if command is None else ["--", *command]
        home = Path(os.environ["STOKER_HOME"])
        with working_folder(tmp):
            shown = run_cli("submit", "--dry-run", *args, *tail)
            event("a safe job" if shown.code == 0 else "a clear error")
            if shown.code == 0:
                assert_safe_script(shown.stdout, home)
                assert_nothing_created(home)
                return
            assert_clear_error(shown)
            # The same arguments without --dry-run: refused the same way, nothing made.
            submitted = run_cli("submit", "--local", *args, *tail)
        assert_clear_error(submitted)
        assert_nothing_created(home)


def test_a_sample_of_hostile_input_in_a_real_process(tmp_path: Path) -> None:
    """The installed `stoker` script, as a user runs it: stderr carries no traceback."""
    from tests.clirun import stoker

    exp = tmp_path / "exp.yaml"
    exp.write_text("job:\n  nodes: -3\n  name: ../../etc\n  env: {A: [1, 2]}\ntrain: 7\n")
    cases = [
        ["submit", "--local", str(exp), "--", "true"],
        ["submit", "--dry-run", "job.name=$(touch PWNED)", "--", "true"],
        ["submit", "--dry-run", "job.constraint=a\ntouch PWNED", "--", "true"],
        ["submit", "--dry-run", "--nodes", "99999999999999999999999", "--", "true"],
        ["submit", "--dry-run", "job.env.X=\udcff", "--", "true"],
        ["config", "show", "tracking.tags={a: {b: c}}", "data.resolution=[-1, 1e400]"],
        ["sweep", "job.nodes=1,2", "--dry-run", "--", "true"],
    ]
    for args in cases:
        result = stoker(*args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stdout)
        assert "Traceback" not in result.stderr and result.stderr.strip(), args
    assert not list(tmp_path.rglob("PWNED"))
    assert_nothing_created(Path(os.environ["STOKER_HOME"]))


# --- hostile values in every string that reaches the script ------------------------------

PATH_PART = TEXT.map(lambda s: s.replace("/", "_").replace("\x00", "")[:60]).filter(
    lambda s: s not in ("", ".", "..") and "\udcff" not in s
)
SCRIPT_TEXT = TEXT.filter(lambda s: "\x00" not in s and "\udcff" not in s)
# A string key takes the text as written, but null and ~ alone mean null.
VALUE_TEXT = SCRIPT_TEXT.filter(lambda s: s not in ("null", "~"))
ONE_LINE = VALUE_TEXT.filter(lambda s: not any(ord(c) < 32 or ord(c) == 127 for c in s))
TASK = 'for a in "$@"; do printf "%s\\0" "$a"; done > "$SHIM_OUT/argv"; env -0 > "$SHIM_OUT/env"'


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    env_value=VALUE_TEXT,
    constraint=ONE_LINE,
    container=ONE_LINE.filter(lambda s: s and not s.startswith("-")),
    # (YAML reads no unprintable character in a flow list, and would say so.)
    mount=ONE_LINE.filter(lambda s: s.isprintable() and s and ":" not in s and "," not in s),
    template=st.sampled_from(["default", "pyxis", "apptainer"]),
    args=st.lists(SCRIPT_TEXT, max_size=3),
    workdir=PATH_PART,
    home=PATH_PART,
    db=PATH_PART.filter(lambda s: "?" not in s),
)
def test_hostile_strings_reach_the_task_verbatim_and_never_run(
    tmp_path_factory: pytest.TempPathFactory,
    env_value: str,
    constraint: str,
    container: str,
    mount: str,
    template: str,
    args: list[str],
    workdir: str,
    home: str,
    db: str,
) -> None:
    tmp = tmp_path_factory.mktemp("script")
    runs = tmp / home / "runs"
    try:
        check_run_root(runs)
    except StokerError:
        assume(False)  # refused with a clear message before anything runs
    run_dir = runs / "job-20260101-000000-abcd"
    run_dir.mkdir(parents=True)
    (tmp / workdir).mkdir(exist_ok=True)
    overrides = [f"job.env.V={env_value}", f"job.constraint={constraint}"]
    if template != "default":
        overrides += [
            f"job.template={template}",
            f"job.container={container}",
            f"job.mounts=[{json.dumps(f'/data/{mount}:/data', ensure_ascii=False)}]",
        ]
    resolved = resolve_config(overrides=overrides, use_profile=False)
    uri = f"sqlite:///{tmp / db}.db"
    spec = LaunchSpec(
        resolved,
        run_dir=run_dir,
        command=["bash", "-c", TASK, "task", *args],
        workdir=tmp / workdir,
        tracking_uri=uri,
        mlflow_run_ids=["0123456789abcdef"],
    )
    text = render_sbatch(spec).text
    ran = run_batch_script(text, tmp)
    assert ran.returncode == 0, ran.stderr
    assert not [p for p in tmp.rglob("PWNED*") if p.is_file()], "a value was executed"
    # Bytes, not read_text: universal newlines would turn a value's \r\n into \n.
    argv = (ran.out / "argv").read_bytes().decode().split("\0")[:-1]
    assert argv == args
    env_items = (ran.out / "env").read_bytes().decode().split("\0")
    env = dict(item.split("=", 1) for item in env_items if "=" in item)
    assert env["V"] == env_value
    assert env["MLFLOW_TRACKING_URI"] == uri
    assert env["STOKER_RUN_DIR"] == str(run_dir)
    if template == "pyxis":
        assert f"--container-image={container}" in ran.srun_args()
    if template == "apptainer":
        assert (ran.out / "apptainer.image").read_text() == container


def test_a_newline_in_a_directive_value_cannot_start_a_script_line(tmp_path: Path) -> None:
    """`job.constraint` goes into an #SBATCH line: a newline there used to end the line
    and make the rest a command of the batch script."""
    hostile = "x'\ntouch PWNED\n#'"
    with pytest.raises(StokerError, match=r"job\.constraint.*one line of text"):
        resolve_config(overrides=[f"job.constraint={hostile}"], use_profile=False)
    with pytest.raises(StokerError, match=r"job\.container.*one line of text"):
        resolve_config(overrides=["job.container=img\nid"], use_profile=False)


# --- real submissions of hostile but valid configs ------------------------------------------

CHECKER = """\
import json, os, sys
out = os.path.join(os.environ["STOKER_RUN_DIR"], "seen.json")
json.dump({"argv": sys.argv[1:], "V": os.environ["V"]}, open(out, "w"))
"""
VALID_NAME = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    name=VALID_NAME,
    run_name=VALUE_TEXT.filter(lambda s: s.strip()),
    experiment=VALUE_TEXT.filter(lambda s: s.strip()),
    tag=VALUE_TEXT,
    env_value=VALUE_TEXT,
    args=st.lists(SCRIPT_TEXT, max_size=3),
    bad=st.sampled_from(["job.nodes=-1", "job.name=../x", "job.env.HF_TOKEN=x", "train.stepz=1"]),
)
def test_hostile_but_valid_jobs_run_locally_and_stay_in_their_folder(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    run_name: str,
    experiment: str,
    tag: str,
    env_value: str,
    args: list[str],
    bad: str,
) -> None:
    from mlflow.tracking import MlflowClient

    from stoker.launcher.jobs.ledger import Ledger
    from tests.launcher_jobs import wait_local

    # One store for all examples (creating a sqlite store takes seconds).
    home = Path(os.environ["STOKER_HOME"])
    work = tmp_path_factory.mktemp("work")
    overrides = [
        f"job.name={name}",
        f"tracking.run_name={run_name}",
        f"tracking.experiment={experiment}",
        f"tracking.tags.t={tag}",
        f"job.env.V={env_value}",
    ]
    command = ["--", sys.executable, "-c", CHECKER, *args]
    before = {p for p in home.rglob("*")} if home.exists() else set()
    with working_folder(work):
        result = run_cli("submit", "--local", "--json", *overrides, *command)
        assert result.code == 0, result.stderr
        job = json.loads(result.stdout.strip().splitlines()[-1])
        refused = run_cli("submit", "--local", *overrides, bad, *command)
    assert_clear_error(refused)

    run_dir = Path(job["run_dir"])
    assert run_dir.parent == (home / "runs") and run_dir.name.startswith(f"{name}-")
    state = wait_local(run_dir, 30)
    assert state.state == "COMPLETED"
    seen = json.loads((run_dir / "seen.json").read_text())
    assert seen == {"argv": args, "V": env_value}
    assert not [p for p in work.rglob("PWNED*") if p.is_file()]
    assert not [p for p in home.rglob("PWNED*") if p.is_file()]
    # Everything new lies in STOKER_HOME: this run's folder, the ledger, the MLflow store.
    new = {p for p in home.rglob("*")} - before
    kept = (run_dir, home / "mlflow", home / "ledger.sqlite", home / "runs")
    stray = [p for p in new if not any(p == k or p.is_relative_to(k) for k in kept)]
    assert not [p for p in stray if not p.name.startswith("ledger.sqlite-")], stray
    # One ledger entry and one MLflow run per accepted submission; none for the refused one.
    assert [r.job_id for r in Ledger().list()].count(job["job_id"]) == 1
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], max_results=1000
    )
    assert len(runs) == len(Ledger().list())
    run = client.get_run(job["run_id"])
    assert run.info.run_name == run_name
    assert run.data.tags["t"] == tag
