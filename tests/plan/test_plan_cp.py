"""`stoker plan` with context parallelism (issue [5/8]): CP candidates where every
sequence splits (Ulysses where the heads do, rings for non-causal models), their
memory traced as one CP rank computes its share, their time with the all-to-all and
ring traffic; a clip that fits only with CP gets a CP plan that says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.config import resolve_config
from stoker.gpus import gpu_spec
from stoker.planning.plan import fits_note, make_plan
from stoker.planning.search import GIB, Target, cp_options, size_text
from stoker.planning.timing import StepWork, step_time
from stoker.planning.trace import AttentionFacts, ModelFacts

REPO = Path(__file__).resolve().parents[2]
LONG_CLIP = [
    "model.size=tiny", "data.resolution=[128,128]", "data.clip_seconds=4",
    "data.batch_size=4", "train.precision=fp32",
]  # fmt: skip


def test_a_clip_that_fits_only_with_cp_gets_a_cp_plan_that_says_so() -> None:
    """4 CPU ranks of 82 MiB: no layout without CP fits the 2208-token clip (its least,
    full recompute, needs 94 MiB); with CP some do, and the fastest of them is chosen."""
    cfg = resolve_config(None, LONG_CLIP, use_profile=False).config
    plan = make_plan(cfg, Target(1, 4, None, int(0.08 * GIB), "4 CPU ranks"))
    chosen = plan.chosen
    assert chosen is not None and chosen.cp > 1, [c.describe() for c in plan.candidates]
    assert plan.settings()["train.context_parallel"] == chosen.cp
    assert plan.settings()["train.context_parallel_ulysses"] == chosen.ulysses
    # No candidate without CP fits: the least needy one was traced (slower or not).
    without = [c for c in plan.candidates if c.cp == 1]
    assert without and all(c.status == "too big" for c in without)
    least = min((c for c in without if c.peak), key=lambda c: c.peak[0] or 0)
    assert least.activation_checkpointing == "full" and least.shard == 4
    activations = size_text(least.parts[0]["activations"])
    note = fits_note(plan)
    assert f"; needs CP on 82 MiB: activations {activations} at CP 1" in note, note
    assert note.endswith(f"(CP {chosen.cp} chosen)"), note
    # Every candidate says why it was or was not chosen.
    assert all(c.reason for c in plan.candidates)
    # One CP rank's share of the tokens: the chosen one's activations are below CP 1's.
    assert chosen.parts[0]["activations"] < least.parts[0]["activations"]


def _facts(heads: int, tokens: tuple[int, ...], causal: bool) -> ModelFacts:
    attention = AttentionFacts(tokens, heads, causal, 10**6)
    return ModelFacts(10**8, 4, (1e12,), "test", (attention,))


def test_cp_candidates_are_those_the_runtime_takes() -> None:
    one_node = Target(1, 8, None, GIB, "test")
    # 12 heads: Ulysses 2 and 4, not 8; a 96-token sequence splits over 2, 4 and 8.
    options = cp_options(one_node, _facts(12, (96,), causal=False))
    assert options == [(1, 1), (2, 2), (4, 4), (2, 1), (4, 1), (8, 1)]
    # A causal model: Ulysses only; a sequence of 36 tokens does not split over 8.
    assert cp_options(one_node, _facts(8, (36,), causal=True)) == [(1, 1), (2, 2), (4, 4)]
    # Two nodes of 8: Ulysses over a node and a ring across them (CP 16), as Wan trains.
    two_nodes = Target(2, 8, None, GIB, "test")
    assert (16, 8) in cp_options(two_nodes, _facts(40, (75_600,), causal=False))
    # A model that calls no stoker.model.attention cannot take CP.
    no_attention = ModelFacts(10**8, 4, (1e12,), "test", (AttentionFacts((), None, False, 0),))
    assert cp_options(one_node, no_attention) == [(1, 1)]


@pytest.mark.parametrize("mode", ["none", "full"])
def test_cp_adds_its_traffic_and_a_ring_across_nodes_costs_more_than_over_nvlink(
    mode: str,
) -> None:
    h100 = gpu_spec("H100")
    assert h100 is not None

    def seconds(cp: int, ulysses: int, ranks_per_node: int = 8) -> float:
        work = StepWork(1e15, 10**9, 8, 1, 1, mode, "bf16", cp, ulysses, 5e8)  # type: ignore[arg-type]
        return step_time(work, h100, ranks_per_node, 50e9).seconds

    plain = step_time(StepWork(1e15, 10**9, 8, 1, 1, mode, "bf16"), h100, 8, 50e9).seconds  # type: ignore[arg-type]
    assert plain < seconds(2, 2) < seconds(8, 8)
    assert seconds(8, 1, ranks_per_node=8) < seconds(8, 1, ranks_per_node=4)  # NVLink vs fabric


def test_a_ring_pass_is_hidden_by_the_attention_block_computed_meanwhile() -> None:
    """ring_attention.py sends the next K/V block while it computes the current one: a
    pass costs only what that block's attention does not cover. Ulysses' all-to-alls
    are waited for, whatever the attention's size."""
    h100 = gpu_spec("H100")
    assert h100 is not None

    def seconds(cp: int, ulysses: int, score_flops: float, ranks_per_node: int = 4) -> float:
        work = StepWork(1e15, 10**9, 8, 1, 1, "none", "bf16", cp, ulysses, 5e8, score_flops)
        return step_time(work, h100, ranks_per_node, 50e9).seconds

    plain = step_time(StepWork(1e15, 10**9, 8, 1, 1, "none", "bf16"), h100, 4, 50e9).seconds
    # A ring of 8 over two nodes of 4: passes on the fabric.
    exposed, hidden = seconds(8, 1, 0.0), seconds(8, 1, 1e15)
    assert exposed > hidden == pytest.approx(plain)
    # Half hidden: in between.
    assert hidden < seconds(8, 1, 2e12) < exposed
    # Ulysses over 4 in a node costs the same with any attention behind it.
    assert seconds(4, 4, 0.0) == seconds(4, 4, 1e15) > plain


def test_the_long_clip_example_on_eight_h100s_takes_cp_and_says_why_not_the_others(
    tmp_path: Path,
) -> None:
    """benchmarks/plan_long_clip.py on examples/long_clip.yaml: 5 s of 720p latents on one
    node of 8 x H100 80GB. Without recompute one rank would need 174 GiB of activations;
    the plan takes a CP layout and gives every candidate it did not take its reason (the
    Wan-sized case of the benchmark, 15 CPU-minutes, is run outside the suite)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "plan_long_clip.py"), "--only", "long-clip",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [path] = tmp_path.glob("plan_long_clip-long-clip-*.json")
    case = json.loads(path.read_text())["cases"]["long-clip"]
    assert case["target_met"] and case["target"]["world"] == 8
    chosen = case["chosen"]
    assert chosen["context_parallel"] > 1, case["every_candidate"]
    assert case["settings"]["train.context_parallel"] == chosen["context_parallel"]
    others = [c for c in case["every_candidate"] if c["status"] != "chosen"]
    assert len(others) == case["candidates"] - 1 and all(c["reason"] for c in others)
    # It fits where one rank holding every token without recompute does not (in bf16, the
    # GPU's precision; fp32 ones are slower, not traced).
    whole = [c for c in others if "no CP, AC none, bf16" in c["what"]]
    assert whole and all(c["status"] == "too big" for c in whole), whole
    assert "target met" in result.stdout and "without CP (baseline)" in result.stdout
