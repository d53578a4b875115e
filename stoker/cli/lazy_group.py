"""A command group that lists its commands from stoker/cli/command_table.py and builds
one only when it runs or shows its own help.

`stoker --help` used to import every command's module and have typer build all 28
commands (inspecting each signature, making click parameters): ~40 of its 110 ms on a
2-core VM, for a listing of names and first sentences. Now it imports no command's
module; `stoker submit --help` imports and builds `submit` alone. A group's help and
shell completion list the table's names and sentences, which click shortens as it
would the commands' own help (tests/cli/test_command_table.py keeps them equal).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from stoker.cli.command_table import COMMANDS


class LazyCommands(MutableMapping[str, Any]):
    """A group's commands by name: the table's, each built when first looked up, then
    any added to the group the usual way (`add_command`)."""

    def __init__(self, table: dict[str, tuple[str, str]], markup_mode: Any) -> None:
        self.table = table
        self.markup_mode = markup_mode
        self.built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.built:
            where, _ = self.table[name]  # KeyError: no such command
            self.built[name] = build_command(name, where, self.markup_mode)
        return self.built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self.built[name] = command

    def __delitem__(self, name: str) -> None:
        del self.built[name]

    def __iter__(self) -> Iterator[str]:
        yield from self.table
        yield from (name for name in self.built if name not in self.table)

    def __len__(self) -> int:
        return len(self.table) + sum(name not in self.table for name in self.built)


def build_command(name: str, where: str, markup_mode: Any) -> Any:
    """The click command typer makes of `where` ("module:attribute": a command's function
    or a group's typer.Typer) registered as `name`: what `app.command(name)(function)` or
    `app.add_typer(group, name=name)` on the root would have made of it."""
    module, attribute = where.split(":")
    # __import__, as an import statement: `python -X importtime` lists the module (it
    # leaves out what importlib.import_module imports, but not what that imports).
    target = getattr(__import__(module, fromlist=[attribute]), attribute)
    holder = typer.Typer(rich_markup_mode=markup_mode)
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name)
    else:
        holder.command(name)(target)
    return typer.main.get_group(holder).commands[name]


class LazyGroup(TyperGroup):
    """A typer group (`typer.Typer(cls=LazyGroup)`) whose commands are the table's
    `COMMANDS[name]`, its name's ("stoker" for the root)."""

    def __init__(self, *, name: str | None = None, **attrs: Any) -> None:
        super().__init__(name=name, **attrs)
        commands = LazyCommands(COMMANDS[name or ""], self.rich_markup_mode)
        commands.update(self.commands)
        self.commands = commands
        self._summaries_only = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # the names, without building a command

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if self._summaries_only and cmd_name in COMMANDS[self.name or ""]:
            return TyperCommand(name=cmd_name, help=COMMANDS[self.name or ""][cmd_name][1])
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        # typer's own listing, of the table's sentences: the same text, nothing built.
        self._summaries_only = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._summaries_only = False

    def shell_complete(self, ctx: Any, incomplete: str) -> Any:
        # Completing a command name (and its help for zsh and fish) from the table.
        self._summaries_only = True
        try:
            return super().shell_complete(ctx, incomplete)
        finally:
            self._summaries_only = False
