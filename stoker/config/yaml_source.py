"""YAML files read with the line of every key, so a bad value can be traced to file:line."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stoker.errors import StokerError

KeyPath = tuple[str, ...]


_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# YAML 1.1 as PyYAML reads it, less two traps: `time: 4:00:00` is base-60 (the
# integer 14400) and `lr: 3e-4` is a string because a float needs a dot.
_INT = re.compile(r"^[-+]?(0b[01_]+|0x[0-9a-fA-F_]+|0[0-7_]+|0|[1-9][0-9_]*)$")
_FLOAT = re.compile(
    r"^[-+]?([0-9][0-9_]*\.[0-9_]*|\.[0-9_]+)([eE][-+]?[0-9]+)?$|^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"
    r"|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"
)


class StokerYamlLoader(yaml.SafeLoader):
    """SafeLoader that reads `3e-4` as a float and `4:00:00` as a string."""


class StokerYamlDumper(yaml.SafeDumper):
    """SafeDumper that quotes exactly what StokerYamlLoader would not read back as a string."""


for _cls in (StokerYamlLoader, StokerYamlDumper):
    _cls.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    _cls.add_implicit_resolver(_INT_TAG, _INT, list("-+0123456789"))
    _cls.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))


def dump_yaml(data: Any, **kwargs: Any) -> str:
    """YAML text that StokerYamlLoader reads back to the same values."""
    return str(yaml.dump(data, Dumper=StokerYamlDumper, **kwargs))


@dataclass(frozen=True)
class YamlDocument:
    """A parsed mapping and the 1-based line of each key path in it."""

    path: Path
    data: dict[str, Any]
    lines: dict[KeyPath, int]

    def where(self, key: KeyPath) -> str:
        """`file:line` of the nearest key path that has a line."""
        for n in range(len(key), 0, -1):
            if key[:n] in self.lines:
                return f"{self.path}:{self.lines[key[:n]]}"
        return str(self.path)


def parse_yaml_value(text: str) -> Any:
    """One scalar or flow value as YAML reads it (`10`, `3e-4`, `true`, `null`, `[1, 2]`)."""
    return yaml.load(text, Loader=StokerYamlLoader)


def read_yaml_mapping(path: Path, *, what: str) -> YamlDocument:
    """Read a YAML file whose top level is a mapping (an empty file is an empty mapping)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StokerError(
            f"{what} {path} does not exist", fix="check the path, or run `stoker init` to write one"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StokerError(f"cannot read {what} {path}: {exc}") from None
    try:
        node = yaml.compose(text, Loader=StokerYamlLoader)
        data = yaml.load(text, Loader=StokerYamlLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise StokerError(
            f"{where}: {what} is not valid YAML: {exc.problem or exc}",
            fix="fix the YAML syntax at that line (indentation, a missing ':' or quote)",
        ) from None
    except yaml.reader.ReaderError as exc:
        # Not a MarkedYAMLError: the reader refuses a character YAML does not allow (a
        # control character, a NUL) at a position in the text, not at a line.
        line = text.count("\n", 0, exc.position) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        escape = (
            f"\\x{code:02x}"
            if code < 0x100
            else f"\\u{code:04x}"
            if code < 0x10000
            else f"\\U{code:08x}"
        )
        raise StokerError(
            f"{path}:{line}: {what} is not valid YAML: it holds the character {chr(code)!r} "
            f"(U+{code:04X}), which YAML does not allow",
            fix=f'delete it, or write it as the escape "{escape}" inside a double-quoted string',
        ) from None
    except yaml.YAMLError as exc:
        raise StokerError(f"{path}: {what} is not valid YAML: {exc}") from None
    if data is None:
        return YamlDocument(path, {}, {})
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise StokerError(
            f"{path}:1: {what} must be a mapping of sections (job:, train:, ...),"
            f" not {type(data).__name__}",
        )
    lines: dict[KeyPath, int] = {}
    _collect_lines(node, (), lines, path, what)
    return YamlDocument(path, data, lines)


def _collect_lines(
    node: yaml.MappingNode, prefix: KeyPath, lines: dict[KeyPath, int], path: Path, what: str
) -> None:
    seen: set[str] = set()
    for key_node, value_node in node.value:
        key = str(key_node.value)
        line = key_node.start_mark.line + 1
        # PyYAML silently keeps the last of two equal keys; a user would not expect that.
        if key in seen:
            dotted = ".".join((*prefix, key))
            raise StokerError(
                f"{path}:{line}: {what} sets {dotted} twice",
                fix=f"keep one `{key}:` in that mapping",
            )
        seen.add(key)
        key_path: KeyPath = (*prefix, key)
        lines[key_path] = line
        if isinstance(value_node, yaml.MappingNode):
            _collect_lines(value_node, key_path, lines, path, what)
