"""The public path of stoker's tiny encoder: `--encoder stoker.data.tiny_encoder:build`
(README, `encode.encoder`). It lives in stoker/data/encode/tiny_encoder.py."""

from stoker.data.encode.tiny_encoder import TinyAVEncoder, build

__all__ = ["TinyAVEncoder", "build"]
