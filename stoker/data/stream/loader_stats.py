"""Counters a loader exposes for the runtime's metrics: what was read, retried,
skipped, and how long decoding took."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class LoaderStats:
    """Cumulative counts of one worker (or, summed, of one rank's loader)."""

    samples: int = 0
    """Samples delivered in batches (fills for skipped samples not included)."""
    skipped_samples: int = 0
    """Samples that failed to fetch or decode; each is replaced in its batch."""
    short_samples: int = 0
    """Samples shorter than the clip length, padded (last frame, silence)."""
    fetch_retries: int = 0
    failed_shards: int = 0
    """Shards given up on after all retries; their samples count as skipped."""
    bytes_read: int = 0
    """Bytes of the samples taken into batches (fetched ahead or not)."""
    fetch_s: float = 0.0
    """Time spent waiting for bytes the decoder needed (not hidden by prefetch)."""
    decode_s: float = 0.0
    """Seconds spent decoding, summed over a worker's decode threads (so it may exceed
    the wall time when they decode side by side)."""
    video_frames: int = 0
    """Frames delivered (after resampling to the target fps)."""

    def add(self, other: LoaderStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> LoaderStats:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})  # type: ignore[arg-type]
