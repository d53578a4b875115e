"""The public path of the loader (docs/data.md): `from stoker.data.loader import
StreamingLoader`. It lives in stoker/data/stream/loader.py."""

from stoker.data.stream.loader import MixSource, StreamingLoader, loader_from_config

__all__ = ["MixSource", "StreamingLoader", "loader_from_config"]
