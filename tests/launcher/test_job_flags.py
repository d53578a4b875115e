"""The job flags are one type (stoker/launcher/launch/job_flags.py): the commands, the
Python API and the data array jobs take the same names, each a `job.*` key, and a
flag names where it came from as its user spelled it."""

from __future__ import annotations

import inspect

from stoker import api
from stoker.cli import submit as submit_command
from stoker.cli import sweep as sweep_command
from stoker.launcher.launch.job_flags import JOB_FLAG_NAMES, JobFlags, command_line, keyword


def test_a_flag_sets_its_job_key_and_says_how_it_was_spelled() -> None:
    flags = JobFlags(nodes=2, ntasks_per_node=4, time="1:00:00")
    config = flags.for_config(command_line)
    assert config["job.nodes"] == (2, "--nodes")
    assert config["job.ntasks_per_node"] == (4, "--ntasks-per-node")
    assert config["job.partition"] == (None, "--partition")  # not given: a lower source decides
    assert flags.for_config(keyword)["job.time"] == ("1:00:00", "time=")
    assert flags.given(command_line) == {"--nodes": 2, "--ntasks-per-node": 4, "--time": "1:00:00"}


def test_every_flag_is_a_job_key_and_every_front_door_takes_them_all() -> None:
    from stoker.config.schema import JobConfig

    assert set(JOB_FLAG_NAMES) <= set(JobConfig.model_fields)
    for command in (submit_command.submit, sweep_command.sweep):
        assert set(JOB_FLAG_NAMES) <= set(inspect.signature(command).parameters), command
    for function in (api.submit, api.sweep):
        parameters = inspect.signature(function).parameters
        kinds = {parameters[name].kind for name in JOB_FLAG_NAMES}
        assert kinds == {inspect.Parameter.KEYWORD_ONLY}, function
