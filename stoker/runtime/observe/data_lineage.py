"""Which data sets a run reads, recorded in its MLflow run as dataset inputs: the data
lineage of what it trains (what an input holds: stoker/tracking/dataset_inputs.py).

    record_data_sets(tracking, cfg.data, evaluates=True)     # global rank 0

The trainer's entry point (train.py) calls it once the loaders are built, so the
synthetic set behind `data.url: null` exists; `stoker.job.init()` (own_loop/run.py) for the
data sets the config names, and `run.loader()` for the synthetic set when it makes it
(a loop of one's own with data.url null may read data stoker does not know of).

    data.sources       one input per source, named as the source, context "training"
    data.url           "train", context "training"
    neither            "synthetic" (the set stoker makes), context "training"
    data.eval_url      "eval", context "eval", where the run evaluates; with data.url
                       null and no eval_url, the synthetic held-out set, as "eval"

Each data set's manifest.json is read, and nothing else: samples and playable seconds
are totals there, so no shard index is read for lineage. Parsing a manifest of
100,000 shards (24 MB) took 1.5 s on the 2-core development machine, one of 1,000
shards 15 ms. Every attempt of a requeued job records them again; the run keeps one
input per (name, digest).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from stoker.config import DataConfig
from stoker.data.format.latent_format import chain
from stoker.data.inspect_dataset import read_manifest
from stoker.data.synthetic.default_set import synthetic_data_path
from stoker.tracking.dataset_inputs import EVAL, NO_MANIFEST, TRAINING, DataSetInput
from stoker.tracking.stderr import first_line, warn

TRAIN_NAME = "train"
SYNTHETIC_NAME = "synthetic"
EVAL_NAME = "eval"


class DataSetSink(Protocol):
    """Where inputs go: the RunLogger, or the runtime's `Tracking` around it."""

    def log_dataset_inputs(self, inputs: Sequence[DataSetInput]) -> None: ...


@dataclass(frozen=True)
class DataSetRef:
    """A data set the config names, before its manifest is read."""

    name: str
    context: str
    url: str
    weight: float | None = None


def data_sets_of(data: DataConfig, *, evaluates: bool, synthetic: bool = True) -> list[DataSetRef]:
    """The data sets a run of `data` reads (the table in the module docstring);
    `evaluates`: the run reads the held-out set; `synthetic`: the synthetic sets stand
    in for data.url null (else nothing does)."""
    refs: list[DataSetRef] = []
    if data.sources:
        refs += [DataSetRef(s.name, TRAINING, s.url, s.weight) for s in data.sources]
    elif data.url is not None:
        refs.append(DataSetRef(TRAIN_NAME, TRAINING, data.url))
    elif synthetic:
        refs.append(DataSetRef(SYNTHETIC_NAME, TRAINING, str(synthetic_data_path(data))))
    if evaluates:
        if data.eval_url is not None:
            refs.append(DataSetRef(EVAL_NAME, EVAL, data.eval_url))
        elif data.url is None and synthetic:
            refs.append(DataSetRef(EVAL_NAME, EVAL, str(synthetic_data_path(data, "eval"))))
    return refs


def read_input(ref: DataSetRef, bucket_counts: dict[str, int] | None = None) -> DataSetInput:
    """The input of `ref`, from its manifest (one read); `bucket_counts`: samples per
    bucket name (data.buckets), where the caller knows them. StokerError where the
    manifest cannot be read."""
    manifest = read_manifest(ref.url)
    if manifest is None:
        return DataSetInput(ref.name, ref.context, ref.url, NO_MANIFEST, weight=ref.weight)
    encoding = manifest.encoding
    return DataSetInput(
        ref.name,
        ref.context,
        ref.url,
        manifest.fingerprint(),
        samples=manifest.samples,
        duration_s=manifest.totals.duration_s,
        shards=len(manifest.shards),
        bytes=manifest.totals.bytes,
        modalities=tuple(manifest.modalities),
        weight=ref.weight,
        bucket_counts=bucket_counts,
        encoder=(
            f"{encoding.encoder.factory} ({encoding.encoder.digest[:12]})" if encoding else None
        ),
        lineage=tuple(chain(encoding, ref.url)) if encoding else (),
    )


def record_data_sets(
    sink: DataSetSink,
    data: DataConfig,
    *,
    evaluates: bool,
    synthetic: bool = True,
    bucket_counts: Mapping[str, dict[str, int]] | None = None,
) -> None:
    """Queue the inputs of the data sets `data_sets_of` names into the run, and return.
    `bucket_counts`: per data set name, its samples per bucket. Never raises: a data
    set whose manifest cannot be read is left out, and said on stderr."""
    inputs = []
    for ref in data_sets_of(data, evaluates=evaluates, synthetic=synthetic):
        try:
            inputs.append(read_input(ref, (bucket_counts or {}).get(ref.name)))
        except Exception as exc:  # lineage must never stop training
            warn(f"data set {ref.name!r} ({ref.url}) is not recorded in MLflow: {first_line(exc)}")
    if inputs:
        sink.log_dataset_inputs(inputs)


def record_lineage(sink: DataSetSink, data: DataConfig, trainer: Any) -> None:
    """The trainer's data sets into the run, from rank 0. With buckets, their per-bucket
    counts need every shard index read: that runs in a thread while training starts, and
    the inputs are queued when it is done (a run that ends first records them on resume)."""
    evaluates = trainer.eval_loader is not None
    if not data.buckets:
        record_data_sets(sink, data, evaluates=evaluates)
        return

    def counted() -> None:
        try:
            counts = trainer.loader.bucket_counts()
            if counts and not data.sources:  # the loader's one data set, named as here
                training = data_sets_of(data, evaluates=False)
                counts = {training[0].name: next(iter(counts.values()))} if training else None
        except Exception as exc:  # lineage must never stop training
            warn(f"per-bucket counts are not recorded in MLflow: {first_line(exc)}")
            counts = None
        record_data_sets(sink, data, evaluates=evaluates, bucket_counts=counts)

    threading.Thread(target=counted, name="stoker-lineage", daemon=True).start()
