"""`decode_video`'s output geometry: `resize` "stretch" (the default) against "crop",
and frames turned upright by the container's rotation, on H.264 made here.

The source is 64x48 (4:3): a white 24x24 square in the middle, a red band on the
left edge and a blue band on the right edge of the stored frame.
"""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from stoker.data.media.decode import decode_video
from stoker.data.media.probe import probe_video

WIDTH, HEIGHT = 64, 48


def _source(rotation: int = 0) -> bytes:
    image = np.full((HEIGHT, WIDTH, 3), 60, dtype=np.uint8)
    image[12:36, 20:44] = 255
    image[:, :6] = (255, 0, 0)
    image[:, -6:] = (0, 0, 255)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv444p"
        if rotation:
            stream.set_display_rotation(-rotation)  # PyAV counts counter-clockwise
        for _ in range(8):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


def _decode(data: bytes, size: tuple[int, int] | None, **kw: str) -> np.ndarray:
    out = decode_video(data, fps=8, size=size, start_s=0.0, clip_seconds=0.25, **kw)  # type: ignore[arg-type]
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    return out


def _square(frame: np.ndarray) -> tuple[int, int]:
    """(height, width) of the white square in a (3, H, W) frame."""
    white = frame.min(axis=0) > 160
    return int(white.any(axis=1).sum()), int(white.any(axis=0).sum())


def _edges(frame: np.ndarray) -> tuple[bool, bool]:
    """Whether red shows on the left edge and blue on the right edge of a frame."""
    r, _, b = frame.astype(int)
    return bool((r[:, 0] - b[:, 0] > 100).all()), bool((b[:, -1] - r[:, -1] > 100).all())


@pytest.fixture(scope="module")
def mp4() -> bytes:
    return _source()


def test_stretch_is_the_default_and_fills_the_shape(mp4: bytes) -> None:
    stretched = _decode(mp4, (32, 32), resize="stretch")
    assert np.array_equal(_decode(mp4, (32, 32)), stretched)
    assert stretched.shape == (2, 3, 32, 32)
    # 24x24 scaled by 32/48 high and 32/64 wide: taller than wide.
    height, width = _square(stretched[0])
    assert abs(height - 16) <= 1 and abs(width - 12) <= 1
    assert _edges(stretched[0]) == (True, True)


@pytest.mark.parametrize(
    ("size", "scale"), [((32, 32), 32 / 48), ((96, 96), 2.0), ((24, 48), 0.75)]
)
def test_crop_keeps_the_aspect_ratio_and_the_centre(
    mp4: bytes, size: tuple[int, int], scale: float
) -> None:
    cropped = _decode(mp4, size, resize="crop")
    assert cropped.shape == (2, 3, *size)
    height, width = _square(cropped[0])
    side = 24 * scale  # a square stays square
    assert abs(height - min(side, size[0])) <= 1.5 and abs(width - min(side, size[1])) <= 1.5
    # The covering scale overflows the width: the edge bands are cut off...
    covered_width = WIDTH * scale
    if covered_width - size[1] >= 2 * 6 * scale + 2:
        assert _edges(cropped[0]) == (False, False)
    # ... and the crop is centred: as much left of the square as right of it.
    white = cropped[0].min(axis=0) > 160
    cols = np.nonzero(white.any(axis=0))[0]
    if len(cols) < size[1]:
        assert abs(cols[0] - (size[1] - 1 - cols[-1])) <= 1


def test_a_rotated_video_comes_out_upright() -> None:
    portrait = _source(rotation=90)  # a phone held upright: turned 90 degrees clockwise
    info = probe_video(portrait, "mp4")
    assert (info.width, info.height, info.rotation) == (HEIGHT, WIDTH, 90)
    native = _decode(portrait, None)
    assert native.shape == (2, 3, WIDTH, HEIGHT)  # taller than wide
    # The stored left edge (red) is now the top, the right edge (blue) the bottom.
    r, _, b = native[0].astype(int)
    assert (r[0] - b[0] > 100).all() and (b[-1] - r[-1] > 100).all()
    # `size` is the upright shape: crop to a tall 40x24 keeps the square square.
    cropped = _decode(portrait, (40, 24), resize="crop")
    assert cropped.shape == (2, 3, 40, 24)
    height, width = _square(cropped[0])
    assert abs(height - width) <= 1
    upside_down = _decode(_source(rotation=180), None)
    r, _, b = upside_down[0].astype(int)
    assert (b[:, 0] - r[:, 0] > 100).all() and (r[:, -1] - b[:, -1] > 100).all()


def test_resize_is_checked(mp4: bytes) -> None:
    with pytest.raises(ValueError, match="resize is 'crop' or 'stretch'"):
        _decode(mp4, (32, 32), resize="fit")
