"""The sbatch renderer: the golden default script, variants, quoting and template errors."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.errors import StokerError
from stoker.launcher.script.render import Shell, render_sbatch
from stoker.launcher.script.spec import LaunchSpec
from stoker.protocol import TRAIN_MODULE
from tests.launcher.launch_specs import make_spec

GOLDEN = Path(__file__).parents[1] / "golden" / "default.sbatch"
REFRESH = "STOKER_UPDATE_GOLDEN"


def golden_spec() -> LaunchSpec:
    return make_spec(
        ["job.name=golden", "job.env.NCCL_IB_HCA=mlx5", "job.setup=[module load cuda/12.4]"],
        {"job.nodes": (2, "--nodes"), "job.gpus_per_node": (8, "--gpus-per-node")},
    )


def test_default_template_matches_golden_file() -> None:
    text = render_sbatch(golden_spec()).text
    if os.environ.get(REFRESH):
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), f"no golden file; create it with {REFRESH}=1 pytest {__file__}"
    assert text == GOLDEN.read_text(), (
        "the default sbatch template's output changed. If the change is intended, refresh the "
        f"golden file with `{REFRESH}=1 .venv/bin/pytest tests/launcher/test_render.py` and review "
        "`git diff tests/golden/`"
    )


def test_explain_names_the_source_of_every_sbatch_line() -> None:
    text = render_sbatch(golden_spec(), explain=True).text
    lines = {
        line.split("  # ")[0]: line.split("  # ")[1]
        for line in text.splitlines()
        if line.startswith("#SBATCH")
    }
    assert lines["#SBATCH --nodes=2"] == "flag --nodes"
    assert lines["#SBATCH --job-name=golden"] == "override job.name=golden"
    assert lines["#SBATCH --time=01:00:00"] == "default"
    assert lines["#SBATCH --ntasks-per-node=8"].startswith("one per GPU")
    assert all(source for source in lines.values())


def test_explain_cites_file_and_line(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("job:\n  name: fromfile\n  time: '00:30:00'\n")
    text = render_sbatch(make_spec(experiment=exp), explain=True).text
    assert f"#SBATCH --time=00:30:00  # file {exp}:3" in text


@pytest.mark.parametrize("template", ["pyxis", "apptainer"])
def test_container_templates_run_tasks_in_the_image(template: str) -> None:
    spec = make_spec(
        [
            f"job.template={template}",
            "job.container=nvcr.io/nvidia/pytorch:25.01-py3",
            "job.mounts=[/data:/data:ro]",
        ],
        {"job.gpus_per_node": (4, "--gpus-per-node")},
    )
    text = render_sbatch(spec).text
    assert 'srun "${STOKER_STEP[@]}" --kill-on-bad-exit=1' in text  # each attempt's nodes
    mounts = (
        "/data:/data:ro,/shared/stoker/runs/golden-20261121-000000-abcd:"
        "/shared/stoker/runs/golden-20261121-000000-abcd"
    )
    if template == "pyxis":
        assert "--container-image=nvcr.io/nvidia/pytorch:25.01-py3" in text
        assert f"--container-mounts={mounts}" in text
    else:
        assert "apptainer exec --nv --bind" in text and mounts in text
        assert "nvcr.io/nvidia/pytorch:25.01-py3 bash -c" in text


def test_container_without_container_template_is_refused() -> None:
    with pytest.raises(StokerError, match=r"job.template to pyxis .*or apptainer"):
        render_sbatch(make_spec(["job.container=img.sqsh"]))
    with pytest.raises(StokerError, match=r"job\.container is not set"):
        render_sbatch(make_spec(["job.template=pyxis"]))


def test_user_template_extends_the_base(tmp_path: Path) -> None:
    mine = tmp_path / "site.sbatch.j2"
    mine.write_text(
        '{% extends "base.sbatch.j2" %}\n{% block launch %}\n'
        'srun --mpi=pmix bash -c "$STOKER_TASK" stoker-task {{ command }} &\n{% endblock %}\n'
    )
    text = render_sbatch(make_spec([f"job.template={mine}"])).text
    assert "srun --mpi=pmix" in text and "--kill-on-bad-exit" not in text
    # With spares, a step that does not take the attempt's nodes would run on them too.
    with pytest.raises(StokerError, match=r'job.spare_nodes is 1 .*without "\$\{STOKER_STEP'):
        render_sbatch(make_spec([f"job.template={mine}", "job.spare_nodes=1"]))


def test_user_template_cannot_print_a_value_unquoted(tmp_path: Path) -> None:
    mine = tmp_path / "t.j2"
    mine.write_text("#!/bin/bash\necho {{ job.env.X }}\n")
    text = render_sbatch(make_spec([f"job.template={mine}", "job.env.X=$(reboot)"])).text
    assert "echo '$(reboot)'" in text


def test_missing_template_and_broken_template_are_clear(tmp_path: Path) -> None:
    with pytest.raises(StokerError, match="neither a built-in template"):
        render_sbatch(make_spec(["job.template=nope.j2"]))
    bad = tmp_path / "bad.j2"
    bad.write_text("#!/bin/bash\n{{ no_such_name }}\n")
    with pytest.raises(StokerError, match=r"bad.j2.*no_such_name"):
        render_sbatch(make_spec([f"job.template={bad}"]))


def test_setup_line_that_breaks_bash_is_caught_before_submit() -> None:
    with pytest.raises(StokerError, match=r"job\.setup lines is not valid bash"):
        render_sbatch(make_spec(["job.setup=[echo 'unclosed]"]))
    with pytest.raises(StokerError, match="not valid bash"):
        render_sbatch(make_spec(["job.setup=[if true]"]))


HOSTILE = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "a'b\"c",
    "x; touch PWNED",
    "line1\nline2; touch PWNED",
    "$HOME ${PATH} \\ * ?",
]


def test_hostile_values_reach_the_task_verbatim(tmp_path: Path) -> None:
    """Run the script's env and launch lines under bash with srun replaced by a shim."""
    env_over = [f"job.env.V{i}={v}" for i, v in enumerate(HOSTILE)]
    spec = make_spec(
        env_over, command=["printf", "%s\\n", *HOSTILE], run_dir=tmp_path / "run", workdir=tmp_path
    )
    text = render_sbatch(spec).text
    shim = tmp_path / "bin"
    shim.mkdir()
    # srun: run the task once as rank 0; scontrol: answer the two questions the script asks.
    (shim / "srun").write_text(
        "#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n"
        'SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 "$@" > "$OUT"\n'
    )
    (shim / "scontrol").write_text(
        '#!/bin/bash\n[ "$2" = hostnames ] && echo n1 || echo "NodeName=n1 NodeAddr=10.0.0.7"\n'
    )
    for f in shim.iterdir():
        f.chmod(0o755)
    (tmp_path / "run").mkdir()
    dump = tmp_path / "env.out"
    script = tmp_path / "job.sh"
    script.write_text(text.replace('exit "$rc"', f'env -0 > {dump}; exit "$rc"'))
    result = subprocess.run(
        ["bash", str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        env={
            **os.environ,
            "PATH": f"{shim}:{os.environ['PATH']}",
            "OUT": str(tmp_path / "out"),
            "SLURM_JOB_ID": "42",
            "SLURM_JOB_NODELIST": "n1",
            "SLURM_NTASKS": "1",
        },
    )
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.rglob("PWNED")), "a value was executed"
    assert (tmp_path / "out").read_text() == "".join(f"{v}\n" for v in HOSTILE)
    env = dict(item.split("=", 1) for item in dump.read_text().split("\0") if "=" in item)
    for i, value in enumerate(HOSTILE):
        assert env[f"V{i}"] == value
    assert env["MASTER_ADDR"] == "10.0.0.7"
    assert env["MASTER_PORT"] == str(20000 + 42)


def test_master_port_is_below_the_ephemeral_range() -> None:
    """Outgoing connections take their ports from ip_local_port_range; one holding
    MASTER_PORT (35053 then) failed a restart's rendezvous with EADDRINUSE in CI."""
    lines = render_sbatch(make_spec()).text.splitlines()
    # The two lines that set the range, and the one of each attempt (in a function).
    ports = [line for line in lines if line.startswith(("stoker_ports=", '[ "$stoker_ports"'))]
    attempt = [line.strip() for line in lines if line.strip().startswith("export MASTER_PORT=")]
    assert len(ports) == 2 and len(attempt) == 1, (ports, attempt)
    script = "\n".join([*ports, *attempt, 'echo "$MASTER_PORT"'])
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])

    def port(job: int, restart: int) -> int:
        env = {**os.environ, "SLURM_JOB_ID": str(job), "STOKER_RESTART": str(restart)}
        return int(subprocess.run(["bash", "-c", script], env=env, capture_output=True,
                                  text=True, check=True).stdout)  # fmt: skip

    jobs = (42, 7134, 12767, 12768, 99_999, 4_000_000)
    ports = {(job, restart): port(job, restart) for job in jobs for restart in range(4)}
    assert all(20000 <= p < low for p in ports.values()), ports
    assert ports[42, 0] == 20042
    assert len({ports[7134, restart] for restart in range(4)}) == 4, "each start its own port"


@pytest.mark.parametrize(
    ("command", "ignored"),
    [(["python", "-m", TRAIN_MODULE, "--config", Shell('"$STOKER_CONFIG"')], True),
     (["python", "train.py"], False)],
)  # fmt: skip
def test_runtime_tasks_start_with_the_stop_signal_ignored(
    command: list[str], ignored: bool
) -> None:
    """The runtime's tasks: a SIGUSR2 before its handler must not kill them (it reads the
    stop file); a user's command keeps the default, as documented."""
    text = render_sbatch(make_spec(command=command)).text
    wrapper = [line for line in text.splitlines() if line.startswith("STOKER_TASK=")]
    probe = "import signal; print(signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN)"
    script = "\n".join(
        [*wrapper, f'bash -c "$STOKER_TASK" task {sys.executable} -c {shlex.quote(probe)}']
    )
    env = {**os.environ, "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_NTASKS": "1"}  # fmt: skip
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                            timeout=30, check=True)  # fmt: skip
    assert result.stdout.strip() == str(ignored)


def test_shell_values_are_printed_as_written() -> None:
    spec = make_spec(command=["python", "-m", "x", "--config", Shell('"$STOKER_CONFIG"')])
    assert 'stoker-task python -m x --config "$STOKER_CONFIG" &' in render_sbatch(spec).text


def test_sweep_script_gives_each_array_task_its_own_run() -> None:
    spec = make_spec(
        mlflow_run_ids=["aaa", "bbb", "ccc"], parent_run_id="ppp", array_size=3, max_parallel=2
    )
    text = render_sbatch(spec).text
    assert "#SBATCH --array=0-2%2" in text
    script = text[text.index("MLFLOW_RUN_IDS=") : text.index("export STOKER_PARENT_RUN_ID")]
    for task, run_id in enumerate(["aaa", "bbb", "ccc"]):
        result = subprocess.run(
            ["bash", "-c", script + 'echo "$MLFLOW_RUN_ID"'],
            env={"SLURM_ARRAY_TASK_ID": str(task)},
            capture_output=True,
            text=True,
            check=True,
        )
        assert result.stdout.strip() == run_id


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("5:30", 330),
        ("01:00:00", 3600),
        ("2-00", 172800),
        ("1-02:03", 93780),
        ("1-02:03:04", 93784),
        ("UNLIMITED", None),
    ],
)
def test_time_limit_forms(text: str, seconds: int | None) -> None:
    from stoker.launcher.launch.checks import time_limit_seconds

    assert time_limit_seconds(text) == seconds


def test_stop_grace_longer_than_the_time_limit_is_refused(tmp_path: Path) -> None:
    from tests.clirun import stoker

    result = stoker("submit", "--time", "1", "--dry-run", "--", "true", cwd=tmp_path)
    assert result.returncode == 2
    assert "job.stop_grace=120 s (default) is not shorter than job.time=1 (flag --time)" in (
        result.stderr
    )
    ok = stoker(
        "submit", "--time", "1", "job.stop_grace=20", "--dry-run", "--", "true", cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr


def test_the_profiles_node_exclusion_reaches_sbatch(tmp_path: Path) -> None:
    """`exclude:` in the site profile (what `stoker insights` advises for a failing
    node) is `#SBATCH --exclude`, cited to the profile's line; a value that is no host
    list is refused before any script is written."""
    from stoker.config.resolve import resolve_config

    profile = tmp_path / "profile.yaml"
    profile.write_text("partition: debug\nexclude: n[3-4],gpu17\n")
    spec = dataclasses.replace(make_spec(), resolved=resolve_config(profile=profile))
    text = render_sbatch(spec, explain=True).text
    assert f"#SBATCH --exclude='n[3-4],gpu17'  # profile {profile}:2" in text
    with pytest.raises(StokerError, match=r"job\.exclude") as caught:
        make_spec(["job.exclude=n1;reboot"])
    assert "host list" in str(caught.value)
