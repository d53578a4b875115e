"""The public paths of stoker.data keep working after the move into wings: each old path
gives the very object its wing defines."""

from __future__ import annotations

from stoker.import_path import import_callable


def test_the_loader_keeps_its_public_path() -> None:
    from stoker.data.loader import StreamingLoader
    from stoker.data.stream.loader import StreamingLoader as in_its_wing

    assert StreamingLoader is in_its_wing


def test_the_tiny_encoder_keeps_its_public_path() -> None:
    from stoker.data.encode import tiny_encoder
    from stoker.data.tiny_encoder import build

    assert build is tiny_encoder.build
    assert import_callable("stoker.data.tiny_encoder:build", key="--encoder") is tiny_encoder.build
