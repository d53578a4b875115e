"""Experiment resolution: precedence, typed overrides, errors that point at the source."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.config import (
    ConfigError,
    ExperimentConfig,
    Source,
    load_frozen,
    resolve_config,
    state_hash,
    write_frozen,
)
from stoker.config.keys import field_at, leaf_paths
from stoker.errors import StokerError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_resolve_with_default_sources() -> None:
    resolved = resolve_config()
    assert resolved.config == ExperimentConfig()
    assert resolved.source_of(("train", "steps")) == Source("default")
    assert resolved.profile is None


def test_precedence_default_profile_file_override_flag(tmp_path: Path) -> None:
    profile = write(tmp_path / "profile.yaml", "partition: prof\naccount: acct\nqos: low\n")
    exp = write(tmp_path / "exp.yaml", "job:\n  partition: file\n  qos: high\n  nodes: 3\n")
    resolved = resolve_config(
        exp,
        ["job.partition=over", "job.nodes=4"],
        {"job.partition": ("flagged", "--partition"), "job.time": (None, "--time")},
        profile=profile,
    )
    job = resolved.config.job
    assert (job.partition, job.account, job.qos, job.nodes) == ("flagged", "acct", "high", 4)
    assert job.time == "01:00:00"  # a flag given as None does not override
    assert resolved.source_of(("job", "partition")) == Source("flag", "--partition")
    assert resolved.source_of(("job", "account")) == Source("profile", f"{profile}:2")
    assert resolved.source_of(("job", "qos")) == Source("file", f"{exp}:3")
    assert resolved.source_of(("job", "nodes")) == Source("override", "job.nodes=4")
    assert resolved.source_of(("job", "time")) == Source("default")


def test_profile_from_env_and_default_location(
    tmp_path: Path, isolated_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = write(isolated_home / ".config" / "stoker" / "profile.yaml", "partition: home\n")
    assert resolve_config().config.job.partition == "home"
    env_profile = write(tmp_path / "site.yaml", "partition: site\n")
    monkeypatch.setenv("STOKER_PROFILE", str(env_profile))
    assert resolve_config().config.job.partition == "site"
    assert resolve_config(use_profile=False).config.job.partition is None
    monkeypatch.setenv("STOKER_PROFILE", str(tmp_path / "missing.yaml"))
    with pytest.raises(StokerError, match=r"missing\.yaml names no file"):
        resolve_config()
    assert default.exists()


def test_env_mappings_merge_across_sources(tmp_path: Path) -> None:
    profile = write(tmp_path / "p.yaml", "env:\n  NCCL_DEBUG: WARN\n  NCCL_IB_DISABLE: '1'\n")
    exp = write(tmp_path / "e.yaml", "job:\n  env:\n    NCCL_DEBUG: INFO\n")
    resolved = resolve_config(exp, ["job.env.OMP_NUM_THREADS=4"], profile=profile)
    assert resolved.config.job.env == {
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_DISABLE": "1",
        "OMP_NUM_THREADS": "4",
    }
    assert resolved.source_of(("job", "env", "NCCL_IB_DISABLE")).kind == "profile"
    assert resolved.source_of(("job", "env", "NCCL_DEBUG")) == Source("file", f"{exp}:3")


@pytest.mark.parametrize(
    ("override", "key", "expected"),
    [
        ("train.steps=10", ("train", "steps"), 10),
        ("optim.lr=3e-4", ("optim", "lr"), 3e-4),
        ("optim.lr=0.5", ("optim", "lr"), 0.5),
        ("train.compile=true", ("train", "compile"), True),
        ("train.compile=false", ("train", "compile"), False),
        ("optim.grad_clip=null", ("optim", "grad_clip"), None),
        (
            "job.setup=[module load cuda, echo hi]",
            ("job", "setup"),
            ["module load cuda", "echo hi"],
        ),
        ("data.resolution=[32, 48]", ("data", "resolution"), (32, 48)),
        ("job.time=4:00:00", ("job", "time"), "4:00:00"),
        ("job.time=30", ("job", "time"), "30"),
    ],
)
def test_overrides_are_typed(override: str, key: tuple[str, str], expected: object) -> None:
    section = getattr(resolve_config(overrides=[override]).config, key[0])
    assert getattr(section, key[1]) == expected


def test_equals_sign_inside_a_value_is_kept() -> None:
    resolved = resolve_config(overrides=["job.env.OPTS=--a=b", "tracking.tags.q=x=y"])
    assert resolved.config.job.env["OPTS"] == "--a=b"
    assert resolved.config.tracking.tags["q"] == "x=y"


def test_later_key_inside_an_earlier_scalar_wins() -> None:
    resolved = resolve_config(overrides=["job.env=abc", "job.env.A=1"])
    assert resolved.config.job.env == {"A": "1"}
    with pytest.raises(ConfigError, match=r"job\.env"):
        resolve_config(overrides=["job.env.A=1", "job.env=abc"])


def test_flags_are_checked_like_any_source() -> None:
    with pytest.raises(ConfigError, match=r"flag --nodes: job\.nodes: got 0"):
        resolve_config(flags={"job.nodes": (0, "--nodes")})


def test_yaml_floats_without_a_dot_and_times_with_colons(tmp_path: Path) -> None:
    exp = write(tmp_path / "e.yaml", "optim:\n  lr: 3e-4\njob:\n  time: 4:00:00\n")
    config = resolve_config(exp).config
    assert config.optim.lr == pytest.approx(3e-4)
    assert config.job.time == "4:00:00"  # YAML 1.1 would read 14400 (base 60)


def test_unknown_override_suggests_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config(overrides=["train.stepz=10"])
    text = str(info.value)
    assert "train.stepz" in text and "did you mean train.steps" in text
    assert "override train.stepz=10" in text


def test_bare_leaf_suggests_its_section() -> None:
    with pytest.raises(ConfigError, match=r"did you mean optim\.lr"):
        resolve_config(overrides=["lr=1e-3"])


@pytest.mark.parametrize("bad", ["train.steps", "=3", "train..steps=1", "tr ain.steps=1"])
def test_malformed_override_is_a_clear_error(bad: str) -> None:
    with pytest.raises(StokerError, match=r"KEY=VALUE|dotted key"):
        resolve_config(overrides=[bad])


def test_wrong_type_in_yaml_names_file_line_type_and_allowed_values(tmp_path: Path) -> None:
    exp = write(
        tmp_path / "exp.yaml",
        "job:\n  name: ok\n  nodes: two\nmodel:\n  arch: dit\ntrain:\n  stepz: 5\n",
    )
    with pytest.raises(ConfigError) as info:
        resolve_config(exp)
    problems = {p.key: p for p in info.value.problems}
    assert set(problems) == {"job.nodes", "model.arch", "train.stepz"}  # all, not the first
    assert problems["job.nodes"].where == f"{exp}:3"
    assert "got 'two'" in problems["job.nodes"].message
    assert "an integer >= 1" in problems["job.nodes"].message
    assert problems["model.arch"].where == f"{exp}:5"
    assert problems["model.arch"].message == (
        "got 'dit': 'dit' is neither a built-in model (av_dit, audio_ar) nor an import path "
        "package.module:factory (did you mean av_dit?)"
    )
    assert problems["train.stepz"].where == f"{exp}:7"
    assert problems["train.stepz"].suggestions[0] == "train.steps"


def test_a_misspelled_section_gets_a_suggestion_and_problems_come_in_line_order(
    tmp_path: Path,
) -> None:
    """`trian:` is named with `train`, as a misspelled key is; a bad value above it comes
    first, as the file reads."""
    exp = write(tmp_path / "exp.yaml", "optim:\n  lr: -1\ntrian:\n  steps: 3\n")
    with pytest.raises(ConfigError) as info:
        resolve_config(exp)
    assert [(p.where, p.key) for p in info.value.problems] == [
        (f"{exp}:2", "optim.lr"),
        (f"{exp}:3", "trian"),
    ]
    assert "trian: is not a config key (did you mean train?)" in str(info.value)


def test_bad_value_from_profile_names_the_profile_line(tmp_path: Path) -> None:
    profile = write(tmp_path / "p.yaml", "account: ok\npartition: 'gpu; rm -rf /'\n")
    with pytest.raises(ConfigError) as info:
        resolve_config(profile=profile)
    (problem,) = info.value.problems
    assert (problem.key, problem.where) == ("job.partition", f"{profile}:2")


def test_unknown_profile_key_suggests_profile_keys(tmp_path: Path) -> None:
    profile = write(tmp_path / "p.yaml", "partiton: gpu\n")
    with pytest.raises(ConfigError, match="did you mean partition"):
        resolve_config(profile=profile)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("job.nodes=0", ">= 1"),
        ("job.nodes=-3", ">= 1"),
        ("job.time=1h", "D-HH:MM:SS"),
        ("job.mem=lots", "64G"),
        ("job.name=../../etc", "letters, digits"),
        ("job.name=$(reboot)", "letters, digits"),
        ("job.env.BAD-NAME=1", "environment variable name"),
        ("optim.lr=fast", "a number"),
        ("data.resolution=[64]", "a list of 2 values"),
        ("job=3", "is a section"),
        ("data.buckets=[{batch_size: 2}]", "data.buckets[0].clip_seconds: expected"),
        ("data.sources=[{url: x}, {name: a b, url: y}]", "data.sources[1].name: got 'a b'"),
        (
            "data.sources=[{name: a, url: /x}, {name: a, url: /y}]",
            "data.sources[0] (/x) and data.sources[1] (/y) are both named 'a'",
        ),
        (
            "data.sources=[{url: s3://one/speech}, {url: '/s/two/speech/', weight: 2}]",
            "data.sources[0] (s3://one/speech) and data.sources[1] (/s/two/speech/) are both "
            "named 'speech': give one of them another name",
        ),
        ("data.sources=[{url: 's3://b/{a..b}'}]", "its url 's3://b/{a..b}' ('{a..b}') cannot"),
        ("data.buckets=[{clip_seconds: 1}]", "needs data.batch_tokens"),
        (
            "data.buckets=[{clip_seconds: 1, batch_size: 2}, {clip_seconds: 1, batch_size: 4}]",
            "two buckets share",
        ),
    ],
)
def test_invalid_values_are_rejected(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config(overrides=[override])
    assert fragment in str(info.value)
    assert f"override {override}" in str(info.value)


def test_a_source_without_a_name_is_named_by_its_urls_last_part(tmp_path: Path) -> None:
    experiment = write(
        tmp_path / "mix.yaml",
        "data:\n  sources:\n    - url: s3://bucket/sets/speech/\n      weight: 3\n"
        "    - {url: /data/music, name: tunes}\n    - url: file:///d/noise?anon=1\n",
    )
    sources = resolve_config(experiment).config.data.sources
    assert [(s.name, s.url, s.weight) for s in sources] == [
        ("speech", "s3://bucket/sets/speech/", 3.0),
        ("tunes", "/data/music", 1.0),
        ("noise", "file:///d/noise?anon=1", 1.0),
    ]


def test_relative_paths_are_relative_to_where_they_were_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job runs from its code snapshot on another node: what it reads is the folder the
    user meant, as an absolute path in the frozen config. A file's paths are relative to
    its folder, an override's to the current one; URLs and absolute paths stay."""
    write(
        tmp_path / "exps" / "av.yaml",
        "data:\n  sources:\n    - url: ../d/speech\n    - url: s3://bucket/music\n"
        "    - url: /data/noise\n  eval_url: held-out\ncheckpoint:\n  root: ckpt\n",
    )
    monkeypatch.chdir(write(tmp_path / "repo" / "x", "").parent)
    resolved = resolve_config(Path("../exps/av.yaml"), ["data.eval_url=../d/held-out"])
    config = resolved.config
    assert [s.url for s in config.data.sources] == [
        str(tmp_path / "d" / "speech"),
        "s3://bucket/music",
        "/data/noise",
    ]
    assert config.data.eval_url == str(tmp_path / "d" / "held-out")  # the override's
    assert config.checkpoint.root == str(tmp_path / "exps" / "ckpt")
    assert str(resolved.source_of(("data", "eval_url"))) == "override data.eval_url=../d/held-out"
    frozen = write_frozen(resolved, tmp_path / "run" / "config.yaml")
    monkeypatch.chdir(tmp_path / "run")  # as the job reads it, from elsewhere
    assert load_frozen(frozen) == config
    assert resolve_config(None, ["data.url=~/sets/av"]).config.data.url == str(
        Path.home() / "sets" / "av"
    )


def test_yaml_syntax_error_and_duplicate_keys_report_the_line(tmp_path: Path) -> None:
    broken = write(tmp_path / "broken.yaml", "job:\n  nodes: 2\n   name: x\n")
    with pytest.raises(StokerError, match=r"broken.yaml:3: experiment file is not valid YAML"):
        resolve_config(broken)
    twice = write(tmp_path / "twice.yaml", "train:\n  steps: 1\n  steps: 2\n")
    with pytest.raises(StokerError, match=r"twice.yaml:3: .* sets train.steps twice"):
        resolve_config(twice)
    # A character YAML refuses: the reader names no line; the error does.
    control = write(tmp_path / "control.yaml", "train:\n  steps: 2\njob:\n  name: a\x01b\n")
    with pytest.raises(StokerError) as refused:
        resolve_config(control)
    assert f"{control}:4: experiment file is not valid YAML" in refused.value.message
    assert "'\\x01' (U+0001)" in refused.value.message
    assert 'the escape "\\x01" inside a double-quoted string' in (refused.value.fix or "")
    listed = write(tmp_path / "list.yaml", "- a\n- b\n")
    with pytest.raises(StokerError, match="must be a mapping"):
        resolve_config(listed)
    with pytest.raises(StokerError, match="does not exist"):
        resolve_config(tmp_path / "nope.yaml")


def test_empty_file_is_the_defaults(tmp_path: Path) -> None:
    assert resolve_config(write(tmp_path / "e.yaml", "")).config == ExperimentConfig()


def test_frozen_config_round_trips_exactly(tmp_path: Path) -> None:
    resolved = resolve_config(
        EXAMPLES / "tiny.yaml",
        ["optim.lr=3e-4", "job.env.NAME=1e5", "job.time=4:00:00", "tracking.tags.team=av"],
    )
    frozen = write_frozen(resolved, tmp_path / "run" / "config.yaml")
    assert frozen.read_text().startswith("# Frozen by stoker")
    assert load_frozen(frozen) == resolved.config
    assert not list(frozen.parent.glob(".*tmp"))  # the temporary file was renamed away


def test_frozen_config_ignores_the_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    frozen = write_frozen(resolve_config(), tmp_path / "config.yaml")
    monkeypatch.setenv("STOKER_PROFILE", str(write(tmp_path / "p.yaml", "partition: other\n")))
    assert load_frozen(frozen).job.partition is None


def test_every_key_has_a_one_line_description() -> None:
    paths = leaf_paths(ExperimentConfig)
    assert len(paths) > 40
    for path in paths:
        info = field_at(ExperimentConfig, path)
        assert info is not None and info.description, f"{'.'.join(path)} has no description"
        assert "\n" not in info.description, f"{'.'.join(path)}: description spans lines"


def test_keys_the_launcher_and_runtime_read_exist() -> None:
    for key in (
        "train.steps",
        "checkpoint.every",
        "checkpoint.root",
        "checkpoint.async",
        "checkpoint.keep_last",
        "checkpoint.keep_every",
        "job.max_requeues",
    ):
        assert field_at(ExperimentConfig, key.split(".")) is not None, key


def test_examples_validate() -> None:
    for example in sorted(EXAMPLES.glob("*.yaml")):
        resolve_config(example, use_profile=False)


def test_tasks_per_node_follows_gpus() -> None:
    assert resolve_config(overrides=["job.gpus_per_node=4"]).config.job.tasks_per_node == 4
    assert resolve_config().config.job.tasks_per_node == 1
    over = resolve_config(overrides=["job.gpus_per_node=4", "job.ntasks_per_node=1"])
    assert over.config.job.tasks_per_node == 1


def test_stoker_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, isolated_home: Path) -> None:
    from stoker.home import stoker_home

    monkeypatch.delenv("STOKER_HOME")
    assert stoker_home() == isolated_home / ".stoker"
    monkeypatch.setenv("STOKER_HOME", str(tmp_path / "state"))
    assert stoker_home() == tmp_path / "state"


def test_state_hash_covers_only_what_a_checkpoint_holds() -> None:
    base = state_hash(resolve_config().config)
    assert len(base) == 16 and int(base, 16) >= 0
    # Resources, tracking and checkpoint placement may change between a save and a resume.
    for other in ("job.nodes=4", "tracking.experiment=x", "checkpoint.every=7"):
        assert state_hash(resolve_config(overrides=[other]).config) == base, other
    for other in ("train.seed=1", "optim.lr=1e-3", "data.fps=4", "model.size=small"):
        assert state_hash(resolve_config(overrides=[other]).config) != base, other


def test_package_names_resolve_to_their_home_module() -> None:
    import stoker.config as package

    for name in package.__all__:
        home = importlib.import_module(f"stoker.config.{package._HOME[name]}")
        assert getattr(package, name) is getattr(home, name), name
    assert sorted(package.__all__) == sorted(package._HOME)
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = package.no_such_name


def test_importing_the_package_is_light() -> None:
    # Login-node code imports stoker.config submodules; the package itself costs nothing.
    code = "import sys, stoker.config; print(sorted({'pydantic', 'yaml'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_a_mixture_replaces_data_url() -> None:
    with pytest.raises(ConfigError, match=r"data\.url and data\.sources are both set"):
        resolve_config(overrides=["data.url=/a", "data.sources=[{name: b, url: /b}]"])
    cfg = resolve_config(overrides=["data.sources=[{name: b, url: /b, weight: 3}]"]).config
    assert cfg.data.url is None and cfg.data.sources[0].weight == 3.0
