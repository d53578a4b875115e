"""Context parallelism (CP): one sample's tokens split over the N ranks of a CP group,
attention across them by Ulysses (all-to-all over heads), a ring (K/V passed around,
ring_attention.py) or both, with the rest of the model computing on its own tokens.

Layout: the group's ranks are (ring index, Ulysses index), Ulysses innermost, so a
Ulysses group is N/R consecutive ranks (within a node when the job places ranks node by
node) and a ring links those of the same Ulysses index across the Ulysses groups. CP
rank c holds tokens [c * S/N, (c + 1) * S/N) of each sequence it is given, so after the
Ulysses all-to-all a Ulysses group holds one contiguous block of S/R tokens, the block
its ring index names, in order: causal attention is exact with Ulysses alone.

Attention (q, k, v [B, H, S/N, Dh]):
  1. Ulysses (U > 1): all-to-all from [B, H, S/N] to [B, H/U, S/R]: each rank gives
     every peer that peer's heads of its tokens (H must divide by U).
  2. The attention of those heads over S/R tokens, or with a ring (R > 1) over all S.
  3. The inverse all-to-all, back to [B, H, S/N].
Each step's backward is its transpose (the all-to-all's is the same all-to-all).

The loss: a model sums its per-token losses over its own tokens, `sum()`s the sums over
the group and divides by the whole sequence's count, so every CP rank has CP 1's loss.
`sum()`'s backward sums the ranks' gradients too, so each rank's parameter gradients
add up to N times its share; FSDP's mean over the shard x CP ranks then divides that N
out again (torchtitan's dp_shard_cp mesh), giving CP 1's gradient.

stoker.model holds the active CP (`set_context_parallel`): the built-in models and
users' models find it there, through `stoker.model.attention`, `token_slice`, `cp_sum`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from stoker.runtime.models.ring_attention import ring_backward, ring_forward


class DoesNotSplit(ValueError):
    """A sequence or the heads do not split over the CP ranks as set: `key` names the
    setting, `fix` the values that would."""

    def __init__(self, message: str, key: str, fix: str) -> None:
        super().__init__(message)
        self.key, self.fix = key, fix


def check_split(tokens: int | None, heads: int | None, causal: bool, cp: int, ulysses: int) -> None:
    """DoesNotSplit unless `tokens` divide over `cp` ranks, `heads` over `ulysses`, and
    causal attention has no ring."""
    if tokens is not None and tokens % cp:
        raise DoesNotSplit(
            f"{tokens} tokens do not split over context parallelism of {cp} ranks",
            "train.context_parallel",
            f"a train.context_parallel that divides {tokens}, or clips whose tokens divide "
            f"by {cp} (data.buckets, data.clip_seconds, data.resolution)",
        )
    if heads is not None and heads % ulysses:
        raise DoesNotSplit(
            f"{heads} attention heads do not split over Ulysses of {ulysses} ranks",
            "train.context_parallel_ulysses",
            f"a train.context_parallel_ulysses that divides {heads} (the rest of "
            "train.context_parallel then forms a ring)",
        )
    if causal and ulysses < cp:
        raise DoesNotSplit(
            f"causal attention takes Ulysses only, not a ring of {cp // ulysses}",
            "train.context_parallel_ulysses",
            f"train.context_parallel_ulysses={cp} (or null), as train.context_parallel",
        )


def _all_to_all(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """All-to-all of x [P, ...] over a group of P ranks: chunk j goes to rank j, and chunk
    j of the result came from rank j. Its own transpose: backward is the same exchange."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    return out


def _heads_for_tokens(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[B, H, S/N, D] -> [B, H/U, S/R, D]: give each Ulysses peer its heads of these
    tokens, take this rank's heads of theirs (in the peers' order: their tokens')."""
    batch, heads, tokens, dim = x.shape
    u = dist.get_world_size(group)
    chunks = x.reshape(batch, u, heads // u, tokens, dim).transpose(0, 1)
    mine = _all_to_all(chunks, group)  # [U, B, H/U, S/N, D]
    return mine.permute(1, 2, 0, 3, 4).reshape(batch, heads // u, u * tokens, dim)


def _tokens_for_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The inverse of _heads_for_tokens: [B, H/U, S/R, D] -> [B, H, S/N, D]."""
    batch, heads_u, tokens_r, dim = x.shape
    u = dist.get_world_size(group)
    chunks = x.reshape(batch, heads_u, u, tokens_r // u, dim).permute(2, 0, 1, 3, 4)
    mine = _all_to_all(chunks, group)  # [U, B, H/U, S/N, D]
    return mine.transpose(0, 1).reshape(batch, heads_u * u, tokens_r // u, dim)


def _group(name: str) -> dist.ProcessGroup | None:
    """A process group by its name ('' for none): what a custom op can take."""
    if not name:
        return None
    from torch.distributed import distributed_c10d

    group: dist.ProcessGroup = distributed_c10d._resolve_process_group(name)  # type: ignore[attr-defined,arg-type]
    return group


# The attention as two custom ops (forward, backward) with an autograd formula:
# torch.compile sees one opaque call per block, not process-group calls to trace, so a
# block with it compiles whole (fullgraph), and activation checkpointing recomputes it
# as any op. Outputs may not alias inputs or each other, so what backward needs is
# returned by forward: in the Ulysses layout when there is a Ulysses group (else empty,
# and backward takes the inputs and the output themselves).
@torch.library.custom_op("stoker::cp_attention", mutates_args=())
def _cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ulysses: str,
    ring: str,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out [B, H, S/N, D], lse, then q, k, v, out in the Ulysses layout or empty)."""
    heads_group, ring_group = _group(ulysses), _group(ring)
    if heads_group is not None:
        q, k, v = (_heads_for_tokens(t, heads_group) for t in (q, k, v))
    out, lse = ring_forward(q, k, v, ring_group, scale, causal)
    # Contiguous, as the fake says: the kernels' own layouts vary (the CPU kernel's
    # log-sum-exp is [B, S, H] in memory).
    out, lse = out.contiguous(), lse.contiguous()
    if heads_group is None:
        empty = q.new_empty(0)
        return out, lse, empty, empty.clone(), empty.clone(), empty.clone()
    return _tokens_for_heads(out, heads_group).contiguous(), lse, q, k, v, out


@_cp_attention.register_fake
def _cp_attention_fake(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ulysses: str,
    ring: str,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, ...]:
    heads_group = _group(ulysses)
    batch, heads, tokens, dim = q.shape
    u = dist.get_world_size(heads_group) if heads_group is not None else 1
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = q.new_empty((batch, heads // u, tokens * u), dtype=lse_dtype)
    if heads_group is None:
        return (q.new_empty(q.shape), lse, *(q.new_empty(0) for _ in range(4)))
    laid = (batch, heads // u, tokens * u, dim)
    return (q.new_empty(q.shape), lse, *(q.new_empty(laid) for _ in range(4)))


@torch.library.custom_op("stoker::cp_attention_backward", mutates_args=())
def _cp_attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    ulysses: str,
    ring: str,
    causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) [B, H, S/N, D]; q, k, v, out as saved (the Ulysses layout with one)."""
    heads_group, ring_group = _group(ulysses), _group(ring)
    if heads_group is not None:
        grad_out = _heads_for_tokens(grad_out, heads_group)
    dq, dk, dv = ring_backward(grad_out, q, k, v, out, lse, ring_group, scale, causal)
    if heads_group is not None:
        dq, dk, dv = (_tokens_for_heads(t, heads_group) for t in (dq, dk, dv))
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@_cp_attention_backward.register_fake
def _cp_attention_backward_fake(
    grad_out: torch.Tensor, *args: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # dq, dk, dv have the forward's inputs' shape, which grad_out (its output's) has too.
    shape = grad_out.shape
    return grad_out.new_empty(shape), grad_out.new_empty(shape), grad_out.new_empty(shape)


def _save_for_backward(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    q, k, v, ulysses, ring, causal, scale = inputs
    out, lse, q_laid, k_laid, v_laid, out_laid = output
    if ulysses:
        ctx.save_for_backward(q_laid, k_laid, v_laid, out_laid, lse)
    else:
        ctx.save_for_backward(q, k, v, out, lse)
    ctx.groups, ctx.causal, ctx.scale = (ulysses, ring), causal, scale


def _backward(ctx: Any, grad_out: torch.Tensor, *unused: Any) -> tuple[Any, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    ulysses, ring = ctx.groups
    dq, dk, dv = _cp_attention_backward(
        grad_out, q, k, v, out, lse, ulysses, ring, ctx.causal, ctx.scale
    )
    return dq, dk, dv, None, None, None, None


_cp_attention.register_autograd(_backward, setup_context=_save_for_backward)


class _SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) forward and backward (module doc: the loss)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        out = grad.clone()
        dist.all_reduce(out, group=ctx.group)
        return out, None


class GroupContextParallel:
    """The CP of one rank: its group of `size` ranks, `ulysses` x `ring` of them, its
    index `rank` there, and the Ulysses and ring sub-groups it is in (None when of
    size 1). Implements stoker.model.ContextParallel."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        ulysses_group: dist.ProcessGroup | None,
        ring_group: dist.ProcessGroup | None,
    ) -> None:
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.ulysses_group, self.ring_group = ulysses_group, ring_group
        self.ulysses = dist.get_world_size(ulysses_group) if ulysses_group is not None else 1
        self.ring = dist.get_world_size(ring_group) if ring_group is not None else 1
        # What the attention's custom op takes: the groups by name, '' for none.
        self._ulysses_name = ulysses_group.group_name if ulysses_group is not None else ""
        self._ring_name = ring_group.group_name if ring_group is not None else ""
        if self.ulysses * self.ring != self.size:
            raise ValueError(
                f"Ulysses {self.ulysses} x ring {self.ring} is not the CP group's {self.size} ranks"
            )

    def __repr__(self) -> str:
        return (
            f"ContextParallel(rank {self.rank} of {self.size}: Ulysses {self.ulysses} x "
            f"ring {self.ring})"
        )

    def token_slice(self, tokens: int) -> slice:
        """This rank's tokens of a sequence of `tokens`: DoesNotSplit unless they divide."""
        check_split(tokens, None, False, self.size, self.ulysses)
        share = tokens // self.size
        return slice(self.rank * share, (self.rank + 1) * share)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the CP group, on every rank (module doc: the loss)."""
        out: torch.Tensor = _SumOverGroup.apply(tensor, self.group)  # type: ignore[no-untyped-call]
        return out

    def gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """The whole sequence from each rank's slice along `dim` (no gradient): for
        what reads every token, such as a sample's output."""
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        scale: float | None = None,
    ) -> torch.Tensor:
        """softmax(q k^T * scale) v over the whole sequence for this rank's queries;
        q, k, v [B, H, S/N, Dh] (module doc)."""
        check_split(None, q.shape[1], causal, self.size, self.ulysses)
        scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        out: torch.Tensor = _cp_attention(
            q, k, v, self._ulysses_name, self._ring_name, causal, scale
        )[0]
        return out


def context_parallel_of_world(cp: int, ulysses: int | None = None) -> GroupContextParallel:
    """This rank's CP over the default process group: consecutive ranks in groups of
    `cp`, `ulysses` of each (default all of it) in Ulysses, the rest in a ring. Every
    rank calls it (it makes process groups)."""
    world, me = dist.get_world_size(), dist.get_rank()
    ulysses = cp if ulysses is None else ulysses
    if cp < 1 or world % cp or ulysses < 1 or cp % ulysses:
        raise ValueError(
            f"context parallelism {cp} (Ulysses {ulysses}) must divide the {world} ranks, "
            "and Ulysses the context parallelism"
        )
    ring = cp // ulysses
    mine: dict[str, dist.ProcessGroup | None] = {"cp": None, "ulysses": None, "ring": None}
    # Every rank creates every group, in the same order (torch.distributed's rule).
    for first in range(0, world, cp):
        members = list(range(first, first + cp))
        group = dist.new_group(members)
        if me in members:
            mine["cp"] = group
        for r in range(ring):
            block = members[r * ulysses : (r + 1) * ulysses]
            sub = dist.new_group(block) if ulysses > 1 else None
            if me in block:
                mine["ulysses"] = sub
        for u in range(ulysses):
            block = members[u::ulysses]
            sub = dist.new_group(block) if ring > 1 else None
            if me in block:
                mine["ring"] = sub
    assert mine["cp"] is not None
    return GroupContextParallel(mine["cp"], mine["ulysses"], mine["ring"])


@contextmanager
def context_parallel_as(cp: Any) -> Iterator[None]:
    """`cp` the active context parallelism inside (None: none), as before after."""
    from stoker.model import set_context_parallel

    before = set_context_parallel(cp)
    try:
        yield
    finally:
        set_context_parallel(before)


def without_context_parallel() -> AbstractContextManager[None]:
    """No context parallelism inside (a sample drawn whole on each rank)."""
    return context_parallel_as(None)


class SharesOnly:
    """A CP of `size` ranks for shape checks and traces (the model check on the meta
    device, the planner's memory trace): this is rank 0 of it, its tokens and heads are
    checked as GroupContextParallel checks them, and its attention runs over its own
    share only (the shapes of a real step's, not its values); nothing is communicated."""

    def __init__(self, size: int, ulysses: int) -> None:
        self.size, self.ulysses, self.ring, self.rank = size, ulysses, size // ulysses, 0

    def token_slice(self, tokens: int) -> slice:
        check_split(tokens, None, False, self.size, self.ulysses)
        return slice(0, tokens // self.size)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.cat([tensor] * self.size, dim=dim)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        scale: float | None = None,
    ) -> torch.Tensor:
        check_split(None, q.shape[1], causal, self.size, self.ulysses)
        out: torch.Tensor = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        return out
