"""Any override a user can type is a valid config or one clear error, never a traceback."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.config import ExperimentConfig, resolve_config
from stoker.config.keys import dotted, leaf_paths
from stoker.errors import StokerError

# Plus entries of the free mappings, where a scalar and a mapping can collide.
KEYS = [dotted(p) for p in leaf_paths(ExperimentConfig)] + ["job.env.A", "tracking.tags.t"]
VALUES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "$(reboot)",
            "`id`",
            "a;b",
            "../../etc/passwd",
            "null",
            "[1, 2",
            "{a: 1}",
            "-1",
            "1e400",
            "nan",
            "true",
            "\n",
            "x\ny",
            "é",
            "0x10",
            "4:00:00",
        ]
    ),
    st.integers().map(str),
    st.floats(allow_nan=True).map(str),
)
KEYS_OR_JUNK = st.one_of(st.sampled_from(KEYS), st.text(min_size=1, max_size=30))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(KEYS_OR_JUNK, VALUES), max_size=4))
def test_overrides_give_a_config_or_a_clear_error(pairs: list[tuple[str, str]]) -> None:
    overrides = [f"{key}={value}" for key, value in pairs]
    try:
        config = resolve_config(overrides=overrides, use_profile=False).config
    except StokerError as exc:
        assert str(exc).strip()
        return
    assert isinstance(config, ExperimentConfig)
    # Whatever was accepted is a valid job name: no shell or path tricks get through.
    assert "/" not in config.job.name and "$" not in config.job.name
