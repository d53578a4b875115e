"""Which rank a local job (stoker/launcher/local/supervisor.py) reports first, and whose
exit code is the job's, when several ranks are found failed in one poll: on a loaded
machine the rank that lost its peer may end before the supervisor looks again, and the
job must still say why it failed (seen in tests/runtime/own_loop/test_own_loop.py: exit 76 and
rank 0 named for rank 1's ValueError)."""

from __future__ import annotations

from stoker.launcher.local.supervisor import first_failures
from stoker.protocol import EXIT_PEER_LOST


def test_the_cause_comes_before_a_peer_lost_in_the_same_poll() -> None:
    assert first_failures({0: EXIT_PEER_LOST, 1: 1}) == [1, 0]
    assert first_failures({0: 1, 1: EXIT_PEER_LOST}) == [0, 1]
    assert first_failures({0: EXIT_PEER_LOST, 2: -9, 3: 1}) == [2, 3, 0]  # causes by rank
    assert first_failures({1: EXIT_PEER_LOST, 0: EXIT_PEER_LOST}) == [0, 1]
    assert first_failures({}) == []
