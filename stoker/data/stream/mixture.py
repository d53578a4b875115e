"""Which source each slot of the merged sample stream comes from (data.sources).

The merged stream is a sequence of slots k = 0, 1, 2, ...; each slot takes the next
sample of one source, which has its own order and its own epochs. Which source, is a
function of (seed, k, weights) for `random` and of (k, weights, the samples taken so
far) for `exact`; never of ranks, workers or time. So the stream resumes exactly from
(k, each source's position), on any number of ranks.

- random: slot k draws source i with probability w_i / sum(w), from a generator seeded
  by (seed, k // CHUNK): 4096 draws at once, the same wherever they are drawn.
- exact: slot k goes to the source furthest behind its share, (k + 1) w_i / sum(w) minus
  the samples it gave so far (ties: the one listed first). Every run of consecutive
  slots then holds each source's share to within one sample.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stoker.modes import Mixing

CHUNK = 4096
_MIX = 0x6D6978  # "mix": keeps these draws apart from the other uses of the seed


def choose_sources(
    mixing: Mixing, weights: Sequence[float], seed: int, slot: int, count: int, taken: Sequence[int]
) -> np.ndarray:
    """The source of each of slots [slot, slot + count); `taken` is how many samples each
    source gave before `slot` (its position)."""
    if len(weights) == 1:
        return np.zeros(count, dtype=np.int64)
    share = np.asarray(weights, dtype=np.float64) / float(sum(weights))
    if mixing == "random":
        return _random(share, seed, slot, count)
    if mixing == "exact":
        return _exact(share, slot, count, taken)
    raise ValueError(f"mixing {mixing!r} is not one of random, exact")


def _random(share: np.ndarray, seed: int, slot: int, count: int) -> np.ndarray:
    out = np.empty(count, dtype=np.int64)
    done = 0
    cumulative = np.cumsum(share)
    cumulative[-1] = 1.0
    while done < count:
        chunk, offset = divmod(slot + done, CHUNK)
        draws = np.random.default_rng([seed % 2**64, _MIX, chunk]).random(CHUNK)
        picks = np.searchsorted(cumulative, draws, side="right")
        take = min(CHUNK - offset, count - done)
        out[done : done + take] = picks[offset : offset + take]
        done += take
    return np.minimum(out, len(share) - 1)


def _exact(share: np.ndarray, slot: int, count: int, taken: Sequence[int]) -> np.ndarray:
    counts = np.asarray(taken, dtype=np.int64).copy()
    out = np.empty(count, dtype=np.int64)
    for j in range(count):
        deficit = (slot + j + 1) * share - counts
        pick = int(np.argmax(deficit))  # the first of equal maxima
        out[j] = pick
        counts[pick] += 1
    return out
