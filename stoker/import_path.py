"""What a setting names as `package.module:attr` (model.arch, data.transform), imported
by name: never pickled, never from a file path, so that every rank and loader worker
imports the same code the same way. Each failure is a StokerError naming the setting,
the value and the fix: a module that is not there (and where it was looked for), one
that fails to import (its error and line), a missing or non-callable attribute."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from typing import Any

from stoker.errors import StokerError


def import_callable(
    path: str,
    *,
    key: str,
    shown: str | None = None,
    noun: str = "callables",
    kind: str = "a function",
    kind_fix: str = "name the function",
) -> Any:
    """The callable `path` names. `key` and `shown` (the value as the user wrote it,
    default `path`) begin each message; `noun` lists the module's callables for a name
    that is not there; `kind` and `kind_fix` speak of a name that is not callable."""
    shown = path if shown is None else shown
    the_current_folder_first()
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise StokerError(
            f"{key} {shown!r} is not an import path package.module:function",
            fix="name a function by its module's dotted name, e.g. mypkg.things:build",
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise StokerError(
                f"{key} {shown!r}: no module {missing!r} in {os.getcwd()} (the folder the "
                f"job runs in) nor installed in {sys.prefix}",
                fix=f"run stoker from the folder that holds {missing.split('.')[0]}/, or pip "
                f"install your package into {sys.prefix}",
            ) from exc
        raise _import_failed(key, shown, module_name, exc) from exc
    except Exception as exc:
        raise _import_failed(key, shown, module_name, exc) from exc
    found: Any = module
    for part in attr.split("."):
        if not hasattr(found, part):
            names = _callables_defined_in(module)
            close = difflib.get_close_matches(attr, names, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            where = getattr(module, "__file__", None) or module_name
            raise StokerError(
                f"{key} {shown!r}: module {module_name} ({where}) has no {attr!r}{hint}",
                fix=f"name one of its {noun}: {', '.join(names) or '(none)'}",
            )
        found = getattr(found, part)
    if not callable(found):
        raise StokerError(f"{key} {shown!r} is a {type(found).__name__}, not {kind}", fix=kind_fix)
    return found


def _callables_defined_in(module: Any) -> list[str]:
    """The public functions and classes `module` defines itself, not those it imports
    (`dataclass`, `Any`): what a user could mean to name."""
    return sorted(
        name
        for name, value in vars(module).items()
        if callable(value)
        and not name.startswith("_")
        and getattr(value, "__module__", None) == module.__name__
    )


def the_current_folder_first() -> None:
    """Put the current folder first on the import path, as `python -m` does for the
    ranks, the model check and loader workers: one rule for every command that imports a
    user's code (check, run, submit, plan, sample, export, sweep, data encode), whether
    it imports in its own process or in a child. The console script alone puts only its
    own folder there, so `stoker plan` did not find a package that `stoker run` did."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)


def last_frame(exc: BaseException) -> str:
    """file:line where `exc` was raised (the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "no traceback"


def _import_failed(key: str, shown: str, module_name: str, exc: BaseException) -> StokerError:
    return StokerError(
        f"{key} {shown!r}: importing {module_name} raised {type(exc).__name__}: {exc} "
        f"[{last_frame(exc)}]",
        fix=f"fix the error in {module_name} (python -c 'import {module_name}' shows it)",
    )
