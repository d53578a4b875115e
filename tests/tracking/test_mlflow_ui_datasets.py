"""A run's data sets where a user looks for them: a real `stoker run` into a real `mlflow
server`, the run page in headless Chromium (tests/browser.py). Its Overview shows the
first data set as `name (digest)` with its context, and "+1" for the held-out one; a
click opens MLflow's dataset drawer, which lists both and shows each one's manifest
totals (the profile), digest and path."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from stoker.data.format.shard_format import MANIFEST_NAME, parse_manifest
from stoker.data.synthetic.shapes import synth_dataset
from tests.browser import headless_page
from tests.clirun import stoker

if TYPE_CHECKING:
    from tests.mlflow_server import Server


def test_the_run_page_shows_the_data_sets_with_their_digests(
    isolated_home: Path, tmp_path: Path, mlflow_server: Server
) -> None:
    train, held_out = tmp_path / "train", tmp_path / "held-out"
    # Seeds no other test uses: MLflow keeps one dataset per (name, digest) in an
    # experiment, and the session's server holds other tests' runs: a set of the same
    # content would show the path it was first logged with.
    synth_dataset(str(train), clips=8, seconds=2.0, size=(64, 64), fps=8, seed=5150)
    synth_dataset(str(held_out), clips=4, seconds=2.0, size=(64, 64), fps=8, seed=5151)
    digest = {
        name: parse_manifest((root / MANIFEST_NAME).read_bytes(), str(root)).fingerprint()
        for name, root in (("train", train), ("eval", held_out))
    }
    result = stoker(
        "run", "--nproc", "1", "--json", f"data.url={train}", f"data.eval_url={held_out}",
        f"tracking.uri={mlflow_server.url}", "data.batch_size=2", "data.num_workers=0",
        "train.steps=2", "train.log_every=1", "train.eval_every=2", "train.eval_batches=1",
        "checkpoint.every=2", timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = json.loads(result.stdout.strip().splitlines()[-1])["run_id"]
    printed = re.search(r"^MLflow: (\S+)$", result.stderr, re.MULTILINE)
    assert printed is not None and run_id in printed.group(1), result.stderr

    shot = tmp_path / "dataset-drawer.png"
    with headless_page() as page:
        page.goto(printed.group(1))
        page.get_by_role("tab", name="Overview").first.click()
        train_entry = page.get_by_text(f"train ({digest['train']})", exact=True).first
        train_entry.wait_for(timeout=120_000)
        overview = page.inner_text("body")
        train_entry.click()  # MLflow's dataset drawer: the run's data sets, and one's details
        page.get_by_text("2 datasets used").first.wait_for(timeout=30_000)
        page.get_by_text(re.compile(r"^samples: ?8$")).first.wait_for(timeout=30_000)
        page.screenshot(path=str(shot))
        train_details = page.inner_text("body")
        page.get_by_text(f"eval ({digest['eval']})", exact=True).first.click()
        page.get_by_text(re.compile(r"^samples: ?4$")).first.wait_for(timeout=30_000)
        eval_details = page.inner_text("body")

    where = f"(screenshot: {shot})"
    # The Overview's Datasets: the first with its context (MLflow capitalises the tag),
    # the other behind "+1".
    assert re.search(rf"Datasets\s+train \({digest['train']}\)\s+Training\s+\+1", overview), where
    assert re.search(rf"eval \({digest['eval']}\)\s+Eval", train_details), where
    profile = ("samples: 8", "hours: 0.004444", "shards: 1", "modalities: video, audio, text, meta")
    for shown in (f"Digest: {digest['train']}", f"Path: {train}", "Source type: Local", *profile):
        assert shown in train_details, (shown, where)
    for shown in (f"Digest: {digest['eval']}", f"Path: {held_out}", "hours: 0.002222"):
        assert shown in eval_details, (shown, where)
