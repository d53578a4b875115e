"""Open a data set by URL: read its manifest (and nothing else) from any fsspec
filesystem, or index plain WebDataset shards that came without one."""

from __future__ import annotations

from typing import Any

from stoker.data.format.shard_format import MANIFEST_NAME, join, parse_manifest
from stoker.data.sets.source import DataSource
from stoker.errors import StokerError

# fsspec's filesystems that live in a package of their own: what to install for each.
_FS_PACKAGES = {
    "s3": "pip install 'stoker[s3]' (s3fs)",
    "s3a": "pip install 'stoker[s3]' (s3fs)",
    "gs": "pip install gcsfs",
    "gcs": "pip install gcsfs",
    "az": "pip install adlfs",
    "abfs": "pip install adlfs",
    "abfss": "pip install adlfs",
    "hf": "pip install huggingface_hub",
}


def _package_fix(url: str) -> str:
    protocol = url.split("://", 1)[0].lower() if "://" in url else ""
    if protocol in _FS_PACKAGES:
        return f"install the package for {protocol}:// URLs: {_FS_PACKAGES[protocol]}"
    return "install the fsspec filesystem package for this URL's scheme"


def open_dataset(url: str, storage_options: dict[str, Any] | None = None) -> DataSource:
    """The data set at `url`: a root holding manifest.json, or plain WebDataset tar
    shards (one .tar URL, a brace pattern such as `shards-{000..009}.tar`, or a
    folder of .tar files without a manifest), indexed in memory."""
    from fsspec.core import url_to_fs

    options = dict(storage_options or {})
    if url.endswith(".tar") or ("{" in url and "}" in url):
        from stoker.data.sets.wds_index import index_plain_shards

        return index_plain_shards(url, options)
    try:
        fs, root = url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise StokerError(
            f"data URL {url!r}: {exc}",
            fix=f"{_package_fix(url)}, or fix the URL",
        ) from exc
    root = root.rstrip("/")
    path = join(root, MANIFEST_NAME)
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        if _holds_tars(fs, root):
            from stoker.data.sets.wds_index import index_plain_shards

            return index_plain_shards(url, options)
        raise StokerError(
            f"no data set at {url!r}: {MANIFEST_NAME} is missing there",
            fix="write one with `stoker data pack SRC DST` or `stoker data synth DST`, "
            "or point at the data set's root folder",
        ) from None
    except (OSError, PermissionError) as exc:
        raise StokerError(
            f"cannot read {url}/{MANIFEST_NAME}: {exc}",
            fix="check the URL, credentials (AWS_* variables, storage options) and endpoint",
        ) from exc
    manifest = parse_manifest(raw, f"{url.rstrip('/')}/{MANIFEST_NAME}")
    if manifest.samples == 0:
        raise StokerError(
            f"data set {url!r} holds no samples", fix="pack media into it with `stoker data pack`"
        )
    return DataSource(url=url, root=root, manifest=manifest, storage_options=options, _fs=fs)


def _holds_tars(fs: Any, root: str) -> bool:
    try:
        return any(str(p).endswith(".tar") for p in fs.ls(root, detail=False))
    except (FileNotFoundError, NotADirectoryError, OSError):
        return False
