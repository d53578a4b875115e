"""A help printed once is printed again from $STOKER_HOME/cache/help without typer
(stoker/cli/help_cache.py): the same text, for the same words, code and terminal width;
a new one for another width or once stoker's files change; never kept for a typo, an
option or an argument among the words; and a cache that cannot be written costs nothing
but the speed. Every command's help, rendered and then cached, is compared in
tests/test_cli_imports.py (one subprocess pair per command)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from stoker.cli import help_cache
from stoker.cli.help_cache import HelpCache, fingerprint, help_width, requested_help
from tests.clirun import stoker_text


def kept_files(home: Path) -> list[str]:
    folder = home / ".stoker" / "cache" / "help"
    return (
        sorted(str(p.relative_to(folder)) for p in folder.rglob("*.txt")) if folder.exists() else []
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--help"], ()),
        (["-h"], ()),
        (["submit", "--help"], ("submit",)),
        (["data", "bench", "-h"], ("data", "bench")),
        (["ckpt", "export", "--help"], ("ckpt", "export")),
        (["config", "show", "--help"], ("config", "show")),  # a group the table does not list
        ([], None),
        (["submit"], None),
        (["sumbit", "--help"], None),  # a typo: its error is printed, nothing kept
        (["submit", "--nodes", "2", "--help"], None),
        (["run", "exp.yaml", "--help"], None),
        (["run", "extra", "--help"], None),  # a command's argument
        (["data", "nothing", "--help"], None),
        (["data", "bench", "kernels", "--help"], None),
        (["--help", "submit"], None),
        (["Submit", "--help"], None),
    ],
)
def test_only_a_commands_own_help_is_kept(argv: list[str], words: tuple[str, ...] | None) -> None:
    assert requested_help(argv) == words


@pytest.mark.parametrize("columns", ["", "0", "40", "64", "79", "80", "200", "wide"])
def test_the_width_is_the_one_click_formats_for(
    columns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    # typer's click: max(min(shutil.get_terminal_size().columns, 80) - 2, 50)
    assert help_width() == max(min(shutil.get_terminal_size().columns, 80) - 2, 50)


def test_a_help_is_printed_again_from_the_cache(isolated_home: Path) -> None:
    first = stoker_text("ckpt", "prune", "--help", check=True)
    assert first.stdout.startswith("Usage: stoker ckpt prune [OPTIONS]")
    assert kept_files(isolated_home) == [f"{fingerprint()}/stoker-ckpt-prune.w{help_width()}.txt"]
    assert stoker_text("ckpt", "prune", "--help", check=True).stdout == first.stdout
    # What is printed the second time is the kept text, not a new rendering.
    (kept,) = (isolated_home / ".stoker" / "cache" / "help").rglob("*.txt")
    kept.write_text("the kept text\n")
    assert stoker_text("ckpt", "prune", "--help").stdout == "the kept text\n"
    assert stoker_text("ckpt", "prune", "-h").stdout == "the kept text\n"  # the same request


def test_each_terminal_width_has_its_own_text(
    isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    narrow = stoker_text("submit", "--help", check=True).stdout
    monkeypatch.setenv("COLUMNS", "200")
    wide = stoker_text("submit", "--help", check=True).stdout
    assert max(map(len, narrow.splitlines())) <= 58 < max(map(len, wide.splitlines()))
    assert [Path(f).name for f in kept_files(isolated_home)] == [
        "stoker-submit.w58.txt",
        "stoker-submit.w78.txt",
    ]
    monkeypatch.setenv("COLUMNS", "60")
    assert stoker_text("submit", "--help").stdout == narrow


def test_nothing_is_kept_for_a_typo_an_option_or_an_argument(isolated_home: Path) -> None:
    typo = stoker_text("sumbit", "--help")
    assert typo.returncode == 2 and "Did you mean 'submit'?" in typo.stderr
    assert stoker_text("submit", "--nodes", "2", "--help").stdout.startswith("Usage: stoker submit")
    assert stoker_text("run", "exp.yaml", "--help").stdout.startswith("Usage: stoker run")
    assert kept_files(isolated_home) == []
    assert stoker_text("--version").stdout == f"stoker {__import__('stoker').__version__}\n"


def test_a_change_to_stokers_files_starts_a_new_cache(tmp_path: Path) -> None:
    package = tmp_path / "stoker"
    (package / "cli" / "__pycache__").mkdir(parents=True)
    (package / "cli" / "submit.py").write_text("HELP = 'one'\n")
    before = fingerprint(str(package))
    (package / "cli" / "__pycache__" / "submit.cpython-311.pyc").write_bytes(b"\0")
    assert fingerprint(str(package)) == before  # bytecode is not the code
    (package / "cli" / "submit.py").write_text("HELP = 'two'\n")  # same size, new time
    os.utime(package / "cli" / "submit.py", ns=(1, 10**18))
    edited = fingerprint(str(package))
    assert edited != before
    (package / "cli" / "new.py").write_text("")
    assert fingerprint(str(package)) not in (before, edited)


def test_the_newest_versions_are_kept_and_the_older_dropped(
    isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each edit of stoker starts a folder; a shared $STOKER_HOME may serve several
    installs at once, so the four newest stay."""
    for version in range(6):
        monkeypatch.setattr(help_cache, "fingerprint", lambda package=None, v=version: f"v{v}")
        stoker_text("--help", check=True)
        folder = isolated_home / ".stoker" / "cache" / "help" / f"v{version}"
        os.utime(folder, ns=(version * 10**9, version * 10**9))  # written in this order
    assert kept_files(isolated_home) == [f"v{v}/stoker.w{help_width()}.txt" for v in (2, 3, 4, 5)]
    assert HelpCache(()).text() is not None  # v5, this one


def test_a_cache_that_cannot_be_written_changes_nothing_but_the_speed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_folder = tmp_path / "home-is-a-file"
    not_a_folder.write_text("")
    monkeypatch.setenv("STOKER_HOME", str(not_a_folder))
    for _ in range(2):
        result = stoker_text("status", "--help")
        assert result.returncode == 0 and result.stdout.startswith("Usage: stoker status")
        assert result.stderr == ""
    assert HelpCache(("status",)).text() is None


@pytest.mark.parametrize("stoker_home", [None, "~/elsewhere", "relative/home"])
def test_the_cache_is_under_the_same_stoker_home_as_the_rest_of_the_state(
    stoker_home: str | None, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """help_cache reads $STOKER_HOME itself (stoker/home.py imports pathlib, which a
    cached help avoids): it must agree with stoker_home()."""
    from stoker.home import stoker_home as home_of_the_state

    monkeypatch.chdir(isolated_home)
    if stoker_home is None:
        monkeypatch.delenv("STOKER_HOME")
    else:
        monkeypatch.setenv("STOKER_HOME", stoker_home)
    assert Path(help_cache.cache_folder()) == home_of_the_state() / "cache" / "help"
