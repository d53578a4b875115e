"""The layering rule of docs/architecture.md, read from the source with `ast` (fast: no
stoker module is imported). Each violation names its file and line.

- Login-node code (cli, config, launcher, tracking, protocol and the shared leaf
  modules) imports no torch, triton, mlflow, submitit, av or soundfile at module level:
  a command imports one inside the function that needs it.
- Each package imports only the packages below it: the runtime never the launcher nor
  the cli; the kernels nothing of stoker outside stoker.kernels; data and checkpoint
  nothing of the launcher, the cli or the runtime; ...
- No module imports a `_private` name of another package.
- No import circle, inside a package or across packages: every import counts, in a
  function or for typing too (the graph is read, not run).
- No module imports the package's face (`stoker/__init__.py`): the version is in
  `stoker/version.py`, a leaf.
- A package split into wings (sub-folders, `WINGS` below) keeps their order: a wing
  imports only itself and the wings listed before its own tier; the package's
  top-level modules stand on all of them.
- Every module of `stoker/` has at most 600 lines, and no folder but `stoker/cli/` (one
  module per command) holds more than 20 modules side by side.

`import`s under `if TYPE_CHECKING:` cost nothing at run time, so they pass the first
rule, but they are dependencies all the same: the others count them.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("torch", "triton", "mlflow", "submitit", "av", "soundfile")

# Modules at the top of the package that everything may use: no stoker imports of their
# own beyond each other, no heavy imports (stoker.process: a package of such modules).
LEAVES = (
    "stoker.version",
    "stoker.metric_names",
    "stoker.modes",
    "stoker.errors",
    "stoker.home",
    "stoker.atomic_write",
    "stoker.redact",
    "stoker.sqlite_retry",
    "stoker.protocol",
    "stoker.model",
    "stoker.import_path",
    "stoker.job_time",
    "stoker.gpus",
    "stoker.mesh_layout",
    "stoker.plural",
    "stoker.process",
)
# Whose module-level imports must stay light (login nodes, `--help`, `import stoker`).
LOGIN_NODE = (
    "stoker.api",
    "stoker.cli",
    "stoker.config",
    "stoker.launcher",
    "stoker.tracking",
    "stoker.__main__",
)

# What each package may import of stoker, besides itself and the leaves.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "stoker.__main__": ("*",),  # `python -m stoker`: the CLI
    "stoker.cli": ("*",),
    # The Python API (`stoker.submit`): what the CLI's job commands use, no more.
    "stoker.api": ("stoker.config", "stoker.tracking", "stoker.launcher"),
    "stoker.config": (),
    "stoker.tracking": ("stoker.config",),
    "stoker.launcher": ("stoker.config", "stoker.tracking", "stoker.data"),
    "stoker.runtime": (
        "stoker.config",
        "stoker.tracking",
        "stoker.data",
        "stoker.kernels",
        "stoker.checkpoint",
    ),
    # `stoker plan`'s engine: on the login node, inside the command's functions (it
    # imports torch); it traces the runtime's step, so it stands above the runtime, and
    # nothing of the runtime imports it.
    "stoker.planning": ("stoker.runtime", "stoker.config", "stoker.data", "stoker.kernels"),
    # Your own loop's API (`from stoker import job`): the runtime's services, on a rank.
    "stoker.job": ("stoker.runtime", "stoker.config"),
    "stoker.data": ("stoker.config",),
    "stoker.checkpoint": (),
    "stoker.kernels": (),
}
# `import stoker` stays light: the package exports the API lazily (PEP 562 __getattr__),
# importing it only inside that function (or for type checkers).
LAZY_EXPORTS = {("stoker", "stoker.api")}
# The package's face: it imports the version and, lazily, the API; nothing imports it.
FACE = "stoker"
# Wings: a package's sub-folders, in tiers from the bottom up. A module of a wing may
# import its own wing and the wings of the tiers below; never a sibling of its tier nor
# one above. The package's top-level modules (and its face) stand above every wing,
# or where the tier TOP_LEVEL (".") is listed: the wings above it build on them.
TOP_LEVEL = "."
WINGS: dict[str, tuple[tuple[str, ...], ...]] = {
    # models < the process group < what a job reports, the samplers < the trainer and
    # the job's lifecycle (top level) < a loop of one's own, built on that lifecycle.
    "stoker.runtime": (
        ("models",),
        ("dist",),
        ("observe", "sampling"),
        (TOP_LEVEL,),
        ("own_loop",),
    ),
    # SLURM's commands and answers, each job's record (ledger, run folder, log text) and
    # the job script; the local backend and doctor's checks on them; launching and
    # `why`; watching (status, logs, a job's end and account); insights over many jobs.
    # control.py and run_local.py, at the top, stand on all of them.
    "stoker.launcher": (
        ("slurm", "jobs", "script"),
        ("local", "doctor"),
        ("launch", "why"),
        ("watch",),
        ("insights",),
    ),
    # Shard and latent formats < media (decode, encode, probe) and the shard writers <
    # data sets (indexes, buckets, sources) < the streaming loader, the pack and the
    # latent-encode pipelines < the SLURM array tasks and the synthetic sets.
    "stoker.data": (
        ("format",),
        ("media", "write"),
        ("sets",),
        ("stream", "pack", "encode"),
        ("jobs", "synthetic"),
    ),
}
MAX_LINES = 600
MAX_MODULES_SIDE_BY_SIDE = 20
MANY_MODULES_ALLOWED = ("stoker/cli",)  # one module per command
# The kernels stand alone (as Liger's do): not even the leaves.
STANDALONE = ("stoker.kernels",)


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted
    names: tuple[str, ...]  # names taken from it (`from target import a, b`)
    module_level: bool  # runs on import (not in a function, not under TYPE_CHECKING)
    type_only: bool  # under `if TYPE_CHECKING:`


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_in(path: Path, root: Path) -> Iterator[Import]:
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for line, target, names, module_level, type_only in _imports(package, path.read_text()):
        yield Import(path, line, module, target, names, module_level, type_only)


@functools.cache
def _imports(package: str, source: str) -> tuple[tuple[int, str, tuple[str, ...], bool, bool], ...]:
    """(line, target, names, module_level, type_only) of each import in `source`, a
    module of `package` (relative imports start there). Cached: the planted-violation
    tests below read copies of the same tree, 300 files each."""
    tree = ast.parse(source, filename=f"a module of {package}")

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> Iterator[tuple]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield (child.lineno, alias.name, (), not in_function and not type_only,
                           type_only)  # fmt: skip
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.rsplit(".", child.level - 1)[0] if child.level > 1 else package
                    target = f"{base}.{child.module}" if child.module else base
                else:
                    target = child.module or ""
                names = tuple(alias.name for alias in child.names)
                yield (child.lineno, target, names, not in_function and not type_only,
                       type_only)  # fmt: skip
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from visit(child, True, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), in_function, True)
                for stmt in child.orelse:
                    yield from visit(
                        ast.Module(body=[stmt], type_ignores=[]), in_function, type_only
                    )
            else:
                yield from visit(child, in_function, type_only)

    return tuple(visit(tree, False, False))


def package_of(module: str) -> str:
    """The layer a module belongs to: `stoker.launcher.why.judge` → `stoker.launcher`;
    a leaf (and the face) is its own."""
    parts = module.split(".")
    return module if len(parts) < 2 or module in LEAVES else ".".join(parts[:2])


def wing_tier(module: str) -> tuple[str, int] | None:
    """(wing, tier) of a module of a winged package; the package's top-level modules
    stand above every tier; None outside such a package."""
    package = package_of(module)
    tiers = WINGS.get(package)
    if tiers is None:
        return None
    first = module[len(package) + 1 :].split(".")[0] if module != package else ""
    top = len(tiers)
    for tier, wings in enumerate(tiers):
        if first in wings:
            return first, tier
        if TOP_LEVEL in wings:
            top = tier
    return "", top


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _resolved_targets(root: Path, imp: Import) -> set[str]:
    """The stoker modules an import names: `from stoker.data import loader` is the module
    stoker.data.loader; `from stoker.data import StreamingLoader` the package's face."""
    if not imp.target.startswith("stoker"):
        return set()
    package = root.joinpath(*imp.target.split("."))
    return {
        f"{imp.target}.{name}"
        if (package / name / "__init__.py").is_file() or (package / f"{name}.py").is_file()
        else imp.target
        for name in imp.names
    } or {imp.target}


def import_graph(root: Path) -> dict[str, dict[str, str]]:
    """module -> {imported stoker module: "file:line" of the first such import}."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted((root / "stoker").rglob("*.py")):
        module = module_name(path, root)
        edges = graph.setdefault(module, {})
        for imp in imports_in(path, root):
            for target in _resolved_targets(root, imp):
                if target != module:
                    edges.setdefault(target, f"{path.relative_to(root)}:{imp.line}")
    return graph


def circles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of two or more modules (Tarjan),
    each in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        # Iterative: a deep recursion would hit Python's limit on a long chain.
        work = [(node, iter(sorted(graph.get(node, ()))))]
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        while work:
            current, children = work[-1]
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[current] = min(low[current], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[current])
                if low[current] == index[current]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == current:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def circle_violations(root: Path) -> list[str]:
    graph = import_graph(root)
    found = []
    for group in circles(graph):
        members = set(group)
        arrows = [
            f"{graph[a][b]} ({a} -> {b})" for a in group for b in sorted(graph[a]) if b in members
        ]
        found.append(f"import circle {' <-> '.join(group)}: " + "; ".join(arrows))
    return found


def shape_violations(root: Path) -> list[str]:
    found = []
    for path in sorted((root / "stoker").rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            found.append(f"{path.relative_to(root)}: {lines} lines; split it (at most {MAX_LINES})")
    for folder in sorted({p.parent for p in (root / "stoker").rglob("*.py")}):
        where = folder.relative_to(root).as_posix()
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        if len(modules) > MAX_MODULES_SIDE_BY_SIDE and where not in MANY_MODULES_ALLOWED:
            found.append(
                f"{where}/: {len(modules)} modules side by side; group them in wings "
                f"(at most {MAX_MODULES_SIDE_BY_SIDE})"
            )
    return found


def violations(root: Path) -> list[str]:
    found: list[str] = []
    for path in sorted((root / "stoker").rglob("*.py")):
        for imp in imports_in(path, root):
            where = f"{path.relative_to(root)}:{imp.line}"
            importer = package_of(imp.module)
            top = imp.target.split(".")[0]
            login_node = imp.module in LEAVES or any(_within(imp.module, p) for p in LOGIN_NODE)
            if top in HEAVY and imp.module_level and login_node:
                found.append(
                    f"{where}: {imp.module} imports {imp.target} at module level; "
                    "login-node code imports it inside the function that needs it"
                )
            if top != "stoker":
                continue
            # `from stoker import config` names the submodule stoker.config;
            # `from stoker import __version__` the package itself (its face).
            targets = _resolved_targets(root, imp)
            for target in sorted(targets):
                layer = package_of(target)
                if target == FACE and imp.module != FACE:
                    found.append(
                        f"{where}: {imp.module} imports the package face stoker "
                        f"({', '.join(imp.names) or 'itself'}); import the module that "
                        "defines it (the version: stoker.version)"
                    )
                    continue
                if layer == importer:
                    found.extend(_wing_violation(where, imp.module, target))
                    continue
                if importer in STANDALONE:
                    found.append(
                        f"{where}: {imp.module} imports {target}; "
                        f"{importer} imports nothing of stoker outside itself"
                    )
                elif layer in LEAVES:
                    continue
                elif importer in LEAVES:
                    if (imp.module, target) in LAZY_EXPORTS and not imp.module_level:
                        continue
                    found.append(f"{where}: leaf {imp.module} imports {target}; "
                                 "a leaf imports only other leaves")  # fmt: skip
                elif importer in MAY_IMPORT:
                    allowed = MAY_IMPORT[importer]
                    if "*" not in allowed and layer not in allowed:
                        found.append(
                            f"{where}: {imp.module} imports {target}; {importer} may import "
                            f"only {', '.join(allowed) or 'nothing of stoker'} (and the leaves)"
                        )
            if imp.target.startswith("stoker"):
                for name in imp.names:
                    owner = package_of(imp.target)
                    if name.startswith("_") and not name.startswith("__") and owner != importer:
                        found.append(
                            f"{where}: {imp.module} imports the private name {name} "
                            f"of {imp.target}; make it public where it belongs"
                        )
    return found


def _wing_violation(where: str, module: str, target: str) -> list[str]:
    mine, theirs = wing_tier(module), wing_tier(target)
    if mine is None or theirs is None or mine[0] == theirs[0]:
        return []  # not winged, or the same wing, or both on the package's top level
    (wing, tier), (_, other_tier) = mine, theirs
    if other_tier < tier:
        return []
    package = package_of(module)
    name = f"{package}.{wing}" if wing else f"{package}'s top level"
    return [
        f"{where}: {module} imports {target}; the wing {name} may import only the wings "
        f"below its tier ({', '.join(w for t in WINGS[package][:tier] for w in t) or 'none'})"
    ]


def test_stoker_follows_the_layering_rule() -> None:
    found = violations(ROOT)
    assert not found, "layering violations:\n" + "\n".join(found)


def test_stoker_has_no_import_circle() -> None:
    found = circle_violations(ROOT)
    assert not found, "\n".join(found)


def test_modules_and_folders_stay_small() -> None:
    found = shape_violations(ROOT)
    assert not found, "\n".join(found)


def test_every_package_has_a_rule() -> None:
    packages = {
        f"stoker.{p.name}" for p in (ROOT / "stoker").iterdir() if (p / "__init__.py").is_file()
    } - set(LEAVES)  # a leaf package (stoker.process): leaves' rule
    assert packages <= set(MAY_IMPORT), packages - set(MAY_IMPORT)
    modules = {f"stoker.{p.stem}" for p in (ROOT / "stoker").glob("*.py") if p.stem != "__init__"}
    undeclared = modules - set(LEAVES) - set(MAY_IMPORT)
    assert not undeclared, f"top-level modules without a rule: {undeclared}"


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        ("stoker/launcher/slow.py", "import torch\n",
         "stoker/launcher/slow.py:1: stoker.launcher.slow imports torch at module level"),
        ("stoker/cli/slow.py", "x = 1\nfrom mlflow import MlflowClient\n",
         "stoker/cli/slow.py:2: stoker.cli.slow imports mlflow at module level"),
        ("stoker/runtime/bad.py",
         "def f():\n    from stoker.launcher.watch.status import STRAGGLER\n",
         "stoker/runtime/bad.py:2: stoker.runtime.bad imports stoker.launcher.watch.status; "
         "stoker.runtime may import only"),
        ("stoker/runtime/bad.py", "from stoker import cli\n",
         "stoker/runtime/bad.py:1: stoker.runtime.bad imports stoker.cli;"),
        ("stoker/kernels/bad.py", "from stoker.errors import StokerError\n",
         "stoker/kernels/bad.py:1: stoker.kernels.bad imports stoker.errors; "
         "stoker.kernels imports nothing of stoker outside itself"),
        ("stoker/data/bad.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
         "    from stoker.runtime.trainer import Trainer\n",
         "stoker/data/bad.py:3: stoker.data.bad imports stoker.runtime.trainer;"),
        ("stoker/checkpoint/bad.py", "from stoker.launcher.jobs import ledger\n",
         "stoker/checkpoint/bad.py:1: stoker.checkpoint.bad imports stoker.launcher.jobs.ledger;"),
        ("stoker/runtime/bad.py", "from stoker.tracking.limits import _cut\n",
         "stoker/runtime/bad.py:1: stoker.runtime.bad imports the private name _cut"),
        ("stoker/errors.py", "from stoker.config import ExperimentConfig\n",
         "stoker/errors.py:1: leaf stoker.errors imports stoker.config;"),
        ("stoker/config/bad.py", "from stoker import __version__\n",
         "stoker/config/bad.py:1: stoker.config.bad imports the package face stoker"),
    ],
)  # fmt: skip
def test_a_forbidden_import_is_named_with_its_file_and_line(
    tmp_path: Path, path: str, source: str, expected: str
) -> None:
    # A copy of the real tree plus one bad module: the rule finds exactly that one.
    for real in (ROOT / "stoker").rglob("*.py"):
        copy = tmp_path / real.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(real.read_text())
    bad = tmp_path / path
    bad.parent.mkdir(parents=True, exist_ok=True)
    if bad.exists():  # appended to a real module: its lines come first
        before = bad.read_text().rstrip("\n") + "\n"
        line = int(expected.split(":")[1]) + before.count("\n")
        expected = expected.replace(f"{path}:{expected.split(':')[1]}:", f"{path}:{line}:")
        source = before + source
    bad.write_text(source)
    found = violations(tmp_path)
    assert len(found) == 1 and found[0].startswith(expected), found


def _copy_of_the_tree(into: Path) -> None:
    for real in (ROOT / "stoker").rglob("*.py"):
        copy = into / real.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(real.read_text())


def test_a_planted_circle_is_named_with_both_arrows(tmp_path: Path) -> None:
    # The copy's own circles (none on a clean tree) plus one planted: two modules of
    # the tracking package, one importing the other inside a function.
    _copy_of_the_tree(tmp_path)
    before = circle_violations(tmp_path)
    package = tmp_path / "stoker" / "tracking"
    (package / "planted_a.py").write_text("from stoker.tracking import planted_b\n")
    (package / "planted_b.py").write_text("def f():\n    from stoker.tracking.planted_a import x\n")
    found = [v for v in circle_violations(tmp_path) if v not in before]
    assert found == [
        "import circle stoker.tracking.planted_a <-> stoker.tracking.planted_b: "
        "stoker/tracking/planted_a.py:1 (stoker.tracking.planted_a -> stoker.tracking.planted_b); "
        "stoker/tracking/planted_b.py:2 (stoker.tracking.planted_b -> stoker.tracking.planted_a)"
    ]


def test_a_wing_importing_upward_or_sideways_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "stoker" / "demo"
    for wing in ("low", "left", "right"):
        (package / wing).mkdir(parents=True)
        (package / wing / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "base.py").write_text("from stoker.demo.right import top\n")
    (package / "left" / "mid.py").write_text("from stoker.demo.low import base\n")
    (package / "right" / "top.py").write_text(
        "from stoker.demo.low import base\nfrom stoker.demo.left import mid\n"
    )
    (package / "face.py").write_text("from stoker.demo.right import top\n")
    monkeypatch.setitem(MAY_IMPORT, "stoker.demo", ())
    monkeypatch.setitem(WINGS, "stoker.demo", (("low",), ("left", "right")))
    found = violations(tmp_path)
    assert [v.split(";")[0] for v in found] == [
        "stoker/demo/low/base.py:1: stoker.demo.low.base imports stoker.demo.right.top",
        "stoker/demo/right/top.py:2: stoker.demo.right.top imports stoker.demo.left.mid",
    ], found
    assert "the wing stoker.demo.low may import only the wings below its tier (none)" in found[0]
    # A wing above the top-level modules builds on them; they may not import it.
    (package / "high").mkdir()
    (package / "high" / "loop.py").write_text("from stoker.demo import face\n")
    (package / "face.py").write_text("from stoker.demo.high import loop\n")
    (package / "low" / "base.py").write_text("")
    (package / "right" / "top.py").write_text("from stoker.demo.low import base\n")
    monkeypatch.setitem(
        WINGS, "stoker.demo", (("low",), ("left", "right"), (TOP_LEVEL,), ("high",))
    )
    found = violations(tmp_path)
    assert [v.split(";")[0] for v in found] == [
        "stoker/demo/face.py:1: stoker.demo.face imports stoker.demo.high.loop"
    ], found


def test_a_long_module_and_a_crowded_folder_are_named(tmp_path: Path) -> None:
    package = tmp_path / "stoker" / "crowded"
    package.mkdir(parents=True)
    for index in range(MAX_MODULES_SIDE_BY_SIDE + 1):
        (package / f"m{index}.py").write_text("x = 1\n")
    (package / "m0.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert shape_violations(tmp_path) == [
        f"stoker/crowded/m0.py: {MAX_LINES + 1} lines; split it (at most {MAX_LINES})",
        f"stoker/crowded/: {MAX_MODULES_SIDE_BY_SIDE + 1} modules side by side; group them "
        f"in wings (at most {MAX_MODULES_SIDE_BY_SIDE})",
    ]


def test_imports_inside_functions_and_for_typing_pass_the_login_node_rule(tmp_path: Path) -> None:
    bad = tmp_path / "stoker" / "launcher" / "fine.py"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import torch\n"
        "def run():\n    import mlflow\n    return mlflow\n"
    )
    assert violations(tmp_path) == []
