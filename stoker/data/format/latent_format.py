"""What a latent data set (`stoker data encode`) adds to the shard format.

A latent data set is a data set like any other (tar shards, an index beside each,
one manifest): each sample holds one `<key>.latent.safetensors` member, the encoder's
tensors for that sample by name ("video", "audio", ...), plus the source sample's
caption (`.txt`) and metadata (`.json`) passed through. Its index entries say which
bucket each sample was decoded at and the shape and dtype of each tensor; its manifest
says how it was made (`EncodingRecord`): the encoder's identity, the source data set
(and the source's own encoding when it was itself encoded: the chain), and the decode
settings, so that a loader batches latents by the buckets they were made with.

A manifest with an encoding record has format version 2; a stoker that reads only
version 1 refuses it with "upgrade stoker" rather than misreading it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

LATENT_MEMBER = "latent.safetensors"
"""The member extension holding a sample's latents: `<key>.latent.safetensors`."""
LATENT_VERSION = 2
"""The manifest and index format version of a latent data set."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorInfo(_Model):
    """One latent tensor of one sample."""

    shape: tuple[int, ...]
    dtype: str
    """torch's name without the prefix: float16, bfloat16, float32, ..."""


class LatentEntry(_Model):
    """What an index says of a sample's latents."""

    bucket: str | None = None
    """The bucket (`Bucket.name`, e.g. '64x64x1s') the sample was decoded at; None when
    the data set was encoded without buckets."""
    clip_seconds: float = Field(ge=0)
    """Length of the clip the latents encode."""
    tensors: dict[str, TensorInfo]


class EncoderIdentity(_Model):
    """What makes two encoders the same: equal identities, equal latents."""

    factory: str
    """Import path of the factory (`package.module:function`)."""
    args: dict[str, str]
    """The factory's keyword arguments as given (`--args k=v`), by name."""
    code_sha256: str
    """SHA-256 of the source files of the factory's module and of the encoder's class."""
    weights_sha256: dict[str, str] = Field(default_factory=dict)
    """SHA-256 of each weights file, by where it was named (`weights_file`, `args.<name>`)."""
    version: str = ""
    """The encoder's own `version` attribute, when it has one."""
    digest: str
    """SHA-256 over all of the above: the identity in one string."""


class SourceRecord(_Model):
    """The data set the latents were made from."""

    url: str
    manifest_sha256: str
    """SHA-256 of the source's manifest.json bytes."""
    samples: int = Field(ge=0)
    created_by: str = ""
    origin: str = ""
    """Where the source's media came from, when known: the SRC `stoker data pack` packed
    (its pack-plan.json)."""
    encoding: EncodingRecord | None = None
    """The source's own encoding record, when it is itself a latent data set."""


class DecodeRecord(_Model):
    """How source samples were decoded before the encoder saw them."""

    modalities: list[str]
    """What the encoder got of each sample: "video", "audio", "text"."""
    fps: float
    resolution: tuple[int, int]
    clip_seconds: float
    sample_rate: int
    channels: int
    resize: str
    buckets: list[BucketRecord] = Field(default_factory=list)


class BucketRecord(_Model):
    name: str
    resolution: tuple[int, int]
    clip_seconds: float


class EncodingRecord(_Model):
    """The manifest's account of how a latent data set was made."""

    encoder: EncoderIdentity
    source: SourceRecord
    decode: DecodeRecord
    shapes: dict[str, dict[str, TensorInfo]]
    """Per bucket name ("" without buckets): each tensor's shape and dtype, the same for
    every sample of the bucket (checked when the manifest is written)."""


SourceRecord.model_rebuild()
DecodeRecord.model_rebuild()


def chain(record: EncodingRecord | None, url: str) -> list[str]:
    """The data set's lineage, oldest first: 'raw -> packed -> encoded' as the URLs and
    what made each step ('<src> (media)', '<url> (stoker data pack)', '<url> (encoded
    by <factory>, <identity>)')."""
    steps: list[str] = []
    current, where = record, url
    while current is not None:
        encoder = current.encoder
        steps.append(f"{where} (encoded by {encoder.factory}, {encoder.digest[:12]})")
        where = current.source.url
        made_by = current.source.created_by
        origin = current.source.origin
        current = current.source.encoding
        if current is None:
            steps.append(f"{where}" + (f" ({made_by})" if made_by else ""))
            if origin:
                steps.append(f"{origin} (media)")
    if not steps:
        steps.append(url)
    return steps[::-1]
