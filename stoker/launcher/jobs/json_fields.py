"""Fields of the JSON files the launcher reads but did not write (progress.json from the
runtime, local-state.json from a supervisor that may have died mid-write): a field that
is absent or of the wrong type reads as None, never as an error."""

from __future__ import annotations

from typing import Any


def number_field(data: dict[str, Any], key: str) -> float | None:
    """data[key] as a float; None when absent or not a number (a bool is not one)."""
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def int_field(data: dict[str, Any], key: str) -> int | None:
    """data[key] as an int; None when absent, not a number or not whole."""
    value = number_field(data, key)
    return int(value) if value is not None and value.is_integer() else None
