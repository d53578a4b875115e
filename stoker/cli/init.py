"""`stoker init`: write a commented example experiment (and site profile), or with
`--plugin NAME` a model package of one's own to start from (stoker/cli/plugin_template/)."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from stoker.errors import StokerError

TEMPLATE = "plugin_template"  # beside this module; `package/` is written as NAME/
PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def init(
    path: Path | None = typer.Argument(
        None,
        help="Experiment file to write (default experiment.yaml); with --plugin, the "
        "package's folder (default ./NAME).",
        show_default=False,
    ),
    plugin: str | None = typer.Option(
        None,
        "--plugin",
        metavar="NAME",
        help="Write a model package NAME to start from instead: pyproject.toml, NAME/model.py "
        "(a small model keeping stoker's model contract), experiment.yaml, tests, README.",
    ),
    profile: bool = typer.Option(
        False,
        "--profile",
        help="Also write a commented site profile ($STOKER_PROFILE or "
        "~/.config/stoker/profile.yaml).",
    ),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite existing files."),
) -> None:
    """Write a commented example experiment file, every key at its default; or, with
    --plugin NAME, a model package of your own to start from.

    The package's folder holds pyproject.toml (pip installable), NAME/model.py (a small
    model with its arguments declared), experiment.yaml naming it (model.arch:
    NAME.model:build), tests/test_model.py and a README; from that folder `stoker check
    experiment.yaml`, `stoker run experiment.yaml` and `stoker submit experiment.yaml`
    work as they are.

    Example: stoker init my-exp.yaml --profile

    Example: stoker init --plugin my_model (writes ./my_model; `stoker init --plugin
    my_model DIR` writes DIR)
    """
    import os
    import shlex

    from stoker.atomic_write import write_text_atomic
    from stoker.cli.output import note
    from stoker.config.render import render_experiment_template, render_profile_template
    from stoker.home import default_profile_path

    if plugin is not None:
        folder = path or Path(plugin)
        targets = plugin_files(plugin, folder)
        refuse_to_overwrite(folder, force)
    else:
        targets = [(path or Path("experiment.yaml"), render_experiment_template(), "experiment")]
    if profile:
        env_path = os.environ.get("STOKER_PROFILE")
        profile_path = Path(env_path).expanduser() if env_path else default_profile_path()
        targets.append((profile_path, render_profile_template(), "site profile"))
    existing = [str(p) for p, _, _ in targets if p.exists()]
    if existing and not force:
        raise StokerError(
            f"{', '.join(existing)} already exists; nothing was written",
            fix="choose another path, or pass --force to overwrite",
        )
    for target, text, what in targets:
        write_text_atomic(target, text)
        note(f"wrote {what} {target}")
    if plugin is not None:
        where = shlex.quote(str(folder))
        note(f"next: cd {where} && stoker check experiment.yaml (its README says more)")
    else:
        note(f"next: stoker config show {targets[0][0]}")


def plugin_files(name: str, folder: Path) -> list[tuple[Path, str, str]]:
    """(where, text, what) of each file of the package NAME's folder, rendered from the
    template; a StokerError for a NAME that cannot be a package of its own."""
    import importlib.resources

    import jinja2

    check_package_name(name, folder)
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    values = {"name": name, "project": name.replace("_", "-")}
    files = []
    pending = [(importlib.resources.files("stoker.cli") / TEMPLATE, folder)]
    while pending:
        source, target = pending.pop()
        for entry in source.iterdir():
            if entry.is_dir():
                pending.append((entry, target / (name if entry.name == "package" else entry.name)))
            elif entry.name.endswith(".j2"):
                text = env.from_string(entry.read_text(encoding="utf-8")).render(values)
                files.append((target / entry.name.removesuffix(".j2"), text, "file"))
    return sorted(files)


def check_package_name(name: str, folder: Path) -> None:
    """NAME must import as `NAME` from the package's folder and mean this package there:
    a Python identifier, and no module of the environment by that name (`torch`, `json`)
    that `model.arch: NAME.model:build` would find first or hide."""
    import keyword

    if not PACKAGE_NAME.fullmatch(name) or keyword.iskeyword(name):
        raise StokerError(
            f"--plugin {name!r} is not a Python package name: ASCII letters, digits and _, "
            "not starting with a digit, not a keyword",
            fix=f"e.g. --plugin {_suggested(name)}",
        )
    if name == "tests":
        raise StokerError(
            "--plugin 'tests' would be the package's own tests folder",
            fix="choose another name, e.g. --plugin my_model",
        )
    where = _module_found(name, folder)
    if where is not None:
        raise StokerError(
            f"--plugin {name!r} would shadow the module {name} ({where}): `import {name}` "
            "finds one of the two, not both",
            fix=f"choose a name no installed module has, e.g. --plugin my_{name}",
        )


def refuse_to_overwrite(folder: Path, force: bool) -> None:
    """Not into a folder that holds anything, unless --force (then the template's files
    are overwritten, the others kept)."""
    if folder.exists() and not folder.is_dir():
        raise StokerError(
            f"{folder} is a file, not a folder; nothing was written",
            fix="choose another folder: stoker init --plugin NAME DIR",
        )
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise StokerError(
            f"{folder} already exists and is not empty; nothing was written",
            fix="choose another folder (stoker init --plugin NAME DIR), or pass --force "
            "to overwrite the template's files in it",
        )


def _module_found(name: str, folder: Path) -> str | None:
    """Where `import NAME` finds a module in this environment, other than the package in
    `folder` itself (installed with `pip install -e`, say); None when it finds none."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # `__main__` and the like: taken all the same
        return "already imported"
    if spec is None:
        return None
    # A package's file, or a namespace package's folders (`python -m stoker` finds the
    # package's own folder in the current one so).
    places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
    if places and all(Path(p).resolve().is_relative_to(folder.resolve()) for p in places):
        return None
    return ", ".join(places) or "built in"


def _suggested(name: str) -> str:
    """A package name close to `name`: `my-model` -> `my_model`."""
    import keyword

    cleaned = re.sub(r"\W+", "_", name, flags=re.ASCII).strip("_").lower()
    if not cleaned:
        return "my_model"
    if not PACKAGE_NAME.fullmatch(cleaned) or keyword.iskeyword(cleaned):
        return f"my_{cleaned}"
    return cleaned
