"""The streaming loader on real encoded media: elastic resume, equal batches per
rank, bad data, and the same stream from local files, memory:// and s3://."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch

from stoker.data.format.shard_format import MANIFEST_NAME, join, parse_index, parse_manifest
from stoker.data.stream.fetch import RetryPolicy
from stoker.data.stream.loader import StreamingLoader
from stoker.data.synthetic.shapes import synth_dataset
from stoker.data.write.shard_writer import SampleToWrite, write_shard
from stoker.errors import StokerError
from tests.s3_server import S3Server

CLIPS = 40
PER_SHARD = 7  # 7,7,7,7,7,5: uneven shards on purpose
BATCH = 8
AV = {"fps": 8, "size": (32, 32), "clip_seconds": 1.0, "sample_rate": 8000}


@pytest.fixture(scope="module")
def dataset(synthetic_av_set: Callable[..., Path]) -> str:
    return str(
        synthetic_av_set(clips=CLIPS, size=(32, 32), sample_rate=8000, samples_per_shard=PER_SHARD)
    )


def all_keys(url: str) -> list[str]:
    fs, root = fsspec.core.url_to_fs(url)
    manifest = parse_manifest(fs.cat_file(join(root, MANIFEST_NAME)), url)
    keys = []
    for shard in manifest.shards:
        keys += [s.key for s in parse_index(fs.cat_file(join(root, shard.index)), url).samples]
    return keys


def loader(url: str, **kw: Any) -> StreamingLoader:
    args: dict[str, Any] = {"batch_size": BATCH, "num_workers": 0, "seed": 7, **AV}
    args.update(kw)
    return StreamingLoader(url, **args)


def take(it: Any, n: int) -> list[dict[str, Any]]:
    return [next(it) for _ in range(n)]


def rows(batch: dict[str, Any]) -> list[tuple[int, str]]:
    return list(zip(batch["position"].tolist(), batch["key"], strict=True))


def test_batches_hold_decoded_clips_of_the_requested_shape(dataset: str) -> None:
    batch = next(iter(loader(dataset, modalities=("video", "audio", "text", "meta"))))
    assert batch["video"].shape == (BATCH, 8, 3, 32, 32) and batch["video"].dtype == torch.uint8
    assert batch["audio"].shape == (BATCH, 1, 8000) and batch["audio"].dtype == torch.float32
    assert batch["video"].float().std() > 1  # frames, not zeros
    assert float(batch["audio"].abs().max()) > 0.01
    assert len(batch["text"]) == BATCH and all(isinstance(t, str) and t for t in batch["text"])
    assert [m["clip"] for m in batch["meta"]] == [int(k.split("-")[1]) for k in batch["key"]]
    assert batch["valid"].all() and batch["skipped"] == []


def test_one_pass_is_every_sample_once_and_epochs_reshuffle(dataset: str) -> None:
    ld = loader(dataset, modalities=("meta",))
    batches = list(ld.batches(max_batches=2 * CLIPS // BATCH))
    first = [k for b in batches[: CLIPS // BATCH] for k in b["key"]]
    second = [k for b in batches[CLIPS // BATCH :] for k in b["key"]]
    assert sorted(first) == sorted(all_keys(dataset)) == sorted(second)
    assert first != second  # epoch 1 is another permutation
    assert ld.state_dict()["epoch"] == 2 and ld.state_dict()["samples_consumed"] == 0


def test_resume_on_other_rank_and_worker_counts_continues_the_stream_exactly(
    dataset: str,
) -> None:
    """Consume k batches on 4 ranks x 2 workers, save, resume on 2 ranks x 1 worker
    and on 8 ranks: the samples seen form exactly one pass, in the order of an
    uninterrupted single-rank run. (The order is of positions and keys: meta alone
    spares the 10 worker processes decoding what no assertion reads.)"""
    meta = ("meta",)
    one_pass = loader(dataset, modalities=meta).batches(max_batches=CLIPS // BATCH)
    reference = [r for b in one_pass for r in rows(b)]
    assert sorted(k for _, k in reference) == sorted(all_keys(dataset))

    k = 2
    first = [
        loader(dataset, rank=r, world_size=4, num_workers=2, modalities=meta) for r in range(4)
    ]
    iterators = [iter(ld) for ld in first]  # all ranks' workers start together
    seen = [take(it, k) for it in iterators]
    for it in iterators:
        it.close()
    states = [ld.state_dict() for ld in first]
    assert all(s == states[0] for s in states), "every rank must hold the same state"
    assert states[0]["samples_consumed"] == k * BATCH  # taken, not prefetched

    def stream(per_rank: list[list[dict[str, Any]]]) -> list[tuple[int, str]]:
        """Global order: batch by batch, rank by rank."""
        return [r for n in range(len(per_rank[0])) for part in per_rank for r in rows(part[n])]

    before = stream(seen)
    for world, workers in ((2, 1), (8, 0)):
        resumed = [
            loader(dataset, rank=r, world_size=world, num_workers=workers, modalities=meta)
            for r in range(world)
        ]
        for ld in resumed:
            ld.load_state_dict(json.loads(json.dumps(states[0])))  # as a checkpoint stores it
        rest = [list(ld.batches(max_batches=CLIPS // BATCH - k)) for ld in resumed]
        whole = before + stream(rest)
        keys = [key for _, key in whole]
        assert Counter(keys) == Counter(all_keys(dataset)), f"{world} ranks: not one pass"
        assert whole == reference, f"{world} ranks x {workers} workers diverged from the stream"


def test_every_rank_gets_the_same_number_of_batches_under_gloo(
    dataset: str, tmp_path: Path
) -> None:
    """Uneven shards never hang a job: two real ranks all-reduce once per batch for
    more than an epoch; a rank short of a batch would block the other. (The ranks read
    without worker processes: their count is the loader's, workers or not.)"""
    import torch.multiprocessing as mp

    port = 29500 + os.getpid() % 1000
    mp.spawn(_gloo_rank, args=(2, port, dataset, str(tmp_path)), nprocs=2, join=True)
    counts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert counts[0]["batches"] == counts[1]["batches"] == CLIPS // BATCH + 1
    assert sorted(counts[0]["positions"] + counts[1]["positions"]) == list(range(CLIPS + BATCH))


def _gloo_rank(rank: int, world: int, port: int, dataset: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # two ranks on a loaded 2-core machine
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    ld = StreamingLoader(
        dataset,
        batch_size=BATCH,
        rank=rank,
        world_size=world,
        num_workers=0,
        modalities=("audio",),
        sample_rate=8000,
    )
    positions: list[int] = []
    batches = 0
    for batch in ld.batches(max_batches=CLIPS // BATCH + 1):
        total = torch.tensor([float(batch["valid"].sum())])
        dist.all_reduce(total)
        assert total.item() == BATCH
        positions += batch["position"].tolist()
        batches += 1
    Path(out, f"rank{rank}.json").write_text(
        json.dumps({"batches": batches, "positions": positions})
    )
    dist.destroy_process_group()


def test_state_is_refused_on_another_data_set_or_order(dataset: str, tmp_path: Path) -> None:
    ld = loader(dataset)
    next(iter(ld))
    state = ld.state_dict()
    other = tmp_path / "other"
    synth_dataset(str(other), clips=8, seconds=1.0, size=(32, 32), fps=8, sample_rate=8000)
    with pytest.raises(StokerError, match="the data set changed since the state was saved"):
        loader(str(other)).load_state_dict(state)
    with pytest.raises(StokerError, match="seed=7"):
        loader(dataset, seed=8).load_state_dict(state)
    with pytest.raises(StokerError, match="not a StreamingLoader state"):
        loader(dataset).load_state_dict({"epoch": 0})


def test_a_state_saved_by_the_previous_version_resumes(dataset: str) -> None:
    """Checkpoints written before mixtures and buckets hold a stream position (the
    positions are all it compares: meta alone, no clip decoded)."""
    meta = ("meta",)
    straight = [b["position"].tolist() for b in take(iter(loader(dataset, modalities=meta)), 5)]
    ld = loader(dataset, modalities=meta)
    take(iter(ld), 2)
    new = ld.state_dict()
    old = {
        key: new[key]
        for key in (
            "epoch",
            "samples_consumed",
            "seed",
            "shuffle",
            "shuffle_shards",
            "dataset",
            "dataset_samples",
        )
    }
    resumed = loader(dataset, modalities=meta)
    resumed.load_state_dict({**old, "version": 1})
    assert [b["position"].tolist() for b in take(iter(resumed), 3)] == straight[2:]


def test_bad_loader_configs_fail_at_start(dataset: str, tmp_path: Path) -> None:
    with pytest.raises(StokerError, match="does not split over 3 ranks"):
        loader(dataset, world_size=3)
    with pytest.raises(StokerError, match="fork is refused"):
        loader(dataset, start_method="fork")
    with pytest.raises(StokerError, match=r"manifest.json is missing"):
        loader(str(tmp_path / "nothing-here"))
    # A data set without captions: asking for text fails before any worker starts.
    plain = tmp_path / "no-text"
    src = fsspec.filesystem("file")
    index = parse_index(src.cat_file(join(dataset, "shards/shard-000000.index.json")), "t")
    tar = src.cat_file(join(dataset, "shards/shard-000000.tar"))
    samples = []
    for e in index.samples[:3]:
        members = {
            ext: tar[e.members[ext].offset : e.members[ext].offset + e.members[ext].size]
            for ext in ("mp4", "flac")
        }
        samples.append(SampleToWrite(e.key, members, e.video, e.audio))
    _write_set(plain, [samples])
    with pytest.raises(StokerError, match=r"asks for text.*has: video, audio"):
        loader(str(plain), modalities=("video", "text"))


def _write_set(root: Path, shards: list[list[SampleToWrite]]) -> None:
    from stoker.data.format.shard_format import build_manifest, dump, record_for, shard_file_name
    from stoker.data.write.shard_writer import write_json_atomic

    fs = fsspec.filesystem("file")
    records, indexes = [], []
    for i, samples in enumerate(shards):
        path = f"shards/{shard_file_name(i)}"
        index = write_shard(fs, str(root / path), samples)
        records.append(record_for(index, path))
        indexes.append(index)
    write_json_atomic(fs, str(root / MANIFEST_NAME), dump(build_manifest(records, indexes, "test")))


def _samples_of(dataset: str, shard: int) -> list[SampleToWrite]:
    src = fsspec.filesystem("file")
    index = parse_index(src.cat_file(join(dataset, f"shards/shard-{shard:06d}.index.json")), "t")
    tar = src.cat_file(join(dataset, f"shards/shard-{shard:06d}.tar"))
    out = []
    for e in index.samples:
        members = {ext: tar[m.offset : m.offset + m.size] for ext, m in e.members.items()}
        out.append(SampleToWrite(e.key, members, e.video, e.audio))
    return out


def test_corrupt_media_is_skipped_counted_and_reported(
    dataset: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A shard holding a truncated mp4 and a garbage flac: exactly those two samples
    are skipped; their batch keeps its shape with copies, marked not valid."""
    samples = _samples_of(dataset, 0) + _samples_of(dataset, 1)[:1]  # 8 samples
    truncated, garbage = samples[2], samples[5]
    truncated.members["mp4"] = truncated.members["mp4"][: len(truncated.members["mp4"]) // 2]
    garbage.members["flac"] = b"fLaC" + bytes(
        np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8)
    )
    root = tmp_path / "corrupt"
    _write_set(root, [samples])
    bad = {f"shards/shard-000000.tar:{truncated.key}", f"shards/shard-000000.tar:{garbage.key}"}

    with caplog.at_level(logging.WARNING, logger="stoker.data"):
        ld = loader(str(root))
        batch = next(iter(ld))
    assert set(batch["skipped"]) == bad
    assert batch["video"].shape[0] == BATCH and int((~batch["valid"]).sum()) == 2
    assert ld.stats().skipped_samples == 2 and ld.stats().samples == BATCH - 2
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert truncated.key in logged and garbage.key in logged

    # The same with worker processes: counters travel back with the batches.
    ld = loader(str(root), num_workers=2)
    batches = list(ld.batches(max_batches=2))
    assert {s for b in batches for s in b["skipped"]} == bad
    assert ld.stats().skipped_samples == 4  # two passes over the 8 samples

    # And decoding in threads: the same two skipped, counted once each.
    ld = loader(str(root), decode_threads=3)
    threaded = next(iter(ld))
    assert set(threaded["skipped"]) == bad and torch.equal(threaded["valid"], batch["valid"])
    assert ld.stats().skipped_samples == 2 and ld.stats().samples == BATCH - 2


def test_a_shard_that_cannot_be_fetched_is_retried_then_skipped(
    dataset: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "missing"
    _write_set(root, [_samples_of(dataset, 0), _samples_of(dataset, 1)])
    (root / "shards" / "shard-000001.tar").unlink()  # listed in the manifest, gone from storage
    with caplog.at_level(logging.WARNING, logger="stoker.data"):
        ld = loader(str(root), batch_size=14, retry=RetryPolicy(attempts=3, backoff_s=0.01))
        batch = next(iter(ld))
    stats = ld.stats()
    assert stats.failed_shards == 1 and stats.skipped_samples == PER_SHARD
    assert stats.fetch_retries >= 2  # the first read of the shard was tried 3 times
    assert int(batch["valid"].sum()) == PER_SHARD
    assert all(s.startswith("shards/shard-000001.tar:") for s in batch["skipped"])
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert (
        len(errors) == 1 and "giving up on shard" in errors[0] and "shard-000001.tar" in errors[0]
    )


def _copy_to(fs_url: str, dataset: str) -> None:
    fs, root = fsspec.core.url_to_fs(fs_url)
    for path in Path(dataset).rglob("*"):
        if path.is_file():
            fs.pipe_file(join(root, str(path.relative_to(dataset))), path.read_bytes())


def _first_batches(url: str, **kw: Any) -> list[dict[str, Any]]:
    return list(loader(url, **kw).batches(max_batches=3))


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x["key"] == y["key"] and torch.equal(x["video"], y["video"])
        assert torch.equal(x["audio"], y["audio"])


def test_decoding_in_threads_gives_the_same_batches_and_counts(
    dataset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decode threads (data.decode_threads; by default a worker takes the cores its
    machine spares) change when a clip is decoded, never which clip, its random offset,
    its place in the batch or the counts the metrics show."""
    import threading

    import stoker.data.media.decode as media_decode

    decoded_in: list[str] = []
    decode_video = media_decode.decode_video

    def recorded(*args: Any, **kwargs: Any) -> Any:
        decoded_in.append(threading.current_thread().name)
        return decode_video(*args, **kwargs)

    monkeypatch.setattr(media_decode, "decode_video", recorded)
    one = loader(dataset, decode_threads=1, clip_seconds=2.5)  # 2 s clips: all padded
    three = loader(dataset, decode_threads=3, clip_seconds=2.5)
    first = list(one.batches(max_batches=3))
    assert set(decoded_in) == {threading.current_thread().name}
    decoded_in.clear()
    _same(first, list(three.batches(max_batches=3)))
    assert len(decoded_in) == 3 * BATCH and {n.split("_")[0] for n in decoded_in} == {"decode"}
    a, b = one.stats(), three.stats()
    assert (a.samples, a.video_frames, a.short_samples, a.bytes_read) == (
        b.samples,
        b.video_frames,
        b.short_samples,
        b.bytes_read,
    )
    assert a.samples == 3 * BATCH and a.short_samples == a.samples and b.decode_s > 0
    with pytest.raises(StokerError, match="decode_threads 0 is not a number of threads"):
        loader(dataset, decode_threads=0)


def test_memory_and_local_give_the_same_stream(dataset: str) -> None:
    url = "memory://loader-test/set"
    _copy_to(url, dataset)
    try:
        _same(_first_batches(dataset), _first_batches(url))
        with pytest.raises(StokerError, match="memory:// lives in one process"):
            loader(url, num_workers=2)
    finally:
        fsspec.filesystem("memory").rm("/loader-test", recursive=True)


def test_s3_gives_the_same_stream_in_worker_processes(dataset: str, s3_env: S3Server) -> None:
    """s3fs against a real S3 API server, read from spawned DataLoader workers.
    (spawn: a forkserver started by an earlier test would not see this test's AWS_*
    variables; a training process sets them before its first loader.)"""
    url = f"s3://{s3_env.new_bucket()}/av/set"
    _copy_to(url, dataset)
    _same(_first_batches(dataset), _first_batches(url, num_workers=2, start_method="spawn"))


def test_the_experiment_file_configures_the_loader(dataset: str, tmp_path: Path) -> None:
    from stoker.config import resolve_config
    from stoker.data.stream.loader import loader_from_config

    exp = tmp_path / "exp.yaml"
    exp.write_text(
        f"data:\n  url: {dataset}\n  batch_size: 4\n  num_workers: 0\n  fps: 4\n"
        "  resolution: [16, 24]\n  sample_rate: 8000\n  channels: 2\n"
        "  modalities: [video, audio, text]\n  decode_threads: 3\n"
        "train:\n  seed: 11\n"
    )
    config = resolve_config(exp, [], {}).config
    ld = loader_from_config(config, rank=1, world_size=2)
    batch = next(iter(ld))
    assert batch["video"].shape == (2, 4, 3, 16, 24) and batch["audio"].shape == (2, 2, 8000)
    assert len(batch["text"]) == 2 and ld.state_dict()["seed"] == 11
    # The clip settings arrive as one value made from data.* (ClipSpec.from_data).
    clip = ld.clip
    assert (clip.fps, clip.size, clip.sample_rate, clip.channels) == (4, (16, 24), 8000, 2)
    assert clip.modalities == ("video", "audio", "text") and clip.clip_offset == "random"
    assert ld.decode_threads == 3
    config.data.decode_threads = 0  # the default: one per core the workers spare
    assert loader_from_config(config, rank=1, world_size=2).decode_threads == 1  # no workers
    config.data.url = None
    with pytest.raises(StokerError, match=r"data.url is null"):
        loader_from_config(config, rank=0, world_size=1)


def test_clips_longer_than_their_sample_are_padded_and_counted(dataset: str) -> None:
    ld = loader(dataset, clip_seconds=3.0, modalities=("video", "audio"))
    batch = next(iter(ld))
    assert batch["video"].shape[1] == 24 and batch["audio"].shape[2] == 24_000
    assert ld.stats().short_samples == BATCH and ld.stats().skipped_samples == 0
    # Past the 2 s of media: the last frame held, the audio silent.
    assert torch.equal(batch["video"][:, -1], batch["video"][:, 17])
    assert float(batch["audio"][:, :, 16_500:].abs().max()) == 0.0


# A rank under SLURM: the stop signals reach every process of the step, loader workers
# included (SIGUSR2 before the time limit, SIGTERM on scancel, requeue and preemption).
STOP_SIGNALS_RANK = """
import os, signal, sys
from stoker.data.stream.loader import StreamingLoader
got = []
for sig in (signal.SIGUSR2, signal.SIGTERM):
    signal.signal(sig, lambda signum, frame: got.append(signum))
url, batch = sys.argv[1], int(sys.argv[2])
loader = StreamingLoader(url, batch_size=batch, num_workers=2, seed=7, fps=8, size=(32, 32),
                         clip_seconds=1.0, sample_rate=8000)
count = 0
for _ in loader.batches(max_batches=loader.samples_per_epoch // batch):
    count += 1
    if count == 1:
        os.killpg(0, signal.SIGUSR2)
        os.killpg(0, signal.SIGTERM)
print(count, sorted(got))
"""


def test_stop_signals_to_the_whole_step_leave_the_loader_running(dataset: str) -> None:
    """The rank handles the signals (it saves at the step's end); its workers must not
    die of them, or the next batch fails before the rank can save."""
    result = subprocess.run(
        [sys.executable, "-c", STOP_SIGNALS_RANK, dataset, str(BATCH)],
        capture_output=True, text=True, timeout=120, start_new_session=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    count, got = result.stdout.split(maxsplit=1)
    assert int(count) == CLIPS // BATCH  # every batch of the pass, after the signals
    assert got.strip() == str(sorted([int(signal.SIGUSR2), int(signal.SIGTERM)]))


def worker_hit_before_its_init(report: Any) -> None:
    """A loader worker's first steps, with a SIGTERM of the step's arriving between
    torch's signal handlers and the loader's worker_init_fn (the race under load)."""
    torch._C._set_worker_signal_handlers()  # what torch's worker loop does first
    os.kill(os.getpid(), signal.SIGTERM)  # not from the parent: torch's handler dies of it
    from stoker.data.stream.loader import _init_worker

    _init_worker(0, dict(os.environ))
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    report.put((signal.getsignal(signal.SIGTERM) == signal.SIG_IGN, signal.SIGTERM in blocked))


WORKER_HIT_BEFORE_ITS_INIT = """
import sys
from stoker.data.stream.loader import _context, _stop_signals_held
from tests.data.stream.test_loader import worker_hit_before_its_init
method = sys.argv[1]
ctx = _context(method)
report = ctx.Queue()
worker = ctx.Process(target=worker_hit_before_its_init, args=(report,))
with _stop_signals_held(method):  # as the loader starts its workers
    worker.start()
worker.join(60)
print(worker.exitcode, report.get(timeout=10) if worker.exitcode == 0 else "")
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_stop_signal_before_a_workers_init_waits_and_is_dropped(method: str) -> None:
    """A worker, from the fork server or spawned as the loader starts it, starts with the
    stop signals blocked, so one sent while torch's own SIGTERM handler is in place
    cannot kill it; after its init it ignores them, unblocked."""
    result = subprocess.run(
        [sys.executable, "-c", WORKER_HIT_BEFORE_ITS_INIT, method],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[3],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().split(maxsplit=1) == ["0", "(True, False)"], result.stderr[-3000:]


@pytest.mark.parametrize(
    ("url", "fix"),
    [
        ("gs://bucket/set", "pip install gcsfs"),
        ("abfs://container/set", "pip install adlfs"),
        ("s3://bucket/set", "pip install 'stoker[s3]'"),
        ("nosuch://x/set", "fsspec filesystem package for this URL's scheme"),
    ],
)
def test_the_fix_for_a_missing_filesystem_names_its_own_package(url: str, fix: str) -> None:
    from stoker.data.sets.dataset import _package_fix

    assert fix in _package_fix(url)
    if not url.startswith("s3"):
        assert "stoker[s3]" not in _package_fix(url)  # not the s3 extra for another store


def test_a_url_no_filesystem_serves_is_refused_with_that_fix() -> None:
    from stoker.data.sets.dataset import open_dataset
    from stoker.errors import StokerError

    with pytest.raises(StokerError) as caught:
        open_dataset("nosuch://x/set")
    assert "nosuch://x/set" in caught.value.message
    assert "fsspec filesystem package for this URL's scheme" in (caught.value.fix or "")
