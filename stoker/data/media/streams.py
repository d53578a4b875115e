"""Which streams of a media container a sample takes, the one time origin its video and
audio share, and the turn that shows its frames upright.

One origin for both streams: a container's times count from its video stream's first
frame (its `start_time`, in presentation order). Streams may start at other
timestamps (MPEG-TS starts anywhere, an mp4 may hold audio that begins 0.3 s after
the picture), so audio time t is `audio pts - video start`: a click and a flash made
at the same instant come out at the same t. A container without video counts from
its audio's own start. AAC's encoder priming (1024 samples) is removed by FFmpeg
where the container records it (mp4's edit list, Matroska's codec delay); raw ADTS
`.aac` cannot record it and plays about 21 ms late at 48 kHz.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stoker.data.media.errors import NO_SUCH_AUDIO_STREAM, MediaError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


def video_stream(container: Any) -> Any | None:
    """The container's video: its first video stream that is not cover art (mp3, m4a
    and flac files carry their album picture as an 'attached picture' video stream)."""
    from av.stream import Disposition

    for stream in container.streams.video:
        if not stream.disposition & Disposition.attached_pic:
            return stream
    return None


def audio_stream(container: Any, index: int) -> Any:
    """Audio stream `index` (counted among the container's audio streams only), or a
    MediaError saying how many there are."""
    streams = container.streams.audio
    if not streams:
        raise MediaError("no audio stream")
    if index >= len(streams):
        raise MediaError(
            f"holds {len(streams)} audio stream{'s' if len(streams) > 1 else ''}; "
            f"audio stream {index} (counted from 0) was asked for",
            kind=NO_SUCH_AUDIO_STREAM,
        )
    return streams[index]


def time_origin_s(container: Any) -> float | None:
    """Seconds, in container time, at which the first video frame shows: where both of
    the container's streams count their time from. None without a video stream (or
    one without a start time): each stream then counts from its own start."""
    video = video_stream(container)
    if video is None or video.start_time is None:
        return None
    return float(video.start_time * video.time_base)


def clockwise_rotation(frame: Any) -> int:
    """Clockwise degrees (0, 90, 180 or 270) that turn a decoded frame upright, from
    the display matrix the container stores (a phone filming upright stores its
    landscape sensor's frames and 90). Rounded to a quarter turn; flips are ignored."""
    return round(-float(frame.rotation or 0) / 90) % 4 * 90


def turned_upright(
    image: npt.NDArray[np.uint8], rotation: int, axes: tuple[int, int]
) -> npt.NDArray[np.uint8]:
    """`image` turned `rotation` degrees clockwise in the plane of `axes` (rows,
    columns): a view, no copy."""
    import numpy as np

    turns = rotation // 90 % 4
    return np.rot90(image, k=-turns, axes=axes) if turns else image
