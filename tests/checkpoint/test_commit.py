"""COMMIT.json over real DCP saves: what ls lists, what verify catches (a flipped
byte, a truncated or missing shard, a broken record), the fallback warning, and
the same on s3:// against the S3 API server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from stoker.checkpoint import commit as ck
from stoker.checkpoint.train_state import TrainState, state_to_save
from stoker.errors import StokerError
from tests.clirun import stoker_text
from tests.s3_server import S3Server

SHARD = "__0_0.distcp"


def _save(root: Path, step: int) -> Path:
    """A finished DCP save of a training state, not committed."""
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    model(torch.randn(4, 6)).pow(2).mean().backward()
    opt.step()
    sched.step()
    state = TrainState(step, {"samples_consumed": step * 4})
    folder = root / f"step-{step}"
    dcp.save(state_to_save(state, model, opt, sched, rank=0), checkpoint_id=str(folder),
             no_dist=True)  # fmt: skip
    return folder


def _committed(root: Path, step: int) -> Path:
    folder = _save(root, step)
    ck.write_commit(str(folder), step=step, world_size=1, mesh={"dp": 1}, state_hash="abc",
                    extra=None)  # fmt: skip
    return folder


def _flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_commit_records_every_file(tmp_path: Path) -> None:
    folder = _save(tmp_path, 10)
    commit = ck.write_commit(str(folder), step=10, world_size=1, mesh=None, state_hash="h1",
                             extra={"mlflow_run_id": "r1"})  # fmt: skip
    names = [f.path for f in commit.files]
    assert names == sorted(names) and {".metadata", SHARD, "__0_0.distcp"} <= set(names)
    assert ck.COMMIT_NAME not in names
    assert commit.bytes == sum((folder / n).stat().st_size for n in names)
    assert ck.read_commit(str(folder)) == commit
    raw = json.loads((folder / "COMMIT.json").read_text())
    assert raw["format_version"] == ck.FORMAT_VERSION and raw["torch_version"] == torch.__version__
    assert raw["step"] == 10 and raw["config_hash"] == "h1" and raw["world_size"] == 1
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]  # the temp was renamed
    assert ck.verify(str(folder), full=True) == []


def test_commit_refuses_a_folder_without_metadata(tmp_path: Path) -> None:
    folder = _save(tmp_path, 10)
    (folder / ".metadata").unlink()
    with pytest.raises(StokerError, match=r"step-10.*DCP has not finished: no \.metadata"):
        ck.write_commit(str(folder), step=10, world_size=1, mesh=None, state_hash=None,
                        extra=None)  # fmt: skip
    assert ck.read_commit(str(folder)) is None
    with pytest.raises(StokerError, match="no checkpoint folder"):
        ck.write_commit(str(tmp_path / "step-99"), step=99, world_size=1, mesh=None,
                        state_hash=None, extra=None)  # fmt: skip


def test_ls_lists_step_folders_newest_first(tmp_path: Path) -> None:
    _committed(tmp_path, 10)
    _committed(tmp_path, 200)
    _save(tmp_path, 30)  # saved, never committed
    (tmp_path / "step-40").mkdir()  # cut short: a shard, no .metadata
    (tmp_path / "step-40" / SHARD).write_bytes(b"partial")
    (tmp_path / "notes").mkdir()  # not ours
    (tmp_path / "notes" / "x.txt").write_text("keep")
    (tmp_path / "step-7.bak").mkdir()
    rows = ck.list_checkpoints(str(tmp_path))
    assert [(r.step, r.committed) for r in rows] == [
        (200, True), (40, False), (30, False), (10, True)]  # fmt: skip
    assert rows[1].bytes == len(b"partial")
    assert rows[0].path == str(tmp_path / "step-200")
    assert rows[0].bytes == ck.read_commit(rows[0].path).bytes  # type: ignore[union-attr]
    assert (tmp_path / "notes" / "x.txt").read_text() == "keep"
    assert ck.list_checkpoints(str(tmp_path / "absent")) == []


def test_flipped_byte_fails_full_but_passes_quick(tmp_path: Path) -> None:
    folder = _committed(tmp_path, 10)
    _flip_byte(folder / SHARD)
    assert ck.verify(str(folder), full=False) == []
    problems = ck.verify(str(folder), full=True)
    assert [p.file for p in problems] == [SHARD]
    assert "sha256" in str(problems[0]) and "in COMMIT.json" in str(problems[0])


def test_truncated_and_missing_shards_fail_the_quick_check(tmp_path: Path) -> None:
    folder = _committed(tmp_path, 10)
    size = (folder / SHARD).stat().st_size
    (folder / SHARD).write_bytes((folder / SHARD).read_bytes()[:-5])
    (folder / ".metadata").unlink()
    problems = {p.file: str(p) for p in ck.verify(str(folder), full=False)}
    assert problems == {
        SHARD: f"{SHARD}: size {size - 5} != {size} in COMMIT.json",
        ".metadata": ".metadata: missing",
    }


def test_broken_or_absent_commit_record(tmp_path: Path) -> None:
    folder = _committed(tmp_path, 10)
    (folder / "COMMIT.json").write_text('{"step": 10, "files": [')
    with pytest.raises(StokerError, match=r"step-10/COMMIT\.json is not a valid commit record"):
        ck.read_commit(str(folder))
    assert [p.file for p in ck.verify(str(folder), full=False)] == ["COMMIT.json"]
    assert not ck.list_checkpoints(str(tmp_path))[0].committed
    newer = json.loads(ck.read_commit(str(_committed(tmp_path, 20))).to_json())  # type: ignore[union-attr]
    newer["format_version"] = ck.FORMAT_VERSION + 1
    (tmp_path / "step-20" / "COMMIT.json").write_text(json.dumps(newer))
    with pytest.raises(StokerError, match="format version 2 is newer") as exc:
        ck.read_commit(str(tmp_path / "step-20"))
    assert exc.value.fix and "upgrade stoker" in exc.value.fix
    (folder / "COMMIT.json").unlink()
    assert ck.verify(str(folder), full=True)[0].message.startswith("not committed")


def test_newest_verified_falls_back_with_a_warning(tmp_path: Path) -> None:
    _committed(tmp_path, 10)
    _committed(tmp_path, 20)
    newest = _committed(tmp_path, 30)
    _save(tmp_path, 40)  # uncommitted: skipped, said so
    warnings: list[str] = []
    assert ck.newest_verified(str(tmp_path), full=False, warn=warnings.append) == (
        30, str(newest))  # fmt: skip
    assert warnings == ["falling back to step-30: step-40 is broken: not committed: no COMMIT.json"]
    _flip_byte(newest / SHARD)
    warnings.clear()
    assert ck.newest_verified(str(tmp_path), full=True, warn=warnings.append) == (
        20, str(tmp_path / "step-20"))  # fmt: skip
    assert len(warnings) == 2 and all(w.startswith("falling back to step-20: ") for w in warnings)
    assert f"step-30 is broken: {SHARD}: sha256" in warnings[1]
    assert ck.newest_verified(str(tmp_path / "none"), full=True, warn=warnings.append) is None


def test_cli_ls_and_verify(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    _committed(root, 10)
    step20 = _committed(root, 20)
    _save(root, 30)
    listed = stoker_text("ckpt", "ls", str(root), "--json", check=True)
    rows = json.loads(listed.stdout)
    assert [(r["step"], r["committed"]) for r in rows] == [(30, False), (20, True), (10, True)]
    assert set(rows[0]) >= {"step", "path", "committed", "bytes"}
    table = stoker_text("ckpt", "ls", str(root), check=True).stdout
    assert "step-20" in table and "committed" in table

    ok = stoker_text("ckpt", "verify", str(root))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("ok") == 2  # the uncommitted step-30 is not checked
    _flip_byte(step20 / SHARD)
    sizes = stoker_text("ckpt", "verify", str(step20), "--sizes-only")
    assert sizes.returncode == 0  # sizes still match
    bad = stoker_text("ckpt", "verify", str(root))
    assert bad.returncode == 1 and f"step-20: {SHARD}: sha256" in bad.stdout
    assert stoker_text("ckpt", "verify", str(root / "step-30")).returncode == 1  # not committed

    missing = stoker_text("ckpt", "verify", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert stoker_text("ckpt", "ls", str(tmp_path / "nope")).returncode == 2


def _upload(s3: Any, local: Path, url: str) -> None:
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        s3.pipe_file(f"{url}/{path.relative_to(local).as_posix()}", path.read_bytes())


def test_commit_verify_ls_on_s3(tmp_path: Path, s3_env: S3Server) -> None:
    import s3fs

    s3 = s3fs.S3FileSystem()
    root = f"s3://{s3_env.new_bucket()}/run/checkpoints"
    for step in (10, 20):
        _upload(s3, _save(tmp_path, step), f"{root}/step-{step}")
    s3.pipe_file(f"{root}/notes/readme.txt", b"not ours")
    _upload(s3, _save(tmp_path, 30), f"{root}/step-30")
    s3.rm_file(f"{root}/step-30/.metadata")

    with pytest.raises(StokerError, match=r"no \.metadata"):
        ck.write_commit(f"{root}/step-30", step=30, world_size=1, mesh=None, state_hash=None,
                        extra=None)  # fmt: skip
    for step in (10, 20):
        commit = ck.write_commit(f"{root}/step-{step}", step=step, world_size=1, mesh=None,
                                 state_hash=None, extra=None)  # fmt: skip
        assert ck.read_commit(f"{root}/step-{step}") == commit
        assert ck.verify(f"{root}/step-{step}", full=True) == []
    rows = ck.list_checkpoints(root)
    assert [(r.step, r.committed, r.path) for r in rows] == [
        (30, False, f"{root}/step-30"), (20, True, f"{root}/step-20"),
        (10, True, f"{root}/step-10")]  # fmt: skip

    shard = f"{root}/step-20/{SHARD}"
    data = bytearray(s3.cat_file(shard))
    data[100] ^= 0xFF
    s3.pipe_file(shard, bytes(data))
    assert ck.verify(f"{root}/step-20", full=False) == []
    assert [p.file for p in ck.verify(f"{root}/step-20", full=True)] == [SHARD]
    warnings: list[str] = []
    assert ck.newest_verified(root, full=True, warn=warnings.append) == (10, f"{root}/step-10")
    assert [w.split(":")[0] for w in warnings] == ["falling back to step-10"] * 2

    listed = stoker_text("ckpt", "ls", root, "--json", env=s3_env.env, check=True)
    assert [r["step"] for r in json.loads(listed.stdout)] == [30, 20, 10]
    bad = stoker_text("ckpt", "verify", f"{root}/step-20", "--full", env=s3_env.env)
    assert bad.returncode == 1 and SHARD in bad.stdout
    assert (
        stoker_text("ckpt", "verify", f"{root}/step-10", "--full", env=s3_env.env).returncode == 0
    )
