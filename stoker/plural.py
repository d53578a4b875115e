"""A count with its noun in the number English wants: "1 shard", "0 shards", "2 shards"."""

from __future__ import annotations


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """`count` and `noun`, the noun plural (`plural_noun`, else noun + "s") unless
    count is 1: plural(1, "shard") == "1 shard", plural(3, "shard") == "3 shards"."""
    return f"{count} {noun if count == 1 else plural_noun or noun + 's'}"
