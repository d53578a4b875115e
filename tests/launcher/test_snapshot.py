"""The code snapshot runs what the user submitted: the work tree as they see it, frozen.

Every test builds a real git repository in tmp_path and edits it the way users do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stoker.errors import StokerError
from stoker.launcher.launch import snapshot as snapshot_mod
from stoker.launcher.launch.snapshot import Snapshot, snapshot_code


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{var}_NAME", "Test User")
        monkeypatch.setenv(f"GIT_{var}_EMAIL", "test@example.com")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip()


def make_repo(path: Path, files: dict[str, str], *, commit: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    write(path, files)
    if commit:
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", "init")
    return path


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def tree(code_dir: Path) -> dict[str, object]:
    """rel path -> file text or ("link", target), for files and symlinks in a folder."""
    found: dict[str, object] = {}
    for path in sorted(code_dir.rglob("*")):
        rel = path.relative_to(code_dir).as_posix()
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path))
        elif path.is_file():
            found[rel] = path.read_text()
    return found


def tar_tree(tar_path: Path) -> dict[str, object]:
    found: dict[str, object] = {}
    with tarfile.open(tar_path) as tar:
        for m in tar.getmembers():
            if m.issym():
                found[m.name] = ("link", m.linkname)
            else:
                f = tar.extractfile(m)
                assert f is not None
                found[m.name] = f.read().decode()
    return found


def snap(tmp_path: Path, cwd: Path, name: str = "run", **kw: object) -> Snapshot:
    result = snapshot_code(None, tmp_path / name / "code", cwd=cwd, **kw)  # type: ignore[arg-type]
    assert result is not None
    return result


def test_snapshot_is_the_work_tree_as_the_user_sees_it(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "repo",
        {
            "train.py": "v1",
            "staged.py": "v1",
            "removed.py": "x",
            "git_rmed.py": "x",
            "same.py": "same",
            ".gitignore": "*.log\nout/\n",
        },
    )
    head = git(repo, "rev-parse", "HEAD")
    write(repo, {"train.py": "v2 unstaged", "staged.py": "v2 staged"})
    git(repo, "add", "staged.py")
    (repo / "removed.py").unlink()
    git(repo, "rm", "-q", "git_rmed.py")
    write(repo, {"new_script.py": "not added yet", "debug.log": "ignored", "out/ckpt.bin": "big"})

    s = snap(tmp_path, repo)

    assert tree(s.code_dir) == {
        ".gitignore": "*.log\nout/\n",
        "new_script.py": "not added yet",
        "same.py": "same",
        "staged.py": "v2 staged",
        "train.py": "v2 unstaged",
    }
    assert tar_tree(s.tar_path) == tree(s.code_dir)
    assert s.tar_path == tmp_path / "run" / f"code-{s.sha256[:12]}.tar"
    assert (s.repo_root, s.workdir, s.git_commit) == (repo.resolve(), s.code_dir, head)
    assert (s.files, s.total_bytes, s.dirty) == (
        5,
        len("*.log\nout/\nnot added yetsame") + 20,
        True,
    )

    # The user keeps editing after submit: the snapshot does not move.
    write(repo, {"train.py": "v3"})
    assert (s.code_dir / "train.py").read_text() == "v2 unstaged"


def test_clean_repo_is_not_dirty_and_empty_repo_without_commits_works(tmp_path: Path) -> None:
    clean = make_repo(tmp_path / "clean", {"a.py": "a"})
    assert snap(tmp_path, clean, "r1").dirty is False

    empty = make_repo(tmp_path / "empty", {"a.py": "a", "pkg/b.py": "b"}, commit=False)
    git(empty, "add", "a.py")
    s = snap(tmp_path, empty, "r2")
    assert tree(s.code_dir) == {"a.py": "a", "pkg/b.py": "b"}
    assert (s.git_commit, s.dirty) == (None, True)


def test_odd_file_names_survive(tmp_path: Path) -> None:
    names = {"with space.py": "1", "new\nline.txt": "2", "ünïcødé/データ.py": "3", "-dash.py": "4"}
    repo = make_repo(tmp_path / "repo", names)
    write(repo, {"untracked ö\n.py": "5"})
    s = snap(tmp_path, repo)
    expected = {**names, "untracked ö\n.py": "5"}
    assert tree(s.code_dir) == expected
    assert tar_tree(s.tar_path) == expected


def test_symlinks_stay_links_and_exec_bit_is_kept(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"lib/a.py": "a", "run.sh": "#!/bin/sh\n", "plain.py": ""})
    (repo / "run.sh").chmod(0o755)
    (repo / "link.py").symlink_to("lib/a.py")
    (repo / "outside").symlink_to("/etc/hostname")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "links")

    s = snap(tmp_path, repo)

    assert os.readlink(s.code_dir / "link.py") == "lib/a.py"
    assert (s.code_dir / "link.py").read_text() == "a"
    assert os.readlink(s.code_dir / "outside") == "/etc/hostname"
    assert os.access(s.code_dir / "run.sh", os.X_OK)
    assert not os.access(s.code_dir / "plain.py", os.X_OK)
    with tarfile.open(s.tar_path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["link.py"].issym() and members["link.py"].linkname == "lib/a.py"
    assert (members["run.sh"].mode, members["plain.py"].mode) == (0o755, 0o644)
    assert all(
        (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "") for m in members.values()
    )


def test_id_depends_on_content_and_modes_only(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.py": "a", "b/c.py": "c"})
    first = snap(tmp_path, repo, "r1")
    again = snap(tmp_path, repo, "r2")
    assert again.sha256 == first.sha256
    assert again.tar_path.read_bytes() == first.tar_path.read_bytes()

    os.utime(repo / "a.py", (1, 1))
    git(repo, "commit", "-q", "--allow-empty", "-m", "new HEAD, same files")
    touched = snap(tmp_path, repo, "r3")
    assert touched.sha256 == first.sha256
    assert touched.tar_path.read_bytes() == first.tar_path.read_bytes()

    write(repo, {"a.py": "A"})
    edited = snap(tmp_path, repo, "r4")
    assert edited.sha256 != first.sha256
    write(repo, {"a.py": "a"})
    (repo / "a.py").chmod(0o755)
    assert snap(tmp_path, repo, "r5").sha256 not in {first.sha256, edited.sha256}

    # A second repository with the same files has the same id.
    other = make_repo(tmp_path / "other", {"a.py": "a", "b/c.py": "c"})
    assert snap(tmp_path, other, "r6").sha256 == first.sha256


def test_workdir_matches_the_submit_folder(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"exp/sub/train.py": "t", ".gitignore": "outputs/\n"})
    s = snap(tmp_path, repo / "exp" / "sub", "r1")
    assert s.workdir == s.code_dir / "exp" / "sub"
    assert (s.workdir / "train.py").read_text() == "t"
    # Submitting from a folder with no snapshotted files still gives a folder to run in.
    (repo / "outputs" / "today").mkdir(parents=True)
    s = snap(tmp_path, repo / "outputs" / "today", "r2")
    assert s.workdir == s.code_dir / "outputs" / "today"
    assert s.workdir.is_dir()


def test_code_folder_inside_a_repo_honours_gitignore_and_default_skips(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "repo",
        {"other/x.py": "x", "proj/.gitignore": "*.ckpt\n", "proj/m.py": "m", "proj/pkg/n.py": "n"},
    )
    write(
        repo / "proj",
        {
            "new.py": "untracked",
            "model.ckpt": "ignored",
            "pkg/__pycache__/n.cpython-311.pyc": "",
            "old.pyc": "",
            ".venv/lib/site.py": "",
            "node_modules/x/i.js": "",
        },
    )
    s = snapshot_code(repo / "proj", tmp_path / "run" / "code", cwd=repo / "proj" / "pkg")
    assert s is not None
    assert tree(s.code_dir) == {
        ".gitignore": "*.ckpt\n",
        "m.py": "m",
        "new.py": "untracked",
        "pkg/n.py": "n",
    }
    assert s.workdir == s.code_dir / "pkg"
    assert (s.repo_root, s.git_commit, s.dirty) == (
        repo.resolve(),
        git(repo, "rev-parse", "HEAD"),
        True,
    )


def test_code_folder_outside_git(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(
        src,
        {
            "a.py": "a",
            "d/b.py": "b",
            "__pycache__/a.pyc": "",
            "c.pyc": "",
            ".git/HEAD": "",
            ".venv/x": "",
            "node_modules/y": "",
        },
    )
    (src / "lib").symlink_to("d")
    s = snapshot_code(src, tmp_path / "run" / "code", cwd=tmp_path)
    assert s is not None
    assert tree(s.code_dir) == {"a.py": "a", "d/b.py": "b", "lib": ("link", "d")}
    assert (s.repo_root, s.git_commit, s.dirty, s.workdir) == (None, None, False, s.code_dir)


def test_id_of_a_code_folder_ignores_listing_order_and_mtimes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"a.py": "a", "b/c.py": "c", "b/d.py": "d", "z.py": "z"}
    write(tmp_path / "one", files)
    write(tmp_path / "two", dict(reversed(files.items())))
    for path in (tmp_path / "two").rglob("*"):
        os.utime(path, (12345, 12345))
    one = snapshot_code(tmp_path / "one", tmp_path / "r1" / "code", cwd=tmp_path)

    # Directory order is up to the file system (ext4 hashes names, Lustre differs): reverse it.
    real_walk = os.walk

    def reversed_walk(top: Path) -> Iterator[tuple[str, list[str], list[str]]]:
        for root, dirs, names in real_walk(top):
            dirs.reverse()
            yield root, dirs, names[::-1]

    monkeypatch.setattr(os, "walk", reversed_walk)
    two = snapshot_code(tmp_path / "two", tmp_path / "r2" / "code", cwd=tmp_path)
    assert one is not None and two is not None
    assert one.sha256 == two.sha256
    assert one.tar_path.read_bytes() == two.tar_path.read_bytes()


def test_outside_any_repository_there_is_no_snapshot(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    write(folder, {"train.py": "t"})
    assert snapshot_code(None, tmp_path / "run" / "code", cwd=folder) is None
    assert not (tmp_path / "run").exists()


def test_submodules_and_nested_repositories_are_skipped_with_a_note(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.py": "a"})
    make_repo(repo / "vendored", {"v.py": "v"})
    git(repo, "add", "vendored")  # recorded as a gitlink, like a submodule
    git(repo, "commit", "-q", "-m", "gitlink")
    make_repo(repo / "scratch", {"s.py": "s"}, commit=False)  # untracked nested repository
    s = snap(tmp_path, repo)
    assert tree(s.code_dir) == {"a.py": "a"}
    assert any("vendored" in n and "submodule" in n for n in s.notes)
    assert any("scratch/" in n and "nested" in n for n in s.notes)


def test_a_data_set_written_into_the_repository_is_not_copied_into_each_snapshot(
    tmp_path: Path, synthetic_av_set: Callable[..., Path]
) -> None:
    """`stoker data synth d/packed` in a clone, then `stoker submit`: the data set is
    untracked and not ignored, yet no code; the job reads it where it is."""
    repo = make_repo(tmp_path / "repo", {"train.py": "code", "d/README.md": "how it was made"})
    shutil.copytree(synthetic_av_set(clips=8, size=(32, 32), sample_rate=8000), repo / "d/packed")
    s = snap(tmp_path, repo)
    assert tree(s.code_dir) == {"train.py": "code", "d/README.md": "how it was made"}
    assert any("d/packed/" in n and "data set" in n for n in s.notes), s.notes


def test_too_big_names_total_biggest_files_and_fixes(tmp_path: Path) -> None:
    sizes = {"data/huge.bin": 9, "b.bin": 8, "c.bin": 7, "d.bin": 6, "e.bin": 5, "small.py": 1}
    repo = make_repo(tmp_path / "repo", {k: "x" * (v * 1024) for k, v in sizes.items()})
    with pytest.raises(StokerError) as info:
        snap(tmp_path, repo, max_bytes=20 * 1024)
    text = str(info.value)
    assert "36.0 KiB in 6 files" in text and "limit of 20.0 KiB" in text
    assert "data/huge.bin (9.0 KiB)" in text
    for name in ["data/huge.bin", "b.bin", "c.bin", "d.bin", "e.bin"]:
        assert name in text
    assert "small.py" not in text
    assert ".gitignore" in text and "--code" in text and "--no-snapshot" in text
    assert not (tmp_path / "run").exists()


def test_failure_midway_leaves_no_code_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo", {f"f{i}.py": str(i) for i in range(5)})
    real_copy = snapshot_mod._copy_file
    calls = []

    def copy_then_fail(src: Path, dst: Path) -> tuple[str, int]:
        calls.append(src)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real_copy(src, dst)

    monkeypatch.setattr(snapshot_mod, "_copy_file", copy_then_fail)
    with pytest.raises(StokerError, match=r"cannot write the code snapshot.*No space left"):
        snap(tmp_path, repo)
    assert len(calls) == 3
    assert list((tmp_path / "run").iterdir()) == []  # no code/, no tar, no partial leftovers


def test_a_file_that_vanishes_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo", {"a.py": "a"})
    real_list = snapshot_mod._git_files
    # Listed by git, then deleted before it is read: what a job writing into the repo causes.
    monkeypatch.setattr(snapshot_mod, "_git_files", lambda base: [*real_list(base), "gone.log"])
    with pytest.raises(StokerError, match=r"gone\.log vanished"):
        snap(tmp_path, repo)
    assert not (tmp_path / "run" / "code").exists()


def test_existing_code_folder_is_refused(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.py": "a"})
    (tmp_path / "run" / "code").mkdir(parents=True)
    with pytest.raises(StokerError, match="already exists"):
        snap(tmp_path, repo)


def test_the_submitters_bytecode_travels_with_the_code_where_it_matches(tmp_path: Path) -> None:
    """A job's ranks import its modules from the snapshot: Python takes the bytecode
    carried there instead of compiling each module in every rank; an edited module's stale
    bytecode stays behind, and the snapshot's id and tar hold the sources only."""
    import py_compile
    import sys
    from importlib.util import cache_from_source

    sources = {"pkg/__init__.py": "", "pkg/fresh.py": "X = 1\n", "pkg/edited.py": "Y = 1\n"}
    repo = make_repo(tmp_path / "repo", {".gitignore": "__pycache__/\n", **sources})
    bare = snap(tmp_path, repo, name="before-compiling")
    for name in ("__init__", "fresh", "edited"):
        py_compile.compile(str(repo / "pkg" / f"{name}.py"), doraise=True)
    write(repo, {"pkg/edited.py": "Y = 2  # edited after it was compiled\n"})
    git(repo, "commit", "-qam", "edit")

    s = snap(tmp_path, repo, name="run")

    carried = {p.relative_to(s.code_dir).as_posix() for p in s.code_dir.rglob("*.pyc")}
    tag = Path(cache_from_source("m.py")).name.removeprefix("m.")
    assert carried == {f"pkg/__pycache__/__init__.{tag}", f"pkg/__pycache__/fresh.{tag}"}
    # Python's importer accepts the carried bytecode (it checks the copy's time stamp and size).
    imported = subprocess.run(
        [sys.executable, "-S", "-v", "-c", "import pkg.fresh, pkg.edited; print(pkg.edited.Y)"],
        cwd=s.code_dir, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert imported.stdout == "2\n"
    assert f"code object from '{s.code_dir / 'pkg' / '__pycache__' / f'fresh.{tag}'}'" in (
        imported.stderr
    ), imported.stderr[-2000:]
    assert "matches" not in imported.stderr.split("pkg/edited.py")[-1].split("\n")[0]
    # The sources alone make the snapshot's identity and its tar.
    assert not any(name.endswith(".pyc") for name in tar_tree(s.tar_path))
    assert s.files == 4
    write(repo, {"pkg/edited.py": "Y = 1\n"})
    git(repo, "commit", "-qam", "back")
    assert snap(tmp_path, repo, name="again").sha256 == bare.sha256
