"""A `.safetensors` member as tensors that view its bytes, without a copy.

`safetensors.torch.load` copies every tensor out of the bytes it is given (into a new
bytearray each), and a latent sample is little else: on the latent loader's path
that copy of ~270 KB a sample, and the fresh pages it touches, cost about as much
CPU as the rest of the sample's handling. Here the header is read and checked as
safetensors checks it, and each tensor views the member's bytes; the worker's batch
copies them once, when it stacks the rows.
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

import torch

from stoker.data.media.errors import MediaError

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "C64": torch.complex64,
}
for _name in ("U64", "U32", "U16"):  # torch 2.3+
    if hasattr(torch, _name.replace("U", "uint")):
        DTYPES[_name] = getattr(torch, _name.replace("U", "uint"))
for _name, _attr in (
    ("F8_E4M3", "float8_e4m3fn"),
    ("F8_E5M2", "float8_e5m2"),
    ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
    ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
):
    if hasattr(torch, _attr):
        DTYPES[_name] = getattr(torch, _attr)

MAX_HEADER = 100_000_000  # safetensors' own limit


def load_view(data: bytes | bytearray | memoryview, field: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file by name, each a view of `data` (read-only
    bytes stay read-only underneath: the caller copies before writing). Raises
    MediaError for bytes that are not a valid safetensors file."""
    if sys.byteorder != "little":  # the file is little-endian: safetensors swaps bytes
        from safetensors.torch import load

        try:
            return load(bytes(data))
        except Exception as exc:  # SafetensorError and what torch raises
            raise _bad(field, f"{type(exc).__name__}: {exc}") from exc
    view = memoryview(data).cast("B")
    tensors, base, end = _layout(view, field)
    if base + end != len(view):
        if base + end > len(view):
            name = max(tensors, key=lambda t: t[4])[0]
            raise _bad(field, f"tensor {name!r} ends past the data ({base + end} > {len(view)})")
        raise _bad(field, f"{len(view) - base - end} bytes after the last tensor")
    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():  # read-only bytes: the batch copies them
        warnings.simplefilter("ignore", UserWarning)
        for name, dtype, shape, begin, stop in tensors:
            if begin == stop:
                out[name] = torch.empty(shape, dtype=dtype)
            else:
                flat = torch.frombuffer(view[base + begin : base + stop], dtype=dtype)
                out[name] = flat.view(shape)
    return out


Layout = tuple[tuple[tuple[str, torch.dtype, tuple[int, ...], int, int], ...], int, int]
"""Each tensor's (name, dtype, shape, begin, stop), where the data starts, where it ends."""

# Checked headers by their bytes: a data set's members share a few (one per shape), and
# parsing and checking one was half of reading a latent sample (22 us here, then 11).
_LAYOUTS: dict[bytes, Layout] = {}
_MAX_LAYOUTS = 256


def _layout(view: memoryview, field: str) -> Layout:
    """The member's tensors, from its header, checked as safetensors checks them (all but
    the length of the data, which the caller checks)."""
    if len(view) < 8:
        raise _bad(field, "shorter than its 8-byte header length")
    size = int.from_bytes(view[:8], "little")
    if size > MAX_HEADER or 8 + size > len(view):
        raise _bad(field, f"header length {size} past the data ({len(view)} bytes)")
    key = bytes(view[: 8 + size])
    known = _LAYOUTS.get(key)
    if known is not None:
        return known
    header, base = _header(view, field)
    tensors = []
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, stop) = _entry(name, info, field)
        numel = 1
        for dim in shape:
            numel *= dim
        if stop - begin != numel * dtype.itemsize:
            raise _bad(field, f"tensor {name!r}: {stop - begin} bytes for shape {shape}")
        tensors.append((name, dtype, tuple(shape), begin, stop))
        end = max(end, stop)
    # Like safetensors: the tensors tile the data, in order, with nothing between.
    at = 0
    for _, _, _, begin, stop in sorted(tensors, key=lambda t: (t[3], t[4])):
        if begin != at:
            raise _bad(field, f"data offsets leave a gap or overlap at byte {at}")
        at = stop
    layout = (tuple(tensors), base, end)
    if len(_LAYOUTS) >= _MAX_LAYOUTS:
        _LAYOUTS.clear()
    _LAYOUTS[key] = layout
    return layout


def _header(view: memoryview, field: str) -> tuple[dict[str, Any], int]:
    if len(view) < 8:
        raise _bad(field, "shorter than its 8-byte header length")
    size = int.from_bytes(view[:8], "little")
    if size > MAX_HEADER or 8 + size > len(view):
        raise _bad(field, f"header length {size} past the data ({len(view)} bytes)")
    try:
        header = json.loads(bytes(view[8 : 8 + size]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad(field, f"header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise _bad(field, "header is not a JSON object")
    return header, 8 + size


def _entry(name: str, info: Any, field: str) -> tuple[torch.dtype, list[int], tuple[int, int]]:
    if not isinstance(info, dict):
        raise _bad(field, f"tensor {name!r}: not an object")
    dtype = DTYPES.get(info.get("dtype"))  # type: ignore[arg-type]
    shape = info.get("shape")
    offsets = info.get("data_offsets")
    if dtype is None:
        raise _bad(field, f"tensor {name!r}: unknown dtype {info.get('dtype')!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _bad(field, f"tensor {name!r}: shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and o >= 0 for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise _bad(field, f"tensor {name!r}: data_offsets {offsets!r}")
    return dtype, shape, (offsets[0], offsets[1])


def _bad(field: str, why: str) -> MediaError:
    return MediaError(f"unreadable .{field} ({why})")
