"""`stoker ckpt export` over a real sharded save: the tiny av_dit trained one
step by 2 FSDP2 ranks (tests/checkpoint/fsdp2_save.py on tests/local_ranks.py,
gloo). Both formats load into a fresh unwrapped model with strict=True and give
the trained model's outputs exactly; the refusals (uncommitted, a flipped byte
under --full, OUT exists, no model tensors); the CLI; the same from and to s3://."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from stoker.checkpoint import commit as ck
from stoker.checkpoint.export import export_weights, read_weights
from stoker.config import resolve_config
from stoker.errors import StokerError
from stoker.runtime.models import AVDiT, build_model
from tests import local_ranks
from tests.clirun import stoker_text
from tests.s3_server import S3Server

SAVE = Path(__file__).with_name("fsdp2_save.py")
TINY = Path(str(resources.files("stoker.runtime") / "tiny.yaml"))
STEP = 3


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One thread: these shapes run as fast on one as on two, and 10x faster
    on one when other processes load the machine (tests/runtime/conftest.py)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass(frozen=True)
class Trained:
    folder: Path
    """The committed step-<STEP> folder the 2 ranks wrote."""
    reference: dict[str, Any]
    """fsdp2_save.py's full state dict, fixed input, and the sharded model's outputs on it."""

    def copy_to(self, root: Path, step: int = STEP) -> Path:
        """The checkpoint under another root, as step-<step>: tests may break their copy."""
        return Path(shutil.copytree(self.folder, root / f"step-{step}"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    base = tmp_path_factory.mktemp("fsdp2")
    command = local_ranks.command(2, SAVE, str(base / "checkpoints"), str(STEP),
                                  str(base / "reference.pt"))  # fmt: skip
    result = subprocess.run(
        command,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    folder = base / "checkpoints" / f"step-{STEP}"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "COMMIT.json"} <= {
        p.name for p in folder.iterdir()
    }
    return Trained(folder, torch.load(base / "reference.pt", weights_only=True))


def fresh_model() -> AVDiT:
    """The tiny av_dit as inference code builds it: unwrapped, its own random init."""
    cfg = resolve_config(TINY, use_profile=False).config
    torch.manual_seed(1234)
    model = build_model(cfg.model, cfg.data)
    assert isinstance(model, AVDiT)
    return model


def assert_trained_outputs(state: dict[str, torch.Tensor], reference: dict[str, Any]) -> None:
    model = fresh_model()
    model.load_state_dict(state, strict=True)
    with torch.no_grad():
        velocity = model.velocity(reference["x_t"], reference["t"])
        loss = model.loss(reference["batch"], torch.Generator().manual_seed(3))
    # fp32 on CPU: the same kernels on the same values, so equal to the last bit.
    assert velocity.keys() == reference["velocity"].keys()
    for name, value in velocity.items():
        assert torch.equal(value, reference["velocity"][name]), name
    assert torch.equal(loss, reference["loss"])


def _flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_both_formats_load_into_a_fresh_model_with_the_trained_outputs(
    trained: Trained, tmp_path: Path
) -> None:
    expected = trained.reference["state"]
    out = tmp_path / "weights" / "model.safetensors"  # the parent is made
    result = export_weights(str(trained.folder), str(out))
    assert (result.step, result.source, result.out, result.format) == (
        STEP, str(trained.folder), str(out), "safetensors")  # fmt: skip
    assert result.tensors == len(expected) and result.dtypes == ("float32",)
    assert result.bytes == sum(t.numel() * 4 for t in expected.values())
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "step": str(STEP), "stoker_format": "1",
                                "weights": "model"}  # fmt: skip
    umask = os.umask(0o022)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # readable as any file of the user's
    state = load_file(str(out))
    assert state.keys() == expected.keys()  # plain FQNs: no "model.", no FSDP prefixes
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    assert_trained_outputs(state, trained.reference)

    pt = tmp_path / "model.pt"
    assert export_weights(str(trained.folder), str(pt), fmt="torch").tensors == len(expected)
    plain = torch.load(pt, weights_only=True)
    assert type(plain) is dict and plain.keys() == expected.keys()
    assert_trained_outputs(plain, trained.reference)
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        "model.pt", "model.safetensors", "weights"]  # no temp file left  # fmt: skip


def test_ema_weights_replace_the_averaged_ones(trained: Trained, tmp_path: Path) -> None:
    """--ema: the average of 2 FSDP2 shards, whole, in place of every parameter;
    buffers and the rest as the model's."""
    expected, ema = trained.reference["state"], trained.reference["ema"]
    out = tmp_path / "ema.safetensors"
    export_weights(str(trained.folder), str(out), weights="ema")
    state = load_file(str(out))
    assert state.keys() == expected.keys() and ema.keys() <= expected.keys()
    for key, tensor in state.items():
        assert torch.equal(tensor, ema.get(key, expected[key])), key
    # decay 0.5 over one step: halfway between the initial and the trained weights.
    assert any(not torch.equal(ema[k], expected[k]) for k in ema)
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata()["weights"] == "ema"
    cfg = resolve_config(TINY, use_profile=False).config
    build_model(cfg.model, cfg.data).load_state_dict(state, strict=True)

    result = stoker_text("ckpt", "export", str(trained.folder), str(tmp_path / "m.safetensors"),
                    "--ema", "--json", check=True)  # fmt: skip
    assert json.loads(result.stdout)["tensors"] == len(expected)


def test_dtype_casts_floating_tensors(trained: Trained, tmp_path: Path) -> None:
    out = tmp_path / "model.bf16.safetensors"
    result = export_weights(str(trained.folder), str(out), dtype="bf16", verify="full")
    assert result.dtypes == ("bfloat16",)
    assert result.bytes == sum(t.numel() * 2 for t in trained.reference["state"].values())
    state = load_file(str(out))
    for key, value in trained.reference["state"].items():
        assert torch.equal(state[key], value.to(torch.bfloat16)), key


def test_a_root_exports_its_newest_verified_checkpoint(trained: Trained, tmp_path: Path) -> None:
    trained.copy_to(tmp_path)
    newer = trained.copy_to(tmp_path, STEP + 2)
    (newer / "COMMIT.json").unlink()  # a save cut short before its commit
    warnings: list[str] = []
    result = export_weights(str(tmp_path), str(tmp_path / "m.safetensors"), warn=warnings.append)
    assert (result.step, result.source) == (STEP, str(tmp_path / f"step-{STEP}"))
    assert warnings == [
        f"falling back to step-{STEP}: step-{STEP + 2} is broken: not committed: no COMMIT.json"
    ]

    only_broken = tmp_path / "other"
    only_broken.mkdir()
    newer.rename(only_broken / newer.name)
    with pytest.raises(StokerError, match=r"no checkpoint under .*other' verifies: step-5 is "
                       r"broken: not committed") as exc:  # fmt: skip
        export_weights(str(only_broken), str(tmp_path / "n.safetensors"), warn=warnings.append)
    assert exc.value.fix and "stoker ckpt verify" in exc.value.fix
    (tmp_path / "empty").mkdir()
    with pytest.raises(StokerError, match="verifies: it has no step-<N> folder"):
        export_weights(str(tmp_path / "empty"), str(tmp_path / "n.safetensors"))


def test_refuses_an_uncommitted_or_corrupt_checkpoint(trained: Trained, tmp_path: Path) -> None:
    folder = trained.copy_to(tmp_path)
    out = tmp_path / "model.safetensors"
    (folder / "COMMIT.json").unlink()
    with pytest.raises(StokerError, match=r"step-3' is not committed: no COMMIT\.json") as exc:
        export_weights(str(folder), str(out))
    assert exc.value.fix and "stoker ckpt ls" in exc.value.fix

    shutil.rmtree(folder)
    folder = trained.copy_to(tmp_path)
    _flip_byte(folder / "__1_0.distcp")
    with pytest.raises(StokerError, match=r"does not verify .*: __1_0\.distcp: sha256 \w+ != "):
        export_weights(str(folder), str(out), verify="full")
    (folder / "__0_0.distcp").write_bytes(b"cut")
    with pytest.raises(StokerError, match=r"__0_0\.distcp: size 3 != \d+ in COMMIT\.json"):
        export_weights(str(folder), str(out))  # quick: sizes only
    assert not out.exists()
    # Deleted after the check (a live run's retention): DCP's wrapped error, unwrapped.
    (folder / "__0_0.distcp").unlink()
    with pytest.raises(StokerError, match=r"lost a file while it was read: .*__0_0\.distcp"):
        read_weights(str(folder), None)


def test_a_flipped_byte_is_refused_unasked_naming_both_hashes_and_the_earlier_step(
    trained: Trained, tmp_path: Path
) -> None:
    """One flipped byte in a shard of the newest step: `ckpt export` with no flag
    refuses it (the sha256 of what it reads), naming the file, the hash COMMIT.json
    records and the one read, and the earlier step; `ckpt verify` with no flag fails
    too (--sizes-only is the fast check that misses it); the root exports the earlier
    step with a warning."""
    root = tmp_path / "checkpoints"
    trained.copy_to(root)
    newer = trained.copy_to(root, STEP + 2)
    _flip_byte(newer / "__1_0.distcp")
    commit = ck.read_commit(str(newer))
    assert commit is not None
    recorded = next(f.sha256 for f in commit.files if f.path == "__1_0.distcp")
    read = hashlib.sha256((newer / "__1_0.distcp").read_bytes()).hexdigest()
    out = tmp_path / "model.safetensors"

    bad = stoker_text("ckpt", "export", str(newer), str(out))
    assert bad.returncode == 2 and not out.exists()
    error = " ".join(bad.stderr.split())  # the terminal may wrap the message
    assert f"__1_0.distcp: sha256 {read} != {recorded} in COMMIT.json" in error, error
    assert f"export the earlier step-{STEP} ({root / f'step-{STEP}'})" in error

    verify = stoker_text("ckpt", "verify", str(newer))
    assert verify.returncode == 1 and "__1_0.distcp: sha256" in verify.stdout
    assert stoker_text("ckpt", "verify", str(newer), "--sizes-only").returncode == 0

    done = stoker_text("ckpt", "export", str(root), str(out), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["step"] == STEP
    assert f"step-{STEP + 2} is broken: __1_0.distcp: sha256" in done.stderr


def test_out_and_argument_errors(trained: Trained, tmp_path: Path) -> None:
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"old")
    with pytest.raises(StokerError, match=r"model\.safetensors' exists") as exc:
        export_weights(str(trained.folder), str(out))
    assert exc.value.fix and "--force" in exc.value.fix
    assert out.read_bytes() == b"old"
    export_weights(str(trained.folder), str(out), force=True)
    assert load_file(str(out)).keys() == trained.reference["state"].keys()

    with pytest.raises(StokerError, match="is a folder"):
        export_weights(str(trained.folder), str(tmp_path), force=True)
    with pytest.raises(StokerError, match="format 'onnx' is not one of safetensors, torch"):
        export_weights(str(trained.folder), str(tmp_path / "m"), fmt="onnx")  # type: ignore[arg-type]
    with pytest.raises(StokerError, match="dtype 'int8' is not one of bf16, fp16, fp32"):
        export_weights(str(trained.folder), str(tmp_path / "m"), dtype="int8")
    with pytest.raises(StokerError, match="does not exist"):
        export_weights(str(tmp_path / "step-9"), str(tmp_path / "m"))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_refuses_a_checkpoint_without_model_tensors(tmp_path: Path) -> None:
    from torch.distributed.checkpoint import state_dict_saver

    folder = tmp_path / "step-1"
    state = {"optim": {"lr": torch.ones(2)}, "train": "{}"}
    state_dict_saver.save(state, checkpoint_id=str(folder), no_dist=True)
    ck.write_commit(str(folder), step=1, world_size=1)
    with pytest.raises(StokerError, match=r"no model tensors: no key starts with 'model\.' "
                       r"\(its keys start with optim, train\)"):  # fmt: skip
        export_weights(str(folder), str(tmp_path / "m.safetensors"))


def test_cli(trained: Trained, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    folder = trained.copy_to(root)
    out = tmp_path / "model.pt"
    done = stoker_text("ckpt", "export", str(root), str(out), "--format", "torch",
                       "--dtype", "fp16", "--full", "--json", check=True)  # fmt: skip
    assert json.loads(done.stdout) == {
        "step": STEP, "source": str(folder), "out": str(out), "format": "torch",
        "tensors": len(trained.reference["state"]), "dtypes": ["float16"],
        "bytes": sum(t.numel() * 2 for t in trained.reference["state"].values())}  # fmt: skip
    state = torch.load(out, weights_only=True)
    assert all(t.dtype == torch.float16 for t in state.values())

    again = stoker_text("ckpt", "export", str(folder), str(out))
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr
    # docs/runtime.md's synopsis, every option: over an export that is there.
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"an older export")
    done = stoker_text("ckpt", "export", str(folder), str(weights), "--format", "safetensors",
                       "--dtype", "bf16", "--full", "--force", "--json", check=True)  # fmt: skip
    assert json.loads(done.stdout)["dtypes"] == ["bfloat16"]
    assert {t.dtype for t in load_file(weights).values()} == {torch.bfloat16}
    _flip_byte(folder / "__0_0.distcp")
    bad = stoker_text("ckpt", "export", str(folder), str(out), "--force", "--full")
    assert bad.returncode == 2 and "__0_0.distcp: sha256" in bad.stderr
    (folder / "COMMIT.json").unlink()
    uncommitted = stoker_text("ckpt", "export", str(folder), str(tmp_path / "x.safetensors"))
    assert uncommitted.returncode == 2 and "is not committed" in uncommitted.stderr
    assert not (tmp_path / "x.safetensors").exists()
    assert torch.load(out, weights_only=True).keys() == state.keys()  # left as it was


def test_export_from_and_to_s3(trained: Trained, tmp_path: Path, s3_env: S3Server) -> None:
    import s3fs

    s3 = s3fs.S3FileSystem()
    bucket = s3_env.new_bucket()
    root = f"s3://{bucket}/run/checkpoints"
    s3.put(str(trained.folder), f"{root}/step-{STEP}", recursive=True)
    assert {p.rsplit("/", 1)[-1] for p in s3.find(f"{root}/step-{STEP}")} == {
        p.name for p in trained.folder.iterdir()
    }
    local = tmp_path / "model.safetensors"
    result = export_weights(f"{root}/step-{STEP}", str(local), verify="full")
    assert result.source == f"{root}/step-{STEP}"
    assert_trained_outputs(load_file(str(local)), trained.reference)

    # A root on S3 to an object on S3: the newest verified, one PUT.
    out = f"s3://{bucket}/exports/model.safetensors"
    assert export_weights(root, out).source == f"{root}/step-{STEP}"
    # Not the bytes: safetensors writes its metadata's keys in a varying order.
    s3.get_file(out, str(tmp_path / "from-s3.safetensors"))
    fetched, expected = load_file(str(tmp_path / "from-s3.safetensors")), load_file(str(local))
    assert fetched.keys() == expected.keys()
    assert all(torch.equal(fetched[k], expected[k]) for k in expected)
    assert s3.find(f"s3://{bucket}/exports") == [out.removeprefix("s3://")]
    exists = stoker_text("ckpt", "export", root, out, env=s3_env.env)
    assert exists.returncode == 2 and f"{out}' exists" in exists.stderr

    # `stoker sample` on the root in the bucket alone: the experiment comes with the
    # checkpoint (its commit's config.yaml), no run folder, no --config.
    sampled = stoker_text("sample", root, "--seed", "3", "--steps", "1", "--device", "cpu",
                          "--out", str(tmp_path / "clips"), "--json", env=s3_env.env)  # fmt: skip
    assert sampled.returncode == 0, sampled.stderr[-2000:]
    assert json.loads(sampled.stdout)["checkpoint"] == f"{root}/step-{STEP}"
    assert (tmp_path / "clips" / "seed-3.mp4").stat().st_size > 0


def _with_precision(experiment_yaml: str, precision: str) -> str:
    """The experiment file's text with train.precision set."""
    import yaml

    doc = yaml.safe_load(experiment_yaml)
    doc.setdefault("train", {})["precision"] = precision
    return yaml.safe_dump(doc, sort_keys=False)


def test_stoker_sample_draws_from_a_two_rank_checkpoint_in_one_process(
    trained: Trained, tmp_path: Path
) -> None:
    """`stoker sample` on the 2 FSDP2 ranks' checkpoint: the EMA's weights by default,
    the clips those weights give when loaded whole, the same files for the same seed."""
    from stoker.runtime.sampling.draw import sample_model
    from stoker.runtime.sampling.files import write_samples

    out = tmp_path / "clips"
    # No run folder and no --config: the experiment is the one the checkpoint carries
    # (config.yaml in its commit), tiny.yaml in fp32. fp32 in both processes:
    # `train.precision: auto` samples in bf16 on a CPU with native bf16, and this test
    # compares the command's bytes with in-process fp32 sampling.
    args = ["sample", str(trained.folder), "--seed", "3", "--seed", "4",
            "--steps", "2", "--method", "euler", "--device", "cpu"]  # fmt: skip
    result = json.loads(stoker_text(*args, "--out", str(out), "--json", check=True).stdout)
    assert (result["step"], result["weights"]) == (STEP, "ema")
    assert result["files"] == ["seed-3.mp4", "seed-4.mp4", "contact.png", "samples.json"]

    config = tmp_path / "tiny-fp32.yaml"
    config.write_text(_with_precision(TINY.read_text(), "fp32"))
    cfg = resolve_config(config, use_profile=False).config
    assert cfg.train.precision == "fp32"
    model = build_model(cfg.model, cfg.data)
    model.load_state_dict({**trained.reference["state"], **trained.reference["ema"]})
    expected = sample_model(model, seeds=[3, 4], steps=2, method="euler")
    write_samples(expected, [3, 4], tmp_path / "expected", fps=cfg.data.fps,
                  sample_rate=cfg.data.sample_rate)  # fmt: skip
    for name in ("seed-3.mp4", "seed-4.mp4"):
        assert (out / name).read_bytes() == (tmp_path / "expected" / name).read_bytes()

    trained_weights = tmp_path / "trained"
    stoker_text(*args, "--weights", "model", "--out", str(trained_weights), check=True)
    assert (trained_weights / "seed-3.mp4").read_bytes() != (out / "seed-3.mp4").read_bytes()

    # A checkpoint committed without its experiment (an older stoker): --config.
    older = trained.copy_to(tmp_path / "older")
    (older / "config.yaml").unlink()
    (older / "COMMIT.json").unlink()
    ck.write_commit(str(older), step=STEP, world_size=2, mesh={"shard": 2})
    failed = stoker_text("sample", str(older), "--out", str(tmp_path / "x"))
    assert failed.returncode != 0 and "carries no config.yaml" in failed.stderr
    assert "pass the experiment file that trained it with --config" in failed.stderr
    stoker_text(*args[:1], str(older), *args[2:], "--config", str(config),
                "--out", str(tmp_path / "given"), check=True)  # fmt: skip
    assert (tmp_path / "given" / "seed-3.mp4").read_bytes() == (out / "seed-3.mp4").read_bytes()
