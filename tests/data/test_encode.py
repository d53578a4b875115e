"""`stoker data encode` on real data sets made here: the latents are the encoder's
output, the manifest names encoder and source, a re-run encodes only what is missing
(and gives the same bytes), another encoder or source is refused, a clip the encoder
fails on is skipped and reported, a broken encoder is stopped, buckets are kept, and
the loader streams the latents by them."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from stoker.data.format.shard_format import MANIFEST_NAME, parse_index, parse_manifest
from stoker.data.synthetic.shapes import synth_dataset, synth_media_files
from tests.clirun import stoker, stoker_text

TINY = "stoker.data.tiny_encoder:build"
# The command runs in this process (`stoker_text`: its imports paid once, not per call),
# its encoder on one torch thread; `--workers 2` runs as a process of its own, whose
# pool's fork server then ends with it.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 clips of 1 s, 64x64, in 4 shards of 2."""
    root = tmp_path_factory.mktemp("encode") / "src"
    synth_dataset(str(root), clips=8, seconds=1.0, size=(64, 64), samples_per_shard=2)
    return root


def encode(
    src: Path, dst: Path, *args: str, encoder: str = TINY, in_process: bool = True
) -> dict[str, Any]:
    argv = ["data", "encode", str(src), str(dst), "-e", encoder, "--json", *args]
    result = stoker_text(*argv) if in_process else stoker(*argv, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return summary


def refused(src: Path, dst: Path, *args: str, encoder: str = TINY) -> str:
    result = stoker_text("data", "encode", str(src), str(dst), "-e", encoder, *args)
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    return result.stderr


def manifest_of(root: Path) -> Any:
    return parse_manifest((root / MANIFEST_NAME).read_bytes(), str(root))


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "encode-work" not in p.parts
    }


def test_latents_are_the_encoders_output_and_the_manifest_names_encoder_and_source(
    source: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load

    from stoker.data.encode.tiny_encoder import TinyAVEncoder
    from stoker.data.media.decode import decode_audio, decode_video

    dst = tmp_path / "latents"
    summary = encode(source, dst, "--args", "channels=6")
    assert summary["samples"] == 8 and summary["shards"] == 4 and summary["written"] == 4
    assert summary["skipped"] == [] and summary["clips_per_s"] > 0
    manifest = manifest_of(dst)
    assert manifest.version == 2 and manifest.created_by == "stoker data encode"
    assert manifest.modalities == ["text", "meta", "latent"]
    encoding = manifest.encoding
    assert encoding.encoder.factory == TINY and encoding.encoder.args == {"channels": "6"}
    assert encoding.encoder.digest == summary["encoder_identity"]
    assert encoding.source.url == f"file://{source}"
    sha = hashlib.sha256((source / MANIFEST_NAME).read_bytes()).hexdigest()
    assert encoding.source.manifest_sha256 == sha and encoding.source.samples == 8
    shapes = {n: (list(t.shape), t.dtype) for n, t in encoding.shapes[""].items()}
    assert shapes == {"video": ([8, 6, 16, 16], "float16"), "audio": ([16, 100], "float16")}

    # Sample 0's latents are the encoder's output on its decoded clip, caption passed through.
    src_index = parse_index((source / "shards/shard-000000.index.json").read_bytes(), "src")
    entry = src_index.samples[0]
    tar = (source / "shards/shard-000000.tar").read_bytes()

    def member(ext: str) -> bytes:
        m = entry.members[ext]
        return tar[m.offset : m.offset + m.size]

    assert entry.video is not None and entry.audio is not None
    video = decode_video(member(entry.video.field), fps=8, size=(64, 64), start_s=0.0,
                         clip_seconds=1.0, info=entry.video, resize="crop")  # fmt: skip
    audio = decode_audio(member(entry.audio.field), field=entry.audio.field, sample_rate=16000,
                         channels=1, start_s=0.0, clip_seconds=1.0, info=entry.audio)  # fmt: skip
    expected = TinyAVEncoder(channels=6)(
        {"video": torch.from_numpy(video)[None], "audio": torch.from_numpy(audio)[None]}
    )
    out_index = parse_index((dst / "shards/shard-000000.index.json").read_bytes(), "dst")
    got = out_index.samples[0]
    assert got.key == entry.key and got.latent is not None and got.latent.bucket is None
    out_tar = (dst / "shards/shard-000000.tar").read_bytes()
    stored = load(out_tar[got.members["latent.safetensors"].offset :][
        : got.members["latent.safetensors"].size])  # fmt: skip
    for name in ("video", "audio"):
        assert torch.equal(stored[name], expected[name][0]), name
    caption = out_tar[got.members["txt"].offset :][: got.members["txt"].size]
    assert caption == member("txt")

    # `data inspect` shows the chain: the synthetic source, then this encode.
    shown = stoker_text("data", "inspect", str(dst), "--json", check=True).stdout
    latents = json.loads(shown)["latents"]
    assert latents["lineage"][0] == f"file://{source} (stoker data synth)"
    assert latents["lineage"][1].startswith(f"{dst} (encoded by {TINY}")
    assert latents["buckets"]["(one shape)"]["samples"] == 8
    plain = stoker_text("data", "inspect", str(dst), check=True).stdout  # as docs/data.md
    assert "(encoded by" in plain and "(one shape)" in plain, plain


def test_two_encodes_in_one_process_each_have_their_own_shapes(
    source: Path, tmp_path: Path
) -> None:
    """One encoder, two clip lengths, one process (the Python API, or the suite's):
    the second encode is not held to the first one's latent shapes."""
    whole = encode(source, tmp_path / "whole")
    half = encode(source, tmp_path / "half", "data.clip_seconds=0.5")
    assert whole["samples"] == half["samples"] == 8
    shapes = [manifest_of(tmp_path / n).encoding.shapes[""] for n in ("whole", "half")]
    assert shapes[0]["audio"].shape[-1] == 2 * shapes[1]["audio"].shape[-1]


def test_a_rerun_encodes_only_the_missing_shards_into_the_same_bytes(
    source: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "latents"
    encode(source, dst, "--batch-size", "2")
    before = files(dst)
    (dst / "shards/shard-000002.tar").unlink()
    (dst / "shards/shard-000002.index.json").unlink()
    untouched = ("shards/shard-000001.tar", "shards/shard-000003.index.json")
    kept = {p: os.stat(dst / p).st_mtime_ns for p in untouched}
    again = encode(source, dst, "--batch-size", "2")
    assert again["written"] == 1 and again["samples"] == 8
    assert {p: os.stat(dst / p).st_mtime_ns for p in kept} == kept  # not written again
    assert files(dst) == before
    # Two processes encode the same bytes as one.
    parallel = tmp_path / "parallel"
    encode(source, parallel, "--batch-size", "2", "--workers", "2", in_process=False)
    assert files(parallel) == before


def test_another_encoder_source_or_decode_is_refused(source: Path, tmp_path: Path) -> None:
    dst = tmp_path / "latents"
    first = encode(source, dst)
    message = refused(source, dst, "--args", "seed=1")
    assert "holds latents of another encoder" in message and "what differs: args" in message
    assert first["encoder_identity"][:12] in message and "--restart" in message
    other = tmp_path / "other-src"
    synth_dataset(str(other), clips=2, seconds=1.0, size=(64, 64), seed=5)
    assert "holds latents of another source" in refused(other, dst)
    message = refused(source, dst, "data.resolution=[32,32]")
    assert "decoded with other settings: resolution (64, 64) then, (32, 32) now" in message
    assert manifest_of(dst).encoding.encoder.digest == first["encoder_identity"]  # untouched
    # A folder that holds a data set stoker did not encode is refused too.
    assert "not written by `stoker data encode`" in refused(source, other)
    redone = encode(source, dst, "--args", "seed=1", "--restart")
    assert manifest_of(dst).encoding.encoder.args == {"seed": "1"}
    assert redone["encoder_identity"] != first["encoder_identity"]


def test_a_clip_the_encoder_fails_on_is_skipped_and_reported(source: Path, tmp_path: Path) -> None:
    from tests.data.sample_encoders import FAILS_ON

    dst = tmp_path / "latents"
    summary = encode(source, dst, "--batch-size", "2",
                     encoder="tests.data.sample_encoders:fails_on_one")  # fmt: skip
    assert summary["samples"] == 7
    ((row),) = summary["skipped"]
    assert row["key"] == FAILS_ON and row["shard"] == "shards/shard-000001.tar"
    assert f"ValueError: cannot encode {FAILS_ON}" in row["reason"]
    # The clip that shared its batch was encoded alone, and kept.
    index = parse_index((dst / "shards/shard-000001.index.json").read_bytes(), "dst")
    assert [s.key for s in index.samples] == ["clip-000002"]
    text = stoker_text("data", "encode", str(source), str(dst), "-e",
                       "tests.data.sample_encoders:fails_on_one")  # fmt: skip
    assert text.returncode == 0 and f"skipped 1 sample:\n  shards/shard-000001.tar:{FAILS_ON}" in (
        text.stdout
    )


@pytest.mark.parametrize(
    ("encoder", "says"),
    [
        ("tests.data.sample_encoders:changes_shape", "the encoder's output changed within bucket"),
        ("tests.data.sample_encoders:always_fails",
         "the encoder failed on each of the first 8 samples, the last with RuntimeError: this "
         "encoder has a bug"),
        ("tests.data.sample_encoders:one_row", "returned 'video' as [1, 4] for a batch of 2"),
        ("tests.data.sample_encoders:not_callable", "returned a int, which cannot be called"),
        ("tests.data.no_such_module:build", "no module 'tests.data.no_such_module'"),
    ],
)  # fmt: skip
def test_a_broken_encoder_is_stopped_with_its_error(
    source: Path, tmp_path: Path, encoder: str, says: str
) -> None:
    dst = tmp_path / "latents"
    message = refused(source, dst, "--batch-size", "2", encoder=encoder)
    assert says in " ".join(message.split()), message
    assert not (dst / MANIFEST_NAME).exists()


def test_buckets_are_kept_and_the_loader_streams_latents_by_them(tmp_path: Path) -> None:
    from stoker.config import resolve_config
    from stoker.data.stream.loader import loader_from_config

    media = tmp_path / "media"
    synth_media_files(str(media / "wide"), clips=3, seconds=1.0, size=(32, 64))
    synth_media_files(str(media / "square"), clips=3, seconds=1.0, size=(64, 64), seed=1)
    stoker_text("data", "pack", str(media), str(tmp_path / "packed"), "-w", "1", check=True)
    # The training experiment's buckets (their batch sizes do not matter to an encode).
    buckets = "data.buckets=[{resolution: [64, 64], clip_seconds: 1, batch_size: 2}, " \
              "{resolution: [32, 64], clip_seconds: 1, batch_size: 2}]"  # fmt: skip
    dst = tmp_path / "latents"
    encode(tmp_path / "packed", dst, buckets, "--batch-size", "4")
    shapes = {
        bucket: list(tensors["video"].shape)
        for bucket, tensors in manifest_of(dst).encoding.shapes.items()
    }
    assert shapes == {"64x64x1s": [8, 8, 16, 16], "32x64x1s": [8, 8, 8, 16]}
    shown = json.loads(stoker_text("data", "inspect", str(dst), "--json", check=True).stdout)
    assert {b: r["samples"] for b, r in shown["latents"]["buckets"].items()} == {
        "64x64x1s": 3, "32x64x1s": 3
    }  # fmt: skip
    # The chain: the media folder, the packed set, the latents.
    assert shown["latents"]["lineage"] == [
        f"{media} (media)",
        f"file://{tmp_path / 'packed'} (stoker data pack)",
        f"{dst} (encoded by {TINY}, {shown['latents']['encoder']['digest'][:12]})",
    ]

    # Training config without data.buckets: the loader batches by the encoded buckets.
    cfg = resolve_config(None, [f"data.url={dst}", "data.modalities=[latent]",
                                "data.batch_size=3", "data.num_workers=0"]).config  # fmt: skip
    loader = loader_from_config(cfg, rank=0, world_size=1)
    seen = {}
    for batch in loader.batches(max_batches=4):
        video = batch["latent"]["video"]
        assert video.dtype == torch.float16 and batch["valid"].all()
        seen[batch["bucket"]] = tuple(video.shape[1:])
    assert seen == {"64x64x1s": (8, 8, 16, 16), "32x64x1s": (8, 8, 8, 16)}
    # With train.grad_accum 2, each bucket's global batch (data.batch_size: 4) comes in
    # two loader batches of 2: the trainer passes the global batch, the loader splits it.
    cfg = resolve_config(None, [f"data.url={dst}", "data.modalities=[latent]",
                                "data.batch_size=4", "data.num_workers=0"]).config  # fmt: skip
    loader = loader_from_config(cfg, rank=0, world_size=1, micro_batches=2)
    rows = {len(batch["position"]) for batch in loader.batches(max_batches=4)}
    assert rows == {2}, rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (none on this machine)")
def test_an_encode_on_a_gpu_reports_its_utilisation_and_matches_the_cpu(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # The source clips are written and decoded with PyAV and soundfile, which the GPU
    # machine may lack (scripts/gpu-check blocks them): skip there, before `source`
    # (module-scoped, so set up ahead of any test fixture) tries to make the clips.
    pytest.importorskip("av", reason="makes and decodes the source clips (PyAV not installed)")
    pytest.importorskip("soundfile", reason="makes the source clips' audio (not installed)")
    source: Path = request.getfixturevalue("source")
    from safetensors.torch import load

    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    encode(source, cpu, "--device", "cpu")
    summary = encode(source, gpu, "--device", "cuda")
    assert summary["clips_per_s"] > 0
    import importlib.util

    if importlib.util.find_spec("pynvml") is not None:
        assert summary["gpu_util"] is not None and 0 <= summary["gpu_util"] <= 100
    for root in (cpu, gpu):
        assert (root / MANIFEST_NAME).exists()
    index = parse_index((gpu / "shards/shard-000000.index.json").read_bytes(), "gpu")
    member = index.samples[0].members["latent.safetensors"]

    def latent(root: Path) -> dict[str, torch.Tensor]:
        data = (root / "shards/shard-000000.tar").read_bytes()
        return load(data[member.offset : member.offset + member.size])

    on_cpu, on_gpu = latent(cpu), latent(gpu)
    for name in ("video", "audio"):
        torch.testing.assert_close(on_gpu[name].float(), on_cpu[name].float(), atol=2e-2, rtol=1e-2)


def test_an_encode_task_takes_its_share_stops_between_batches_and_completes_the_set(
    source: Path, tmp_path: Path
) -> None:
    """An array task of `data encode --slurm`, here: its shards from the work file, a stop
    request (exit EXIT_REQUEUE, nothing half-written), the manifest from the last task,
    and an encoder whose code changed since the plan refused."""
    import subprocess
    import sys

    from stoker.data.encode.pipeline import EncodeRequest, prepare
    from stoker.data.encode.shard import DecodeSpec
    from stoker.data.jobs import encode_task
    from stoker.protocol import EXIT_REQUEUE

    local, dst = tmp_path / "local", tmp_path / "dst"
    encode(source, local)
    spec = DecodeSpec(("video", "audio"), 8.0, (64, 64), 1.0, 16000, 1, "crop")
    prepared = prepare(EncodeRequest(str(source), str(dst), TINY, {}, spec))
    assert prepared.pending == [0, 1, 2, 3]
    work = tmp_path / "work.json"
    work.write_text(json.dumps({"groups": [[0], [1, 2, 3]], "batch_size": 8}))

    assert encode_task.run_task(str(dst), str(work), 1, lambda: True) == EXIT_REQUEUE
    assert not list(dst.glob("shards/*"))
    assert encode_task.run_task(str(dst), str(work), 1, lambda: False) == 0
    assert len(list(dst.glob("shards/*.tar"))) == 3 and not (dst / MANIFEST_NAME).exists()
    assert encode_task.run_task(str(dst), str(work), 0, lambda: False) == 0
    assert files(dst) == files(local)  # the last task wrote the manifest

    beyond = subprocess.run(
        [sys.executable, "-m", "stoker.data.jobs.encode_task", str(dst), "--work", str(work),
         "--task", "2"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert beyond.returncode == 1
    assert f"stoker: error: task 2 is not one of the 2 in {work}" in beyond.stderr
    # The plan says another encoder than the one this task builds (its code changed).
    plan = json.loads((dst / "encode-plan.json").read_text())
    plan["encoder"]["digest"] = "0" * 64
    (dst / "encode-plan.json").write_text(json.dumps(plan))
    (dst / "shards" / "shard-000000.index.json").unlink()
    changed = subprocess.run(
        [sys.executable, "-m", "stoker.data.jobs.encode_task", str(dst), "--work", str(work),
         "--task", "0"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert changed.returncode == 1
    assert "not 000000000000 as when the encode was planned" in changed.stderr


def test_slurm_flags_without_slurm_are_refused(source: Path, tmp_path: Path) -> None:
    message = refused(source, tmp_path / "dst", "--wait", "--gpus-per-node", "1")
    assert "--gpus-per-node, --wait apply to a SLURM encode only" in message
    assert not (tmp_path / "dst").exists()  # nothing planned
