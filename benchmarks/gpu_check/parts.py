"""The parts of the GPU check, in priority order, with their deadlines.

Deadlines are seconds on one H100 (docs/kernels.md, "The GPU check", has the
arithmetic behind each): they add up, with the start-up, to at most 8 minutes, so
that the device call's `timeout_s=540` leaves room. A dry run (`--dry-run`, on the
CPU at tiny shapes) has its own deadlines, for the suite's loaded 2-core VM: about three
times what a part took there beside the rest of the suite (CI saw 64 s for part f and
43 s for g at load ~4), since the dry run shows that each part works, not how fast; a
part that hangs is still stopped (and `test_a_part_past_its_deadline_is_stopped...`
checks the stopping).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    name: str
    letter: str
    module: str
    """Module path; it has `main(out_dir, *, dry_run)`."""
    deadline_s: int
    """On one H100."""
    dry_run_deadline_s: int
    what: str


_HERE = "benchmarks.gpu_check."
START_UP_S = 15
"""Reading the environment and installing the carried wheels, before the first part."""

PARTS: tuple[Part, ...] = (
    Part(
        "kernels", "a", _HERE + "kernels_part", 75, 120, "Triton kernels vs eager and torch.compile"
    ),
    Part("plan", "b", _HERE + "plan_part", 50, 60, "the planner's peak and step time vs measured"),
    Part(
        "step", "c", _HERE + "step_part", 70, 60, "the 1b av_dit step: MFU, tokens/s, peak memory"
    ),
    Part(
        "tests",
        "d",
        _HERE + "tests_part",
        125,
        60,
        "the suite's GPU-only tests and the kernel tests",
    ),
    Part("sample", "e", _HERE + "sample_part", 30, 45, "sampling steps of the 1b; data encode"),
    Part(
        "run", "f", _HERE + "run_part", 55, 150, "the tiny experiment through the runtime on cuda"
    ),
    Part(
        "more_steps", "g", _HERE + "more_steps_part", 50, 100, "the 1b audio_ar step; latent batch"
    ),
)

TOTAL_DEADLINE_S = START_UP_S + sum(p.deadline_s for p in PARTS)
BUDGET_S = 480
"""8 minutes: the device call runs with timeout_s=540."""

assert TOTAL_DEADLINE_S <= BUDGET_S, TOTAL_DEADLINE_S


def part_named(name: str) -> Part:
    for part in PARTS:
        if name in (part.name, part.letter):
            return part
    known = ", ".join(f"{p.letter} ({p.name})" for p in PARTS)
    raise ValueError(f"no part {name!r} in the GPU check; parts: {known}")
