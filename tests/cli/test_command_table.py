"""stoker/cli/command_table.py against the commands it names: a group's `--help` and
shell completion list the table's names and first sentences without building a command
(stoker/cli/lazy_group.py); what they print must be what the real commands would give."""

from __future__ import annotations

from typing import Any

import pytest
import typer
import typer.main
from typer.core import TyperGroup

from stoker.cli.app import app
from stoker.cli.command_table import COMMANDS
from stoker.cli.lazy_group import LazyGroup
from tests.clirun import stoker_text


def lazy_group(name: str) -> LazyGroup:
    """A group of the table ("stoker": the root), freshly built as `stoker` builds it:
    none of its commands built yet."""
    root = typer.main.get_command(app)
    group = root if name == "stoker" else root.get_command(typer.Context(root), name)
    assert isinstance(group, LazyGroup), name
    return group


def test_every_table_is_a_group_of_stoker() -> None:
    root = lazy_group("stoker")
    ctx = typer.Context(root)
    groups = [n for n in root.list_commands(ctx) if isinstance(root.get_command(ctx, n), LazyGroup)]
    assert {"stoker", *groups} == set(COMMANDS)  # no table left unused
    for name in COMMANDS:
        group = lazy_group(name)
        assert group.list_commands(typer.Context(group)) == list(COMMANDS[name])


@pytest.mark.parametrize("group_name", list(COMMANDS))
def test_each_line_is_the_first_sentence_of_the_command_it_names(group_name: str) -> None:
    group = lazy_group(group_name)
    for name, (where, summary) in COMMANDS[group_name].items():
        command = group.get_command(typer.Context(group), name)  # imported and built here
        assert command is not None and command.name == name, where
        assert not command.hidden and not command.deprecated, f"{where}: list it or drop it"
        assert command.get_short_help_str(limit=10**6) == summary, (
            f"stoker/cli/command_table.py: the line of `{group_name} {name}` is not the "
            f"first sentence of {where}'s help; copy it: {command.get_short_help_str(10**6)!r}"
        )


def listing(group: Any, width: int, *, built: bool) -> str:
    """The Commands section of a group's help at a terminal width: from the table, or
    typer's own from the commands built."""
    ctx = typer.Context(group, info_name=group.name, terminal_width=width)
    formatter = ctx.make_formatter()
    if built:
        TyperGroup.format_commands(group, ctx, formatter)
    else:
        group.format_commands(ctx, formatter)
    return formatter.getvalue()


@pytest.mark.parametrize("group_name", list(COMMANDS))
def test_help_lists_what_typer_would_list_from_the_commands(group_name: str) -> None:
    group = lazy_group(group_name)
    from_table = {width: listing(group, width, built=False) for width in (40, 80, 200)}
    assert not group.commands.built  # the listing built no command: nothing imported
    for width, text in from_table.items():
        assert text.startswith("Commands:")
        assert text == listing(group, width, built=True), width  # builds them all


def test_completion_of_a_command_name_gives_the_commands_own_help() -> None:
    # zsh shows each command's help beside its name; from the table, as from the command.
    env = {"_STOKER_COMPLETE": "complete_zsh", "_TYPER_COMPLETE_ARGS": "stoker ckpt "}
    completions = stoker_text(env=env, check=True).stdout
    group = lazy_group("ckpt")
    for name in COMMANDS["ckpt"]:
        command = group.get_command(typer.Context(group), name)
        assert command is not None
        help_text = command.get_short_help_str().replace(":", "\\\\:")
        assert f'"{name}":"{help_text}"' in completions, completions
