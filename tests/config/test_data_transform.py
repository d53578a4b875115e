"""`data.transform`: a per-sample function named package.module:function, checked as
`model.arch` is: dotted module names only, errors at the line the value came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.config import ConfigError, Source, load_frozen, resolve_config, write_frozen


def test_it_is_null_by_default_and_takes_an_import_path(tmp_path: Path) -> None:
    assert resolve_config().config.data.transform is None
    resolved = resolve_config(overrides=["data.transform=mypkg.aug:random_crop"])
    assert resolved.config.data.transform == "mypkg.aug:random_crop"
    assert resolved.source_of(("data", "transform")) == Source(
        "override", "data.transform=mypkg.aug:random_crop"
    )
    # The job reads the frozen config: the value travels with it.
    frozen = tmp_path / "config.yaml"
    write_frozen(resolved, frozen)
    assert load_frozen(frozen).data.transform == "mypkg.aug:random_crop"


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("mypkg/aug.py:random_crop", True),
        ("./aug.py:random_crop", True),
        ("aug.py:random_crop", True),
        ("C:\\code\\aug.py:crop", True),  # YAML's single quotes keep backslashes
        ("mypkg.aug", False),  # no function
        ("mypkg.aug:", False),
        ("mypkg.aug:random-crop", False),
    ],
)
def test_a_file_path_or_a_half_path_is_refused_at_its_line(
    tmp_path: Path, value: str, hint: bool
) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"data:\n  batch_size: 4\n  transform: '{value}'\n")
    with pytest.raises(ConfigError) as info:
        resolve_config(exp)
    (problem,) = info.value.problems
    assert (problem.key, problem.where) == ("data.transform", f"{exp}:3")
    assert problem.message.startswith(
        f"got {value!r}: {value!r} is not an import path package.module:function"
    )
    assert problem.message.endswith("(a module's dotted name, not a file path)") == hint


def test_an_override_is_refused_with_its_source() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config(overrides=["data.transform=src/aug.py:crop"])
    (problem,) = info.value.problems
    assert problem.key == "data.transform"
    assert "override data.transform=src/aug.py:crop" in problem.where
    assert "not a file path" in str(info.value)
