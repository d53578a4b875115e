"""Media that cannot be read (`MediaError`) and the kinds a skip report counts it by;
below the probe, the decoders and the stream picking that raise it."""

from __future__ import annotations

# Why a file is left out, as a short phrase a report counts by (MediaError.kind).
EMPTY_FILE = "empty file"
NOT_MEDIA = "not media"
STILL_IMAGE = "still image"
TRUNCATED = "truncated"
UNREADABLE = "unreadable"
NO_SUCH_AUDIO_STREAM = "no such audio stream"


class MediaError(Exception):
    """Media that cannot be read: the reason, for a skip report, and its `kind`, the
    phrase a report counts by: "empty file", "not media", "still image", "truncated",
    "unreadable" or "no such audio stream"."""

    def __init__(self, reason: str, kind: str = UNREADABLE) -> None:
        super().__init__(reason)
        self.kind = kind
