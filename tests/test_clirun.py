"""`stoker_text` (tests/clirun.py) runs the console entry point in the test process for
tests that check only text: what it returns must be what the installed command prints,
or those tests would pass on output no user sees."""

from __future__ import annotations

import os
from pathlib import Path

from tests.clirun import stoker, stoker_text


def test_in_process_output_and_status_equal_the_installed_command(tmp_path: Path) -> None:
    experiment = tmp_path / "bad.yaml"
    experiment.write_text("train: {steps: -1}\n")
    cases = [
        ["--version"],  # exits through typer.Exit
        ["bogus"],  # click's usage error: exit 2, the program's name in the usage line
        ["status", "--json"],  # prints, exit 0
        ["check", str(experiment)],  # a StokerError: one message, its exit status
        ["check", "bad.yaml"],  # relative to cwd
    ]
    for args in cases:
        here = stoker_text(*args, cwd=tmp_path, env={"STOKER_TEST_MARK": "1"})
        there = stoker(*args, cwd=tmp_path, env={"STOKER_TEST_MARK": "1"})
        assert (here.returncode, here.stdout, here.stderr) == (
            there.returncode,
            there.stdout,
            there.stderr,
        ), args
    assert "STOKER_TEST_MARK" not in os.environ and Path.cwd() != tmp_path
