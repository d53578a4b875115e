"""Walking the config schema by dotted key: lookups, suggestions, readable types."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from functools import cache
from typing import Any, Literal, Union

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from stoker.config.schema import ExperimentConfig

KeyPath = tuple[str, ...]


def dotted(path: Sequence[str]) -> str:
    return ".".join(path)


def _fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """Fields by the name a user writes (the alias where there is one)."""
    return {(info.alias or name): info for name, info in model.model_fields.items()}


def _model_of(info: FieldInfo) -> type[BaseModel] | None:
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def field_at(model: type[BaseModel], path: Sequence[str]) -> FieldInfo | None:
    """The field at a dotted path, or None if the schema has no such key."""
    current: type[BaseModel] | None = model
    info: FieldInfo | None = None
    for part in path:
        if current is None:
            return None
        info = _fields(current).get(part)
        if info is None:
            return None
        current = _model_of(info)
    return info


def is_section(info: FieldInfo | None) -> bool:
    return info is not None and _model_of(info) is not None


def is_free_mapping(info: FieldInfo | None) -> bool:
    """A dict-valued field (job.env, tracking.tags) whose keys the user chooses."""
    return info is not None and typing.get_origin(info.annotation) is dict


def leaf_paths(model: type[BaseModel], prefix: KeyPath = ()) -> list[KeyPath]:
    """Every non-section key of the schema, in declaration order."""
    paths: list[KeyPath] = []
    for key, info in _fields(model).items():
        sub = _model_of(info)
        if sub is not None:
            paths += leaf_paths(sub, (*prefix, key))
        else:
            paths.append((*prefix, key))
    return paths


def section_paths(model: type[BaseModel], prefix: KeyPath = ()) -> list[KeyPath]:
    """Every section of the schema (`train`, `job`, ...), in declaration order."""
    paths: list[KeyPath] = []
    for key, info in _fields(model).items():
        sub = _model_of(info)
        if sub is not None:
            paths += [(*prefix, key), *section_paths(sub, (*prefix, key))]
    return paths


@cache
def _all_keys() -> list[str]:
    return [dotted(p) for p in leaf_paths(ExperimentConfig)]


def _keys_and_sections_like(key: str) -> list[str]:
    # Sections only at the key's own depth: `trian` -> `train`, while `model.widht` is
    # not offered `model` itself.
    depth = key.count(".") + 1
    sections = [dotted(p) for p in section_paths(ExperimentConfig) if len(p) == depth]
    return [*_all_keys(), *sections]


def suggest_keys(key: str, candidates: Sequence[str] | None = None) -> list[str]:
    """Close matches for a misspelled key or section: `train.stepz` -> `train.steps`,
    `lr` -> `optim.lr`, `trian` -> `train`."""
    pool = list(candidates) if candidates is not None else _keys_and_sections_like(key)
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [c for c in pool if c.rsplit(".", 1)[-1] == leaf and c != key]
    close = difflib.get_close_matches(key, pool, n=3, cutoff=0.6)
    if close:
        # Only the ones about as close as the best: `train.stepz` is `train.steps`, and
        # naming `train.seed` beside it would make the reader choose.
        best = _ratio(key, close[0])
        close = [c for c in close if _ratio(key, c) >= best - 0.1]
    seen: list[str] = []
    for c in same_leaf + close:
        if c not in seen:
            seen.append(c)
    return seen[:3]


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def describe_expected(info: FieldInfo) -> str:
    """A field's type and bounds in words: 'an integer >= 1', "one of 'bf16', 'fp32'"."""
    text = describe_type(info.annotation)
    bounds = _bounds(info.metadata)
    return f"{text} {bounds}" if bounds else text


def describe_type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        base = describe_type(args[0])
        bounds = _bounds(args[1:])
        return f"{base} {bounds}" if bounds else base
    if origin in (Union, types.UnionType):
        options = [describe_type(a) for a in args if a is not type(None)]
        nullable = type(None) in args
        return " or ".join(options + (["null"] if nullable else []))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is list:
        if args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            keys = ", ".join(info.alias or name for name, info in args[0].model_fields.items())
            return f"a list of mappings {{{keys}}}"
        return f"a list of {_plural(describe_type(args[0]))}" if args else "a list"
    if origin is tuple:
        return f"a list of {len(args)} values [" + ", ".join(describe_type(a) for a in args) + "]"
    if origin is dict:
        return (
            f"a mapping of {_plural(describe_type(args[0]))} to {_plural(describe_type(args[1]))}"
        )
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if annotation in names:
        return names[annotation]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a mapping (section)"
    return str(annotation)


def _plural(text: str) -> str:
    for article in ("an ", "a "):
        if text.startswith(article):
            return text[len(article) :] + "s"
    return text


def _bounds(metadata: Sequence[Any]) -> str:
    parts = []
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            parts.append(f">= {m.ge}")
        elif isinstance(m, annotated_types.Gt):
            parts.append(f"> {m.gt}")
        elif isinstance(m, annotated_types.Le):
            parts.append(f"<= {m.le}")
        elif isinstance(m, annotated_types.Lt):
            parts.append(f"< {m.lt}")
    return " and ".join(parts)
