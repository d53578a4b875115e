"""The metric names stoker logs live in stoker/metric_names.py alone: dashboards and
queries name them, so a name is changed (or misspelt) in one place or nowhere."""

from __future__ import annotations

import ast
from pathlib import Path

from stoker import metric_names as names

ROOT = Path(__file__).resolve().parents[1]


def _system_literals(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        parts = node.values if isinstance(node, ast.JoinedStr) else [node]
        for part in parts:
            text = part.value if isinstance(part, ast.Constant) else None
            if isinstance(text, str) and text.startswith("system/"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text!r}")
    return found


def test_no_module_but_metric_names_spells_a_system_metric() -> None:
    found = [
        literal
        for path in sorted((ROOT / "stoker").rglob("*.py"))
        if path.name != "metric_names.py"
        for literal in _system_literals(path)
    ]
    assert not found, "\n".join(found)


def test_the_goodput_metrics_of_the_runtime_and_the_launcher_are_the_same_keys() -> None:
    made = names.goodput_metrics(
        allocated_rank_h=2.0,
        productive_rank_h=1.5,
        queue_after_requeue_s=30.0,
        starts=2.0,
        goodput=0.75,
        lost_rank_h={"requeue": 0.5},
    )
    assert made == {
        "system/goodput/allocated_rank_hours": 2.0,
        "system/goodput/productive_rank_hours": 1.5,
        "system/goodput/queue_after_requeue_s": 30.0,
        "system/goodput/starts": 2.0,
        "system/goodput/goodput": 0.75,
        "system/goodput/lost_requeue_rank_hours": 0.5,
    }
    unknown = names.goodput_metrics(
        allocated_rank_h=0.0,
        productive_rank_h=0.0,
        queue_after_requeue_s=0.0,
        starts=1.0,
        goodput=None,
        lost_rank_h={},
    )
    assert names.GOODPUT not in unknown
