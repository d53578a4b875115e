"""Every `stoker ...` line in the docs' shell blocks is a command the CLI accepts: a real
command and sub-command, only its real options, real config keys in its KEY=VALUE
overrides, and the examples/, scripts/ and tests/ paths it names are in the clone. Each
line is parsed by the real click objects of stoker.cli (nothing is invoked), in this
process: the whole module costs a fraction of a CPU-second.

How the docs are read (the convention a page follows to pass):
- Shell blocks: ```bash, ```sh, ```shell (every line a command, a leading `$ ` dropped),
  ```console (only the `$ ` lines; the rest is output) and plain or ```text blocks (the
  `$ ` lines, else the lines that start with `stoker `, a synopsis; a more indented line
  under one continues it). A line ending in `\\` continues on the next.
- `#` starts a comment; `|`, `||`, `&&`, `;` and `&` separate commands, a redirection
  (`> out.txt`) is dropped; leading `NAME=value` environment words are dropped. Only
  the commands that start with `stoker` are parsed; every command's paths are checked.
- A reader's stand-ins for values (`RUN`, `JOB`, `1234`, `<run>`, `local-1`, `EXP.yaml`,
  `PATH`) are arguments like any other: the parser takes them as written and nothing
  checks that they exist; one a typed option refuses (`--keep-last K`) is taken as a value
  of its type. `...` ("more of the same") is dropped; `[...]`, an optional
  part of a synopsis, loses its brackets and is checked; a word `a|b|c` is a choice of
  values, the first is checked.
- In KEY=VALUE overrides a key in capitals or of one letter (`KEY=V1,V2`, `k=v`) is a
  stand-in; any other key must be a config key (under job.env, model.args, ...: any name).
- A path that starts with examples/, scripts/ or tests/ (a word, or a value after `=`)
  must exist, relative to the repository's root.
- A command a page shows failing on purpose (README's `train.stepz=50`) is listed in
  SHOWN_FAILING with the one problem the page shows.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer

from stoker.config.keys import field_at, is_free_mapping, is_section, suggest_keys
from stoker.config.schema import ExperimentConfig

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# A fence may be indented (a block inside a list item): its lines lose that indent.
_FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<lang>\w*)\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
_SEPARATORS = {"|", "||", "&&", ";", "&"}
_REDIRECTION = re.compile(r"^(\d?>>?|&>|<)(.*)$")  # `> out`, `>/dev/null`, `2>&1`
_ENV_WORD = re.compile(r"^[A-Z_][A-Z0-9_]*=")
_OVERRIDE = re.compile(r"^([A-Za-z_][\w]*(?:\.[\w.-]+)*)=")
_CHOICE = re.compile(r"^[\w.-]+(\|[\w.-]+)+$")
_STAND_IN_KEY = re.compile(r"^([A-Z][A-Z0-9_]*|[a-z])$")
_STAND_IN = re.compile(r"^([A-Z][A-Z0-9_]*|<[^>]+>)$")
_PATH_ROOTS = ("examples/", "scripts/", "tests/")


@dataclass(frozen=True)
class DocCommand:
    where: str  # page:line
    line: str  # as the page writes it, continuations joined
    block: int = field(default=0, compare=False)  # the line its block starts at


def _command_lines(lang: str, body: str) -> list[tuple[int, str]]:
    """(offset of the line in the block, the command) of one fenced block."""
    lines = body.splitlines()
    prompted = any(line.startswith("$ ") for line in lines)
    found: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line, start = lines[i], i
        i += 1
        if prompted or lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        elif lang not in ("bash", "sh", "shell") and not line.startswith("stoker "):
            continue
        while line.endswith("\\") and i < len(lines):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        if lang in ("", "text") and not prompted:  # a synopsis's indented continuation
            while i < len(lines) and lines[i].startswith("  ") and lines[i].strip():
                line += " " + lines[i].strip()
                i += 1
        if line.strip() and not line.lstrip().startswith("#"):
            found.append((start, line))
    return found


def doc_commands(pages: list[Path] = PAGES) -> list[DocCommand]:
    """Every command line of the shell blocks of the given pages."""
    commands = []
    for page in pages:
        text = page.read_text()
        for fence in _FENCE.finditer(text):
            lang, indent = fence["lang"], len(fence["indent"])
            if lang not in ("", "text", "bash", "sh", "shell", "console"):
                continue
            first = text[: fence.start("body")].count("\n") + 1
            body = "\n".join(line[indent:] for line in fence["body"].splitlines())
            for offset, line in _command_lines(lang, body):
                where = f"{page.relative_to(REPO)}:{first + offset}"
                commands.append(DocCommand(where, line, first))
        for first, body in _indented_blocks(_FENCE.sub(_blank_lines, text)):
            for offset, line in _command_lines("", body):
                where = f"{page.relative_to(REPO)}:{first + offset}"
                commands.append(DocCommand(where, line, first))
    return sorted(commands, key=_page_order)


def _page_order(command: DocCommand) -> tuple[str, int]:
    page, line = command.where.split(":")
    return page, int(line)


def _blank_lines(fence: re.Match[str]) -> str:
    """A fenced block as as many empty lines: what is left is the page's own text."""
    return "\n" * fence.group(0).count("\n")


def _indented_blocks(text: str) -> list[tuple[int, str]]:
    """(the line of its first line, its text) of each indented code block: lines indented
    by four spaces or more after an empty line, as Markdown shows code."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1]):
            start = i
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                i += 1
            blocks.append((start + 1, "\n".join(line[4:] for line in lines[start:i])))
        else:
            i += 1
    return blocks


def shell_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line, each as its words, stand-ins unwrapped."""
    commands: list[list[str]] = [[]]
    words = iter(shlex.split(line, comments=True))
    for word in words:
        if word in _SEPARATORS:
            commands.append([])
        elif redirection := _REDIRECTION.match(word):
            if not redirection.group(2):  # the file is the next word
                next(words, None)
        elif not commands[-1] and _ENV_WORD.match(word):
            continue
        else:
            word = _unwrap(word)
            if word and word != "...":
                commands[-1].append(word)
    return [c for c in commands if c]


def _unwrap(word: str) -> str:
    if word.startswith("["):  # `[--json]`, `[k=v`: an optional part of a synopsis
        word = word.lstrip("[")
    while word.endswith("]") and word.count("]") > word.count("["):
        word = word[:-1]
    return word.split("|")[0] if _CHOICE.match(word) else word


# typer 0.28 builds its commands with a copy of click of its own (typer._click): its
# classes are known here by what they do and by the bases of typer's public exceptions.
UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


@cache
def root_command() -> Any:
    """The whole command tree: typer's click objects for stoker.cli.main's app. A lazy
    group is fine: sub-commands are found by its own get_command."""
    from stoker.cli.app import app

    return typer.main.get_command(app)


def parse(args: list[str]) -> Any:
    """The context of the innermost (sub-)command the words name, as `stoker` parses
    them; click's UsageError if it would refuse them, typer.Exit for --help, --version."""
    from stoker.cli.trailing import split_argv

    args = split_argv(args)  # the command after `--` is cut off as main() cuts it
    command, name, parent = root_command(), "stoker", None
    with contextlib.redirect_stdout(io.StringIO()):  # what --help would print
        while True:
            if not hasattr(command, "resolve_command"):  # not a group
                return _leaf_context(command, name, args, parent)
            ctx = command.make_context(name, list(args), parent=parent)
            # A group's parse keeps what follows its sub-command's name in ctx.args.
            name_and_rest = args[len(args) - len(ctx.args) - 1 :]
            found, sub, args = command.resolve_command(ctx, name_and_rest)
            command, name, parent = sub, found, ctx


def _leaf_context(command: Any, name: str, args: list[str], parent: Any) -> Any:
    """make_context, where a stand-in value of a typed option (`--keep-last K`) is taken
    as a value of its type: the option's first choice, its minimum, or 1."""
    while True:
        try:
            return command.make_context(name, list(args), parent=parent)
        except typer.BadParameter as error:
            message, param = error.format_message(), error.param
            word = next((w for w in args if _STAND_IN.match(w) and f"'{w}'" in message), None)
            if word is None or param is None:
                raise
            choices = getattr(param.type, "choices", None)
            value = choices[0] if choices else getattr(param.type, "min", None) or 1
            args = [str(value) if w == word else w for w in args]


def key_problem(key: str) -> str | None:
    """Why `key=...` is no override stoker takes, with the schema's did-you-mean."""
    path = tuple(key.split("."))
    info = field_at(ExperimentConfig, path)
    if info is not None and not is_section(info):
        return None
    if info is None and len(path) > 1 and is_free_mapping(field_at(ExperimentConfig, path[:-1])):
        return None  # job.env.HF_TOKEN, model.args.width: names the user chooses
    what = "a section, not a key" if info is not None else "not a config key"
    hints = suggest_keys(key)
    return f"{key} is {what}" + (f" (did you mean {', '.join(hints)}?)" if hints else "")


def problems(line: str) -> list[str]:
    """What is wrong with one command line of the docs; [] when nothing is."""
    found: list[str] = []
    for words in shell_commands(line):
        for word in words:
            path = word.split("=", 1)[-1]
            if path.startswith(_PATH_ROOTS) and not (REPO / path).exists():
                found.append(f"{path} is not a file or folder of the repository")
        if words[0] != "stoker":
            continue
        try:
            ctx = parse(words[1:])
        except typer.Exit:  # --help, --version
            continue
        except UsageError as error:
            command = error.ctx.command_path if error.ctx else "stoker"
            found.append(f"`{command}` refuses it: {error.format_message()}")
            continue
        for param in ctx.command.params:
            if param.param_type_name != "argument":
                continue
            value = ctx.params.get(param.name or "")
            for arg in value if isinstance(value, list | tuple) else [value]:
                match = _OVERRIDE.match(str(arg))
                if match and not _STAND_IN_KEY.match(match.group(1)):
                    found += filter(None, [key_problem(match.group(1))])
    return found


COMMANDS = doc_commands()
STOKER_COMMANDS = [c for c in COMMANDS if any(w[0] == "stoker" for w in shell_commands(c.line))]


def test_the_docs_shell_blocks_are_read() -> None:
    pages = {c.where.split(":")[0] for c in STOKER_COMMANDS}
    for page in [
        "README.md",
        "docs/jobs.md",
        "docs/bring-your-own.md",
        "docs/data.md",
        "docs/plan.md",
        "docs/user-guide.md",
        "docs/operators.md",
        "docs/checkpoints.md",
    ]:
        assert page in pages, f"no `stoker` command read from {page}"
    assert len(STOKER_COMMANDS) >= 60, len(STOKER_COMMANDS)


# Commands a page shows failing on purpose, known by a word of theirs: the one problem
# the page shows.
SHOWN_FAILING = {
    "train.stepz=50": "train.stepz is not a config key (did you mean train.steps?)",  # README
}


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_each_command_of_the_docs_is_one_the_cli_takes(command: DocCommand) -> None:
    shown = [problem for word, problem in SHOWN_FAILING.items() if word in command.line]
    assert problems(command.line) == shown, f"{command.where}: {command.line}"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("stoker submit exp.yaml --nodez 2", "No such option: --nodez"),
        ("stoker ckpt lss PATH", "`stoker ckpt` refuses it: No such command 'lss'"),
        ("stoker run train.stepz=20 | head", "train.stepz is not a config key (did you mean"),
        ("stoker sweep exp.yaml train=1,2", "train is a section, not a key"),
        ("stoker run -- python examples/nope.py", "examples/nope.py is not a file or folder"),
        ("stoker data encode SRC DST -e m:f --slurm --time", "--time"),
    ],
)
def test_a_drift_is_caught(line: str, expected: str) -> None:
    """What the docs could get wrong, planted: the check names it."""
    assert any(expected in p for p in problems(line)), problems(line)


def test_stand_ins_and_shell_syntax_pass() -> None:
    for line in [
        "stoker --help",
        "stoker ckpt export PATH OUT [--format safetensors|torch] [--register NAME [--json]]",
        "stoker plan EXP.yaml [k=v ...] --partition gpu  # the partition's GPUs",
        "cd ~/proj && STOKER_HOME=/tmp/s stoker status local-1 --json > out.json 2>&1",
        "stoker doctor >/dev/null || echo 'not ready'",
        "stoker sweep exp.yaml 'KEY=V1,V2' job.env.HF_TOKEN=x model.args.width=8",
        "stoker submit --nodes 2 -- python -c \"import os; print(os.environ['RANK'])\"",
    ]:
        assert problems(line) == [], line
