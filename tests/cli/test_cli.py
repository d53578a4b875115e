"""The CLI as a user meets it: exit codes, stdout for data, stderr for messages.

The console entry point runs in the test process (`stoker_text`: the same argument
splitting, streams and exit status, without a process's imports per call); what needs a
terminal runs the installed command on one (`stoker_in_tty`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from stoker import __version__
from stoker.config import ExperimentConfig, resolve_config
from tests.clirun import stoker_in_tty, stoker_text

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "examples" / "tiny.yaml")
COLOR_CODES = {*range(30, 39), *range(40, 49), *range(90, 98), *range(100, 108)}


def color_params(text: str) -> set[int]:
    """SGR colour parameters used in terminal output (bold/dim are not colours)."""
    params: set[int] = set()
    for group in re.findall(r"\x1b\[([0-9;]*)m", text):
        params |= {int(p) for p in group.split(";") if p} & COLOR_CODES
    return params


def test_version() -> None:
    result = stoker_text("--version", check=True)
    assert result.stdout.strip() == f"stoker {__version__}"


def test_help_lists_the_commands_in_workflow_order() -> None:
    result = stoker_text("--help", check=True)
    commands = re.findall(r"^  (\w+)  ", result.stdout.split("Commands:")[1], re.M)
    # stoker/cli/command_table.py's order: the commands, then the groups (config, ...).
    assert commands == [
        "init",
        "run",
        "check",
        "plan",
        "submit",
        "sweep",
        "status",
        "logs",
        "why",
        "ui",
        "cancel",
        "requeue",
        "sample",
        "insights",
        "doctor",
        "config",
        "data",
        "bench",
        "ckpt",
    ]
    for command in commands:  # each one's --help works (and is tested for imports elsewhere)
        assert stoker_text(command, "--help").returncode == 0
    bare = stoker_text()  # no arguments: usage on stderr, exit 2, as for any missing command
    assert bare.returncode == 2 and "Usage: stoker" in bare.stderr + bare.stdout


def test_unknown_command_fails() -> None:
    result = stoker_text("frobnicate")
    assert result.returncode == 2
    assert "No such command" in result.stderr


def test_init_writes_a_valid_commented_experiment(tmp_path: Path) -> None:
    result = stoker_text("init", "exp.yaml", cwd=tmp_path, check=True)
    assert result.stdout == ""  # messages go to stderr
    assert "wrote experiment exp.yaml" in result.stderr
    text = (tmp_path / "exp.yaml").read_text()
    assert "# Number of nodes the job trains on." in text
    assert resolve_config(tmp_path / "exp.yaml").config == ExperimentConfig()


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    (tmp_path / "exp.yaml").write_text("mine: true\n")
    result = stoker_text("init", "exp.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert "already exists" in result.stderr and "--force" in result.stderr
    assert (tmp_path / "exp.yaml").read_text() == "mine: true\n"
    stoker_text("init", "exp.yaml", "--force", cwd=tmp_path, check=True)
    assert "# Number of nodes" in (tmp_path / "exp.yaml").read_text()


def test_init_profile_writes_a_profile_that_changes_nothing(
    tmp_path: Path, isolated_home: Path
) -> None:
    stoker_text("init", "exp.yaml", "--profile", cwd=tmp_path, check=True)
    profile = isolated_home / ".config" / "stoker" / "profile.yaml"
    assert "# partition: gpu" in profile.read_text()
    assert resolve_config(profile=profile).config == ExperimentConfig()
    # Uncommenting a line takes effect.
    profile.write_text(profile.read_text().replace("# partition: gpu", "partition: gpu"))
    shown = stoker_text("config", "show", "--json", cwd=tmp_path, check=True)
    assert json.loads(shown.stdout)["job"]["partition"] == "gpu"


def test_config_show_json_is_the_resolved_config() -> None:
    result = stoker_text("config", "show", TINY, "optim.lr=3e-4", "--json", check=True)
    data = json.loads(result.stdout)
    assert data["optim"]["lr"] == 3e-4
    assert data["job"]["name"] == "tiny-av"  # from the file
    assert data["checkpoint"]["async"] is True  # written by its alias
    assert result.stderr == ""


def test_config_show_plain_text_names_every_source(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text("partition: gpu\n")
    result = stoker_text(
        "config",
        "show",
        TINY,
        "train.steps=50",
        "--profile",
        str(profile),
        "--nodes",
        "2",
        check=True,
    )
    lines = {line.split()[0]: line for line in result.stdout.splitlines()}
    assert len(lines) >= 40
    assert lines["train.steps"].split()[1] == "50"
    assert "# override train.steps=50" in lines["train.steps"]
    assert f"# file {TINY}:7" in lines["job.name"]
    assert f"# profile {profile}:1" in lines["job.partition"]
    assert "# default" in lines["optim.weight_decay"]
    assert lines["job.nodes"].split()[1] == "2" and "# flag --nodes" in lines["job.nodes"]
    assert "\x1b[" not in result.stdout  # not a terminal: no escape codes


def test_config_show_without_a_file_shows_the_defaults() -> None:
    data = json.loads(stoker_text("config", "show", "train.steps=7", "--json", check=True).stdout)
    assert data["train"]["steps"] == 7
    assert data["job"]["name"] == ExperimentConfig().job.name


def test_config_show_typo_exits_nonzero_with_a_hint() -> None:
    result = stoker_text("config", "show", TINY, "train.stepz=10")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "did you mean train.steps" in result.stderr
    assert "Traceback" not in result.stderr


def test_config_show_wrong_type_in_file_reports_file_and_line(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("train:\n  steps: many\n")
    result = stoker_text("config", "show", str(exp))
    assert result.returncode == 2
    assert f"{exp}:2: train.steps: got 'many'; expected an integer >= 1" in result.stderr


def test_config_schema_is_the_reference_doc() -> None:
    result = stoker_text("config", "schema", check=True)
    assert "| `train.steps` |" in result.stdout
    schema = json.loads(stoker_text("config", "schema", "--json", check=True).stdout)
    assert "job" in schema["properties"]


def test_terminal_output_has_colour_unless_no_color() -> None:
    coloured = stoker_in_tty("config", "show", TINY)
    assert "job.name" in coloured and "┃" in coloured  # a rich table on a terminal
    assert color_params(coloured), "expected colour on a terminal"
    plain = stoker_in_tty("config", "show", TINY, env={"NO_COLOR": "1"})
    assert "job.name" in plain
    assert not color_params(plain), "NO_COLOR must remove colour"


def test_errors_on_a_terminal_respect_no_color(tmp_path: Path) -> None:
    text = stoker_in_tty("config", "show", "train.stepz=1", env={"NO_COLOR": "1"})
    assert "did you mean train.steps" in text
    assert not color_params(text)


def test_errors_on_a_terminal_show_user_values_verbatim() -> None:
    # `[red]` in a value must be printed, not taken as rich markup.
    text = stoker_in_tty("config", "show", "job.time=[red]x")
    assert "'[red]x'" in text and "D-HH:MM:SS" in text


def test_shell_completion_completes_commands() -> None:
    env = {"_STOKER_COMPLETE": "complete_bash", "COMP_WORDS": "stoker con", "COMP_CWORD": "1"}
    assert stoker_text(env=env, check=True).stdout.split() == ["config"]
    env = {"_STOKER_COMPLETE": "complete_bash", "COMP_WORDS": "stoker config s", "COMP_CWORD": "2"}
    assert sorted(stoker_text(env=env, check=True).stdout.split()) == ["schema", "show"]
    # The script `stoker --install-completion` installs (`--show-completion` picks the
    # shell from the parent process, so ask for bash's explicitly).
    script = stoker_text(env={"_STOKER_COMPLETE": "source_bash"}, check=True).stdout
    assert "_stoker_completion" in script and "complete " in script
