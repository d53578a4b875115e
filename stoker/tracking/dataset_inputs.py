"""The data sets a run reads, as MLflow dataset inputs: its data lineage.

One input per data set, in the run's "Datasets used" (run page, Overview) and in the
experiment's runs table, where a run's data sets can be compared and filtered:

    name        the source's name in a mixture (data.sources), "train" for data.url,
                "synthetic" for the set behind data.url: null, "eval" for the
                held-out set; the UI shows it as `name (digest)`
    digest      the manifest's fingerprint (16 hex digits of its shards' paths,
                checksums and sample counts: `stoker data inspect` prints it), or
                "no-manifest" for plain WebDataset shards
    source      where it is: a local path ("local"), an s3:// URL ("s3"), an
                http(s) URL ("http"), anything else ("external")
    profile     samples, hours, shards, bytes, modalities; the weight of a source
                in a mixture; "bucket <name>": samples per bucket (data.buckets);
                for latents (`stoker data encode`): "encoded from" (the source data
                set), "encoder" (its factory and identity) and "lineage" (raw ->
                packed -> encoded)
    schema      one column per modality (video, audio: binary; text, meta: string)
    tag         mlflow.data.context: "training" or "eval"

The job's RunLogger queues them like any record (spooled through an outage). An
input is logged once per run: the writer reads the run's inputs before it sends and
skips a (name, digest) already there, as the store itself does, so a requeued job's
attempts and a replayed spool add nothing. A data set whose manifest changed between
attempts (data.allow_changed_data) has a new digest, and is recorded again: the run
read both.

No mlflow import at module level (login nodes import the tracking package).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stoker.tracking.limits import cut

CONTEXT_TAG = "mlflow.data.context"
"""MLflow's input tag for what a data set was used for (mlflow/utils/mlflow_tags.py)."""
TRAINING = "training"
EVAL = "eval"
NO_MANIFEST = "no-manifest"
"""The digest of plain WebDataset shards: without a manifest, their identity would take
reading every tar."""

# MLflow's limits on a dataset (mlflow/utils/validation.py).
MAX_NAME = 500
MAX_SOURCE = 65_535

_COLUMN_TYPES = {
    "video": "binary",
    "audio": "binary",
    "text": "string",
    "meta": "string",
    "latent": "binary",
}


@dataclass(frozen=True)
class DataSetInput:
    """One data set a run reads, as its manifest describes it."""

    name: str
    context: str
    """TRAINING or EVAL."""
    url: str
    digest: str
    """The manifest's fingerprint (`Manifest.fingerprint()`), or NO_MANIFEST."""
    samples: int | None = None
    duration_s: float | None = None
    """The manifest's total playable seconds."""
    shards: int | None = None
    bytes: int | None = None
    modalities: tuple[str, ...] = ()
    weight: float | None = None
    """Its share of a mixture (data.sources), unnormalised; None outside a mixture."""
    bucket_counts: Mapping[str, int] | None = None
    """Samples per bucket name (data.buckets), when the caller knows them."""
    encoder: str | None = None
    """A latent data set's encoder: 'package.module:factory (identity digest)'."""
    lineage: tuple[str, ...] = ()
    """A latent data set's chain, oldest first: the raw or packed source, then each
    encode (stoker/data/format/latent_format.py `chain`)."""


def dataset_entry(data_set: DataSetInput) -> dict[str, Any]:
    """The JSON-able record of one input (queued, spooled, then sent by
    `send_dataset_inputs`)."""
    profile: dict[str, Any] = {}
    if data_set.samples is not None:
        profile["samples"] = data_set.samples
    if data_set.duration_s is not None:
        profile["hours"] = round(data_set.duration_s / 3600, 6)
    if data_set.shards is not None:
        profile["shards"] = data_set.shards
    if data_set.bytes is not None:
        profile["bytes"] = data_set.bytes
    if data_set.modalities:
        profile["modalities"] = ", ".join(data_set.modalities)
    if data_set.weight is not None:
        profile["weight"] = data_set.weight
    if data_set.digest == NO_MANIFEST:
        profile["manifest"] = "none: plain WebDataset shards"
    for bucket, count in (data_set.bucket_counts or {}).items():
        profile[f"bucket {bucket}"] = int(count)
    if data_set.encoder is not None:
        profile["encoder"] = data_set.encoder
    if len(data_set.lineage) > 1:
        profile["encoded from"] = data_set.lineage[-2]
        profile["lineage"] = " -> ".join(data_set.lineage)
    columns = [
        {"type": _COLUMN_TYPES.get(m, "string"), "name": m, "required": True}
        for m in data_set.modalities
    ]
    source_type, source = dataset_source(data_set.url)
    return {
        "name": cut(data_set.name, MAX_NAME),
        "digest": data_set.digest,
        "source_type": source_type,
        "source": cut(source, MAX_SOURCE),
        # The shape MLflow's own datasets use; the UI shows it as a table of columns.
        "schema": json.dumps({"mlflow_colspec": columns}) if columns else None,
        "profile": json.dumps(profile),
        "context": data_set.context,
    }


def dataset_source(url: str) -> tuple[str, str]:
    """(source type, source JSON) of `url` as the MLflow UI reads them: it shows a local
    path and an s3:// URI as text, an http(s) or other URL as a link."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("", "file"):
        path = url.split("://", 1)[1] if scheme else url
        return "local", json.dumps({"uri": os.path.abspath(path)})
    if scheme in ("s3", "s3a"):
        return "s3", json.dumps({"uri": url})
    if scheme in ("http", "https"):
        return "http", json.dumps({"url": url})
    return "external", json.dumps({"url": url})


def send_dataset_inputs(client: Any, run_id: str, entries: Sequence[Mapping[str, Any]]) -> int:
    """Log the inputs of `entries` (`dataset_entry` records) into run `run_id`, but for
    those whose (name, digest) the run has already; returns how many were new. Store
    errors propagate (the writer decides)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = client.get_run(run_id).inputs  # None from a store that records no inputs
    seen = {(i.dataset.name, i.dataset.digest) for i in (inputs.dataset_inputs if inputs else [])}
    new = []
    for entry in entries:
        key = (entry["name"], entry["digest"])
        if key in seen:
            continue
        seen.add(key)
        dataset = Dataset(
            name=entry["name"],
            digest=entry["digest"],
            source_type=entry["source_type"],
            source=entry["source"],
            schema=entry.get("schema"),
            profile=entry.get("profile"),
        )
        new.append(DatasetInput(dataset, tags=[InputTag(CONTEXT_TAG, entry["context"])]))
    if new:
        client.log_inputs(run_id, datasets=new)
    return len(new)
