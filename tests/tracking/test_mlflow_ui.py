"""What a user sees when opening the link `stoker run` prints: a real `mlflow server`, a
real (short) training run, the page in headless Chromium (tests/browser.py). The run
opens in MLflow's model-training layout (not the GenAI one: traces, agent versions) and
its first screen shows the loss chart; the throughput, step-time and checkpoint charts
are on the System metrics tab, not above the loss (the issue-17 report: the loss was the
last section, about 5,000 pixels down). The samples drawn every train.sample_every steps
play in the run's artifact view: a video element Chromium loads the clip's frames into."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from stoker.data.synthetic.shapes import synth_dataset
from tests.browser import headless_page
from tests.clirun import stoker

if TYPE_CHECKING:
    from tests.mlflow_server import Server

WIDTH, HEIGHT = 1440, 900  # a laptop's browser window
CARD_PX = 360  # a chart card's height in MLflow 3's run page


def test_the_printed_link_opens_on_the_loss_in_the_training_layout(
    isolated_home: Path, tmp_path: Path, mlflow_server: Server
) -> None:
    data = tmp_path / "data"
    synth_dataset(str(data), clips=8, seconds=2.0, size=(64, 64), fps=8)
    result = stoker(
        "run", "--nproc", "1", "--json", f"data.url={data}", f"tracking.uri={mlflow_server.url}",
        "data.batch_size=2", "data.num_workers=0", "train.steps=20", "train.log_every=5",
        "checkpoint.every=10", "train.sample_every=10", "train.sample_seeds=[0,1]",
        "train.sample_steps=2", timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = json.loads(result.stdout.strip().splitlines()[-1])["run_id"]
    printed = re.search(r"^MLflow: (\S+)$", result.stderr, re.MULTILINE)
    assert printed is not None, result.stderr
    link = printed.group(1)
    assert link.startswith(f"{mlflow_server.url}/#/experiments/") and run_id in link

    shot = tmp_path / "run-page.png"
    with headless_page(WIDTH, HEIGHT) as page:
        page.goto(link)
        # The charts come after the run's metrics are fetched: wait for the loss's card.
        loss = page.get_by_text("loss", exact=True).first
        loss.wait_for(timeout=120_000)
        # Drawn with its data: the legend names the run's series (MLflow polls for
        # ever, so the network is never idle).
        page.get_by_text(re.compile(r"\(loss\)$")).first.wait_for(timeout=60_000)
        page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)  # a curve drawn
        page.screenshot(path=str(shot))
        box = loss.bounding_box()
        body = page.inner_text("body")
        sections = _sections(body)
        agent_versions = page.get_by_text("Agent versions", exact=True).count()

        page.get_by_text("System metrics", exact=True).first.click()
        # (Charts below the fold are drawn when scrolled to; the sections are there.)
        page.get_by_text("system/throughput", exact=True).first.wait_for(timeout=60_000)
        system_sections = _sections(page.inner_text("body"))

        # A sample clip in the artifact view: a <video> that plays it.
        page.goto(f"{link.split('/runs/')[0]}/runs/{run_id}/artifacts/samples/step-20/seed-1.mp4")
        video = page.locator("video").first
        video.wait_for(timeout=120_000)
        # HAVE_ENOUGH_DATA (4): Chromium fetched and decoded the H.264 clip's frames.
        page.wait_for_function("document.querySelector('video').readyState >= 4",
                               timeout=60_000)  # fmt: skip
        clip = page.evaluate("(() => { const v = document.querySelector('video'); "
                             "return [v.videoWidth, v.videoHeight, v.duration]; })()")  # fmt: skip
        page.screenshot(path=str(tmp_path / "sample-page.png"))

    where = f"(screenshot: {shot}; sections: {sections})"
    # The model-training layout: its navigation, none of the GenAI one's.
    assert agent_versions == 0, f"the GenAI layout opened {where}"
    assert "Model training" in body and "Runs" in body, where
    # The loss chart whole in the first screen, the first section the training curves.
    assert box is not None and box["y"] + CARD_PX <= HEIGHT, (box, where)
    assert sections[0].startswith("Model metrics"), where
    for chart in ("grad_norm", "lr"):
        assert chart in body, (chart, where)
    # The system's charts on their own tab, grouped: per node, throughput, time, checkpoint.
    for group in ("system/throughput", "system/time", "system/checkpoint"):
        assert any(s.startswith(group) for s in system_sections), (group, system_sections)
    # The data's 64 px frames enlarged 4x for the viewer, and data.clip_seconds (1 s by
    # default) long.
    assert clip[:2] == [256, 256] and abs(clip[2] - 1.0) < 0.05, clip


def _sections(text: str) -> list[str]:
    """The chart sections' headers in page order: a name, then its chart count `(N)`."""
    lines = [line.strip() for line in text.splitlines()]
    return [
        f"{lines[i - 1]} {line}"
        for i, line in enumerate(lines)
        if i and re.fullmatch(r"\(\d+\)", line)
    ]
