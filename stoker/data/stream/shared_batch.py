"""A worker's batch with all its tensors in one shared-memory buffer, and buffers that
go round between a worker and the main process instead of being made for every batch.

A tensor a DataLoader worker sends crosses to the main process through a shared-memory
file of its own: the worker creates the file and copies the tensor in, and the main
process fetches its descriptor over a socket handshake with the worker. Views of one
storage pickle as that one storage, so a batch stacked straight into one buffer is one
file and one handshake (a latent batch was four: video and audio latents, `position`,
`valid`).

A fresh file still costs every batch: its pages are allocated and zeroed, then faulted
in one by one as the batch is written (a latent batch of 16 is 4.3 MB, 1,050 pages:
175 us of the worker's CPU a sample, against 25 us to stack into pages already mapped),
unmapped by the worker once sent, and fetched, mapped and unmapped by the main process.
So each worker keeps a few buffers (`BufferPool`), and the main process keeps its
mapping of each (`LentBuffers`): a buffer crosses once, with its first batch; later
batches in it cross as their place in it (`BufferView`), with no file, handshake or
fault. The main process hands a buffer back (a byte in `leases`, shared memory it made
and every worker maps) once nothing outside it refers to the buffer any more: the loop
has let go of every tensor of the batch, views included. A worker writes only into
buffers handed back, so a batch the loop keeps is never overwritten; with none free and
its pool full, it sends a batch in a buffer of its own, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 64  # bytes: every tensor starts on a cache line (and on its dtype's size)
# Buffers per worker: the DataLoader keeps 2 batches a worker in flight, the loop holds
# one and the main process hands one back a batch late; past that, a one-off buffer.
POOL_SLOTS = 4
BUFFER_KEY = "_loader_buffer"
FREE, LENT = 0, 1


class _Slot:
    """Where a tensor of the batch goes, until the buffer exists."""

    def __init__(self, parts: list[torch.Tensor] | torch.Tensor) -> None:
        self.parts = parts
        if isinstance(parts, torch.Tensor):
            self.shape, self.dtype = tuple(parts.shape), parts.dtype
        else:
            self.shape, self.dtype = (len(parts), *parts[0].shape), parts[0].dtype
        self.nbytes = self.dtype.itemsize * int(torch.Size(self.shape).numel())


@dataclass(frozen=True)
class BufferView:
    """A tensor of a batch sent in a pooled buffer: where in the buffer it lies. (Not a
    tuple: the DataLoader's default_convert would take a tuple apart.)"""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def leases(workers: int) -> torch.Tensor:
    """The main process's hand-back bytes, one per buffer of every worker, in shared
    memory (made before the workers start, which map it with the data set)."""
    out = torch.zeros(max(1, workers) * POOL_SLOTS, dtype=torch.uint8)
    out.share_memory_()  # type: ignore[no-untyped-call]
    return out


class BufferPool:
    """A worker's buffers, and which of them the main process has handed back."""

    def __init__(self, worker: int, leases: torch.Tensor) -> None:
        self.worker = worker
        self._leases = leases.numpy()[worker * POOL_SLOTS : (worker + 1) * POOL_SLOTS]
        self._buffers: list[torch.UntypedStorage | None] = [None] * POOL_SLOTS

    def take(self, nbytes: int) -> tuple[torch.UntypedStorage, int | None, bool]:
        """A buffer of at least `nbytes`: (storage, its slot or None for a one-off
        buffer, whether the main process has yet to map it)."""
        replace = None
        for slot, buffer in enumerate(self._buffers):
            if self._leases[slot] != FREE:
                continue
            if buffer is not None and nbytes <= buffer.nbytes() <= 2 * nbytes:
                self._leases[slot] = LENT
                return buffer, slot, False
            if replace is None or buffer is None:
                replace = slot  # an empty slot first, else a free buffer of another size
        storage = torch.UntypedStorage._new_shared(max(1, nbytes))  # type: ignore[no-untyped-call]
        if replace is None:
            return storage, None, True
        self._buffers[replace] = storage
        self._leases[replace] = LENT
        return storage, replace, True


class SharedBatch:
    """Collects a batch's tensors (stacks of rows, or whole tensors), then lays them out
    in one shared-memory buffer (`fill`). `stack` and `add` return placeholders that
    `fill` replaces in the batch dict (top level and one level of dicts)."""

    def __init__(self) -> None:
        self._slots: list[_Slot] = []

    def stack(self, rows: list[torch.Tensor]) -> Any:
        """The rows stacked ([B, ...]), once `fill` runs."""
        slot = _Slot(rows)
        self._slots.append(slot)
        return slot

    def add(self, tensor: torch.Tensor) -> Any:
        """`tensor` copied into the buffer, once `fill` runs."""
        slot = _Slot(tensor)
        self._slots.append(slot)
        return slot

    def fill(self, batch: dict[str, Any], pool: BufferPool | None = None) -> None:
        """Take a buffer (from `pool`, or a new one), write every tensor into its place,
        and put into `batch` where the placeholders were: views of the buffer, or with a
        pooled buffer `BufferView`s and, under BUFFER_KEY, (worker, slot, the storage
        when the main process has yet to map it)."""
        offsets, total = [], 0
        for slot in self._slots:
            offsets.append(total)
            total += -(-slot.nbytes // ALIGN) * ALIGN
        if pool is not None:
            storage, leased, new = pool.take(total)
        else:
            storage = torch.UntypedStorage._new_shared(max(1, total))  # type: ignore[no-untyped-call]
            leased, new = None, True
        views: dict[int, Any] = {}
        for slot, offset in zip(self._slots, offsets, strict=True):
            view = _view(storage, offset, slot.dtype, slot.shape)
            if isinstance(slot.parts, torch.Tensor):
                view.copy_(slot.parts)
            else:
                torch.stack(slot.parts, out=view)
            views[id(slot)] = view if leased is None else BufferView(offset, slot.dtype, slot.shape)
        for name, value in batch.items():
            if isinstance(value, _Slot):
                batch[name] = views[id(value)]
            elif isinstance(value, dict):
                for key, inner in value.items():
                    if isinstance(inner, _Slot):
                        value[key] = views[id(inner)]
        if leased is not None:
            assert pool is not None
            batch[BUFFER_KEY] = (pool.worker, leased, storage if new else None)


class LentBuffers:
    """The main process's side: its mapping of every pooled buffer, the batches' views
    made from them, and each buffer handed back once the loop has let go of it."""

    def __init__(self, leases: torch.Tensor) -> None:
        self._leases = leases.numpy()
        self._mapped: dict[int, torch.UntypedStorage] = {}  # lease index -> buffer
        self._lent: set[int] = set()

    def resolve(self, batch: dict[str, Any]) -> None:
        """Replace the batch's `BufferView`s by tensors viewing its buffer (in place)."""
        lease = batch.pop(BUFFER_KEY, None)
        if lease is None:
            return  # a one-off buffer: its tensors came whole
        worker, slot, storage = lease
        index = worker * POOL_SLOTS + slot
        if storage is not None:  # the buffer's first batch (or a new buffer in its slot)
            self._mapped[index] = storage
        buffer = self._mapped[index]
        for name, value in batch.items():
            if isinstance(value, BufferView):
                batch[name] = _view(buffer, value.offset, value.dtype, value.shape)
            elif isinstance(value, dict):
                for key, inner in value.items():
                    if isinstance(inner, BufferView):
                        value[key] = _view(buffer, inner.offset, inner.dtype, inner.shape)
        self._lent.add(index)

    def hand_back(self) -> None:
        """Hand back the buffers nothing refers to but this (the loop has dropped every
        tensor of their batch), for their workers to fill again."""
        for index in list(self._lent):
            if torch._C._storage_Use_Count(self._mapped[index]._cdata) == 1:
                self._lent.discard(index)
                self._leases[index] = FREE


def _view(
    buffer: torch.UntypedStorage, offset: int, dtype: torch.dtype, shape: tuple[int, ...]
) -> torch.Tensor:
    """The contiguous tensor at byte `offset` of `buffer` (a multiple of ALIGN): one op,
    where slicing a byte view and viewing it twice took 19 us against 4."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return torch.empty(0, dtype=dtype).set_(buffer, offset // dtype.itemsize, shape, strides[::-1])
