"""`model.arch` to a model: the factory imported by name, its arguments checked against
its signature (or its declared argument class), called with the data's shapes.

The built-in models go the same way: `av_dit` and `audio_ar` are names for factories in
stoker.runtime.models.build. A problem is a ModelSetupError naming the setting to change
(`model.arch`, `model.args.<name>`) and the fix; `stoker run` asks before it starts
anything (stoker/runtime/preflight.py), the ranks again when they build.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch import nn

from stoker.errors import StokerError
from stoker.import_path import import_callable, last_frame
from stoker.model import DataShapes
from stoker.runtime.models.build import ModelSetupError, data_shapes

if TYPE_CHECKING:
    from stoker.config import DataConfig, ModelConfig


BUILTIN: Mapping[str, str] = {
    "av_dit": "stoker.runtime.models.build:av_dit",
    "audio_ar": "stoker.runtime.models.build:audio_ar",
}
ARCH = "model.arch"


def build_model(model_cfg: ModelConfig, data_cfg: DataConfig) -> nn.Module:
    """The model `model_cfg` names, for clips shaped by `data_cfg`, initialised from
    torch's global RNG (seed it first)."""
    factory = import_factory(model_cfg.arch)
    call_args, call_kwargs = factory_arguments(factory, model_cfg)
    where = _where(factory)
    try:
        model = factory(data_shapes(data_cfg), *call_args, **call_kwargs)
    except ModelSetupError:
        raise
    except Exception as exc:
        raise ModelSetupError(
            ARCH,
            f"{model_cfg.arch} ({where}) raised {type(exc).__name__}: {exc} [{last_frame(exc)}]",
            fix="fix the factory, or the model.args it was given",
        ) from exc
    if not isinstance(model, nn.Module) or not callable(getattr(model, "forward", None)):
        raise ModelSetupError(
            ARCH,
            f"{model_cfg.arch} ({where}) returned {type(model).__name__}, not a "
            "torch.nn.Module with forward(batch)",
            fix="return the nn.Module to train (the contract: stoker/model.py)",
        )
    return model


def import_factory(arch: str) -> Callable[..., Any]:
    """The callable `arch` names (a built-in, or package.module:attr), imported by name."""
    try:
        found = import_callable(
            BUILTIN.get(arch, arch),
            key=ARCH,
            shown=arch,
            kind="a function or class",
            kind_fix="name the function that builds the model",
        )
    except StokerError as exc:
        raise ModelSetupError(ARCH, exc.message, fix=exc.fix or "") from exc
    return typing.cast(Callable[..., Any], found)


def factory_arguments(
    factory: Callable[..., Any], model_cfg: ModelConfig
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) after the data shapes: `model.args` validated against the
    factory's `args` parameter when it is annotated with a dataclass or pydantic
    model, else passed as keywords (checked against the signature); `model.size` as
    `size=` when the factory takes it."""
    given = dict(model_cfg.args)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: pass as given
        return (), given
    params = signature.parameters
    _check_takes_data_first(factory, model_cfg, params, given)
    declared = _declared_args_class(factory, params)
    kwargs: dict[str, Any] = {}
    if "size" in params and "size" not in given:
        kwargs["size"] = model_cfg.size
    if declared is not None:
        kwargs["args"] = _validate(declared, given)
        return (), kwargs
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = [
        n
        for n, p in list(params.items())[1:]
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    unknown = [k for k in given if k not in named and not takes_any]
    if unknown:
        raise ModelSetupError(
            f"model.args.{unknown[0]}",
            f"model.args.{unknown[0]}: {model_cfg.arch} ({_where(factory)}) takes no "
            f"argument {unknown[0]!r}",
            fix=f"use one of: {', '.join(named) or '(none: remove model.args)'}",
        )
    missing = [
        n
        for n in named
        if params[n].default is inspect.Parameter.empty and n not in given and n not in kwargs
    ]
    if missing:
        raise ModelSetupError(
            f"model.args.{missing[0]}",
            f"model.args.{missing[0]} is required by {model_cfg.arch} ({_where(factory)})",
            fix=f"set it: model.args.{missing[0]}=VALUE",
        )
    kwargs.update(given)
    return (), kwargs


def _check_takes_data_first(
    factory: Callable[..., Any],
    model_cfg: ModelConfig,
    params: Mapping[str, inspect.Parameter],
    given: Mapping[str, Any],
) -> None:
    """The factory's first parameter takes the data shapes, positionally: stoker calls
    `factory(data_shapes, **model.args)`. A first parameter that cannot take them (none,
    keyword-only, `*args`), that has a default, that `model.args` sets by name, or that
    is annotated with another class, is a factory written for another caller: said as
    such, with the signature to write, not as the wrong model.args it would turn into."""
    listed = list(params.values())
    first = listed[0] if listed else None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    reason = ""
    if first is not None and first.kind is inspect.Parameter.VAR_POSITIONAL:
        return  # (*args, **kwargs): a wrapper that passes them on
    if first is None or first.kind not in positional:
        reason = "it takes no positional parameter"
    elif first.name in given:
        reason = f"its first parameter {first.name!r} is set by model.args.{first.name}"
    elif first.default is not inspect.Parameter.empty:
        reason = f"its first parameter {first.name!r} has a default ({first.default!r})"
    else:
        hint = _annotation(factory, first.name)
        if isinstance(hint, type) and hint not in (object, DataShapes):
            reason = f"its first parameter {first.name!r} is annotated {hint.__qualname__}"
    if not reason:
        return
    name = getattr(factory, "__name__", "build")
    shown = ["data: DataShapes"]
    for param in listed:
        if param.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in shown:
            shown.append("*")
        shown.append(str(param))
    written = f"def {name}({', '.join(shown)})"
    raise ModelSetupError(
        ARCH,
        f"{model_cfg.arch} ({_where(factory)}) must take the data shapes as its first "
        f"argument (stoker calls {name}(data, **model.args)), but {reason}",
        fix=f"write it as `{written}` (DataShapes from stoker.model: frames, resolution, "
        "samples, modalities; docs/bring-your-own.md)",
    )


def _annotation(factory: Callable[..., Any], name: str) -> Any:
    try:
        return typing.get_type_hints(factory).get(name)
    except Exception:  # an annotation that does not resolve: nothing to say about it
        return None


def _declared_args_class(
    factory: Callable[..., Any], params: Mapping[str, inspect.Parameter]
) -> type | None:
    if "args" not in params:
        return None
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # an annotation that does not resolve: treat as undeclared
        return None
    hint = hints.get("args")
    if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or _is_pydantic(hint)):
        return hint
    return None


def _is_pydantic(cls: type) -> bool:
    return any(base.__module__.startswith("pydantic") for base in cls.__mro__[1:])


def _validate(cls: type, given: dict[str, Any]) -> Any:
    """An instance of `cls` from `given`, by pydantic (dataclasses too): errors name
    `model.args.<field>`."""
    from pydantic import TypeAdapter, ValidationError

    fields = _field_names(cls)
    unknown = [k for k in given if k not in fields]
    if unknown:  # pydantic ignores extra keys of a dataclass: a typo would pass unseen
        key = f"model.args.{unknown[0]}"
        raise ModelSetupError(
            key,
            f"{key}: {cls.__module__}.{cls.__qualname__} has no field {unknown[0]!r}",
            fix=f"{cls.__qualname__} takes {', '.join(fields) or 'no arguments'}",
        )
    try:
        return TypeAdapter(cls).validate_python(given, strict=False)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        key = f"model.args.{field}" if field else "model.args"
        got = f": got {first['input']!r}" if field and "input" in first else ""
        raise ModelSetupError(
            key,
            f"{key}{got}: {first['msg']} ({cls.__module__}.{cls.__qualname__})",
            fix=f"{cls.__qualname__} takes {', '.join(fields)}" if fields else "see its fields",
        ) from exc


def _field_names(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(getattr(cls, "model_fields", {}))


def _where(obj: Any) -> str:
    try:
        return f"{inspect.getsourcefile(obj)}:{inspect.getsourcelines(obj)[1]}"
    except (OSError, TypeError):
        return getattr(obj, "__module__", "?")
