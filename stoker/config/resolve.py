"""How an experiment is resolved from its sources, and where each value came from.

Precedence, lowest first: built-in defaults < site profile < experiment YAML <
`a.b=c` overrides < explicit command-line flags. `resolve_config` turns each source
into leaf assignments, checking every key against the schema as it goes, merges them,
validates once and maps every validation error back to the source of the value; all
problems are reported together. A job reads only the frozen YAML
(`stoker.config.frozen`), never the sources.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from stoker.config.keys import (
    KeyPath,
    describe_expected,
    dotted,
    field_at,
    is_free_mapping,
    is_section,
    leaf_paths,
    suggest_keys,
)
from stoker.config.overrides import parse_override, shown_override
from stoker.config.paths import absolute_paths
from stoker.config.profile import PROFILE_KEYS, find_profile
from stoker.config.schema import ExperimentConfig
from stoker.config.unsafe_values import unsafe_reason
from stoker.config.yaml_source import read_yaml_mapping
from stoker.errors import StokerError
from stoker.redact import printable_line, redact_mapping


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a config: where, which key, what, and close valid keys."""

    where: str
    key: str
    message: str
    suggestions: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        text = f"{self.where}: {self.key}: {self.message}"
        if self.suggestions:
            text += f" (did you mean {' or '.join(self.suggestions)}?)"
        return text


SourceKind = Literal["default", "profile", "file", "override", "flag"]


@dataclass(frozen=True)
class Source:
    """Where a value came from: `file examples/tiny.yaml:12`, `override train.steps=10`..."""

    kind: SourceKind
    where: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.where}" if self.where else self.kind


DEFAULT = Source("default")


class ConfigError(StokerError):
    """An experiment that does not validate: every problem, each with its source."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        count = len(self.problems)
        head = "invalid experiment config" + (f" ({count} problems)" if count > 1 else "")
        body = "\n".join(f"  {p}" for p in self.problems)
        fix = "correct the values above; nothing was run or submitted"
        if any("job.pass_env" in p.message for p in self.problems):
            fix += " (secrets: see Secrets in docs/user-guide.md)"
        super().__init__(f"{head}:\n{body}", fix=fix)


@dataclass(frozen=True)
class ConfigRow:
    key: str
    value: Any
    source: Source
    description: str


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated experiment and the source of each of its values."""

    config: ExperimentConfig
    sources: Mapping[KeyPath, Source]
    profile: Path | None = None
    experiment: Path | None = None

    def source_of(self, key: KeyPath) -> Source:
        for n in range(len(key), 0, -1):
            if key[:n] in self.sources:
                return self.sources[key[:n]]
        return DEFAULT

    def rows(self) -> Iterator[ConfigRow]:
        """One row per leaf, in schema order; mappings such as job.env one row per entry."""
        data = self.config.model_dump(mode="json", by_alias=True)
        for path in leaf_paths(ExperimentConfig):
            value: Any = data
            for part in path:
                value = value[part]
            info = field_at(ExperimentConfig, path)
            description = (info.description if info else None) or ""
            if isinstance(value, dict) and value:
                for sub, subvalue in value.items():
                    key = (*path, sub)
                    yield ConfigRow(dotted(key), subvalue, self.source_of(key), description)
            else:
                yield ConfigRow(dotted(path), value, self.source_of(path), description)


Assignment = tuple[KeyPath, Any, Source]


def resolve_config(
    experiment: Path | None = None,
    overrides: Sequence[str] = (),
    flags: Mapping[str, tuple[Any, str]] | None = None,
    *,
    profile: Path | None = None,
    use_profile: bool = True,
    anchor_paths: bool = True,
) -> ResolvedConfig:
    """Merge defaults, profile, experiment file, overrides and flags, then validate.

    `flags` maps a dotted key to `(value, flag)`, e.g. `{"job.nodes": (2, "--nodes")}`;
    a None value means the flag was not given. Relative paths are made absolute against
    the folder of their source (stoker/config/paths.py); `anchor_paths=False` reads them
    as written (a frozen config, whose paths are the job's). Raises ConfigError listing
    every problem.
    """
    problems: list[Problem] = []
    assignments: list[Assignment] = []

    profile_path = find_profile(profile) if use_profile else None
    if profile_path is not None:
        doc = read_yaml_mapping(profile_path, what="site profile")
        for key, value in doc.data.items():
            target = PROFILE_KEYS.get(str(key))
            where = doc.where((str(key),))
            if target is None:
                problems.append(
                    Problem(
                        where,
                        str(key),
                        "is not a site profile key",
                        suggest_keys(str(key), list(PROFILE_KEYS)),
                    )
                )
                continue
            # Lines are those of the profile's own keys (env.X for job.env.X).
            where_of = functools.partial(_profile_where, doc.where, str(key), target)
            assignments += _flatten(target, value, Source("profile", where), problems, where_of)

    if experiment is not None:
        doc = read_yaml_mapping(experiment, what="experiment file")
        for key, value in doc.data.items():
            path: KeyPath = (str(key),)
            assignments += _flatten(
                path, value, Source("file", doc.where(path)), problems, doc.where
            )

    for text in overrides:
        key_path, value, raw = parse_override(text)
        # A string key takes the text as written: job.env.N=1e5 is "1e5", not 100000.0.
        if _takes_text(key_path) and raw not in ("null", "~"):
            value = raw
        source = Source("override", shown_override(text))
        assignments += _flatten(key_path, value, source, problems, None)

    for key, (value, flag) in (flags or {}).items():
        if value is not None:
            flag_path = tuple(key.split("."))
            assignments += _flatten(flag_path, value, Source("flag", flag), problems, None)

    # Before validation: a refused value must not reach pydantic, whose errors quote it.
    assignments = _refuse_unsafe_values(assignments, problems)
    if anchor_paths:
        assignments = absolute_paths(
            assignments, experiment=experiment, profile=profile_path, cwd=Path.cwd()
        )
    data: dict[str, Any] = {}
    sources: dict[KeyPath, Source] = {}
    for path, value, source in assignments:
        node: dict[str, Any] = data
        for part in path[:-1]:
            # A later key inside what an earlier source set to a scalar (job.env=x, then
            # job.env.A=1): the later one wins, and validation judges the result.
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
        sources[path] = source

    # Unknown keys were left out of `data`; validate the rest too so one run
    # of `config show` reports every problem, not the first.
    try:
        config = ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        problems += _problems_from(exc, sources)
    if problems:
        raise ConfigError(_in_line_order(problems, [profile_path, experiment]))
    return ResolvedConfig(config, sources, profile_path, experiment)


def _in_line_order(problems: list[Problem], files: Sequence[Path | None]) -> list[Problem]:
    """Problems as the reader meets them: the profile's, then the experiment file's, each in
    line order, then those of overrides and flags as given. Key checks and validation find
    them in two passes, so their own order is not the file's."""
    rank = {str(path): index for index, path in enumerate(files) if path is not None}

    def position(problem: Problem) -> tuple[int, int]:
        path, _, line = problem.where.rpartition(":")
        if path in rank and line.isdigit():
            return rank[path], int(line)
        if problem.where in rank:  # a file's problem without a line: its first
            return rank[problem.where], 0
        return len(rank), 0

    return sorted(problems, key=position)


def _flatten(
    path: KeyPath,
    value: Any,
    source: Source,
    problems: list[Problem],
    where_of: Callable[[KeyPath], str] | None,
) -> list[Assignment]:
    """Split a value into leaf assignments, checking each key against the schema.

    Sections recurse; free mappings such as job.env merge key by key, so a profile's
    NCCL settings and an experiment's own variables add up; anything else replaces.
    """
    where = where_of(path) if where_of else str(source)
    field = field_at(ExperimentConfig, path)
    if field is None:
        if len(path) > 1 and is_free_mapping(field_at(ExperimentConfig, path[:-1])):
            return [(path, value, source)]
        problems.append(
            Problem(where, dotted(path), "is not a config key", suggest_keys(dotted(path)))
        )
        return []
    if is_section(field):
        if not isinstance(value, dict):
            problems.append(
                Problem(
                    where,
                    dotted(path),
                    f"is a section, not a value ({value!r}); set its keys, e.g. "
                    f"{dotted(path)}.{next(_section_keys(path))}=...",
                )
            )
            return []
        result: list[Assignment] = []
        for key, sub in value.items():
            sub_path = (*path, str(key))
            sub_source = Source(source.kind, where_of(sub_path)) if where_of else source
            result += _flatten(sub_path, sub, sub_source, problems, where_of)
        return result
    if is_free_mapping(field) and isinstance(value, dict):
        return [
            (
                (*path, str(k)),
                v,
                Source(source.kind, where_of((*path, str(k)))) if where_of else source,
            )
            for k, v in value.items()
        ] or [(path, {}, source)]
    return [(path, value, source)]


def _refuse_unsafe_values(
    assignments: list[Assignment], problems: list[Problem]
) -> list[Assignment]:
    """Drop, and report without their values, the secrets (stoker/redact.py) and the
    text no environment, argument or script can hold (stoker/config/unsafe_values.py)."""
    kept = []
    for path, value, source in assignments:
        reason = unsafe_reason(path, value)
        if reason is None:
            kept.append((path, value, source))
            continue
        where = source.where if source.kind in ("file", "profile") else str(source)
        problems.append(Problem(where, _shown_key(path), reason))
    return kept


def _shown_key(path: KeyPath) -> str:
    # A key can be as hostile as a value (job.env."\0"): show it printable.
    return printable_line(dotted(path))


def _profile_where(
    where: Callable[[KeyPath], str], key: str, target: KeyPath, path: KeyPath
) -> str:
    return where((key, *path[len(target) :]))


def _takes_text(path: KeyPath) -> bool:
    info = field_at(ExperimentConfig, path)
    if info is None and len(path) > 1:
        parent = field_at(ExperimentConfig, path[:-1])
        return is_free_mapping(parent) and typing.get_args(parent.annotation)[1:] == (str,)  # type: ignore[union-attr]
    return info is not None and info.annotation in (str, str | None)


def _section_keys(path: KeyPath) -> Iterator[str]:
    for leaf in leaf_paths(ExperimentConfig):
        if leaf[: len(path)] == path:
            yield leaf[len(path)]


def _element_key(field_path: KeyPath, loc: KeyPath) -> str:
    """`data.resolution[1]`; in a list of mappings, `data.buckets[0].clip_seconds`."""
    rest = loc[len(field_path) :]
    if len(rest) > 1 and rest[0].isdigit():
        return f"{dotted(field_path)}[{rest[0]}]." + dotted(rest[1:])
    return f"{dotted(field_path)}[{loc[-1]}]"


def _problems_from(exc: ValidationError, sources: Mapping[KeyPath, Source]) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False):
        loc = tuple(str(part) for part in error["loc"])
        # Errors inside a list or tuple name the element: report the field.
        field_path = loc
        while (
            field_path
            and field_at(ExperimentConfig, field_path) is None
            and not (
                len(field_path) > 1 and is_free_mapping(field_at(ExperimentConfig, field_path[:-1]))
            )
        ):
            field_path = field_path[:-1]
        message = str(error["msg"]).removeprefix("Value error, ")
        source = _source_for(loc, message, sources)
        where = source.where if source.kind in ("file", "profile") else str(source)
        field = field_at(ExperimentConfig, field_path)
        if field is None and field_path:
            field = field_at(ExperimentConfig, field_path[:-1])
        expected = describe_expected(field) if field is not None else ""
        got = error.get("input")
        if isinstance(got, dict):  # a free mapping: never quote a secret's value
            got = redact_mapping(got)
        key = (
            dotted(loc)
            if len(loc) == len(field_path) or is_free_mapping(field_at(ExperimentConfig, loc[:-1]))
            else _element_key(field_path, loc)
        )
        if error["type"] == "value_error":
            # Our validators say what form is expected; the type is not the issue.
            text = f"got {got!r}: {message}"
        elif isinstance(got, dict):
            text = f"expected {expected} ({message})"
        else:
            text = f"got {got!r}; expected {expected} ({message})"
        problems.append(Problem(where, key, text))
    return problems


def _source_for(loc: KeyPath, message: str, sources: Mapping[KeyPath, Source]) -> Source:
    for n in range(len(loc), 0, -1):
        if loc[:n] in sources:
            return sources[loc[:n]]
    # An error on a whole mapping (job.env): the entry the message names set it.
    children = [(path, src) for path, src in sources.items() if path[: len(loc)] == loc]
    for path, src in children:
        if repr(path[-1]) in message:
            return src
    return children[-1][1] if children else DEFAULT
