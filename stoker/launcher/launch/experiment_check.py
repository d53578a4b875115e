"""`stoker check EXP.yaml [k=v ...]`: what a job of this experiment needs, checked from
here before anything is queued. One finding each (ok or fail, with the fix):

- model: the factory imports, its arguments validate, it builds on the meta device and
  its forward gives a scalar loss on a meta batch of the loader's shapes (a child
  process: stoker/launcher/launch/model_fit.py);
- data: each data set's manifest is there and lists samples (or the synthetic set);
- buckets: each bucket's global batch (given or from data.batch_tokens) splits over the
  ranks and train.grad_accum;
- transform: data.transform imports by name, as the loader's workers will import it
  (a child process with job.env, like the model's: the login node imports no torch);
- checkpoints: the checkpoint root (or the runs folder) takes a file;
- MLflow: the store is reachable (a sqlite folder writable, a server healthy).

The config itself was resolved before (its errors stop everything, as everywhere).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from functools import partial

from stoker.config import ResolvedConfig
from stoker.errors import StokerError
from stoker.launcher.doctor.check import Finding, joined_lines


def check_experiment(resolved: ResolvedConfig) -> list[Finding]:
    cfg = resolved.config
    findings = [_run("model", lambda: _check_model(resolved))]
    wanted: list[str] = list(cfg.data.modalities)
    if cfg.data.sources:
        for i, source in enumerate(cfg.data.sources):
            key = f"data.sources[{i}] ({source.name})"
            findings.append(
                _run(f"data {source.name}", partial(_check_data, source.url, key, wanted))
            )
    else:
        findings.append(_run("data", lambda: _check_data(cfg.data.url, "data.url", wanted)))
    if cfg.data.buckets:
        findings.append(_run("buckets", lambda: _check_buckets(resolved)))
    if cfg.data.eval_url is not None:
        eval_url = cfg.data.eval_url
        findings.append(_run("eval data", lambda: _check_data(eval_url, "data.eval_url", wanted)))
    if cfg.data.transform is not None:
        findings.append(_run("transform", lambda: _check_transform(resolved)))
    findings.append(_run("checkpoints", lambda: _check_checkpoint_root(cfg.checkpoint.root)))
    findings.append(_run("MLflow", lambda: _check_store(cfg.tracking.uri)))
    return findings


def _run(check: str, probe: Callable[[], Finding | str]) -> Finding:
    """The probe's finding; its StokerError as a failed one."""
    try:
        found = probe()
    except StokerError as exc:
        return Finding(check, "fail", joined_lines(exc.message), exc.fix)
    return found if isinstance(found, Finding) else Finding(check, "ok", found)


def _check_model(resolved: ResolvedConfig) -> str:
    from stoker.launcher.launch.model_fit import check_model_fits

    notes: list[str] = []
    check_model_fits(resolved, say=notes.append)
    model = resolved.config.model
    what = f"{model.arch} (size {model.size})" if ":" not in model.arch else model.arch
    return f"{what} builds on the meta device; " + (
        "; ".join(notes) if notes else "forward gives a scalar loss on a batch of the data's shapes"
    )


def _check_data(url: str | None, key: str, modalities: list[str]) -> str:
    if url is None:
        return "synthetic data set, written on first use"
    from stoker.data.sets.dataset import open_dataset

    manifest = open_dataset(url).manifest
    missing = [m for m in modalities if manifest.modalities and m not in manifest.modalities]
    if missing:
        raise StokerError(
            f"{key} {url} holds {', '.join(manifest.modalities)}, not {', '.join(missing)} "
            f"(data.modalities {modalities})",
            fix=f"drop {', '.join(missing)} from data.modalities, or pack a data set that has them",
        )
    return f"{key} {url}: {manifest.samples} samples in {len(manifest.shards)} shards"


def _check_buckets(resolved: ResolvedConfig) -> str:
    from stoker.data.sets.buckets import resolve_buckets
    from stoker.launcher.launch.checks import check_buckets

    check_buckets(resolved)
    buckets = resolve_buckets(resolved.config.data)
    return "global batches " + ", ".join(f"{b.name}: {b.batch_size}" for b in buckets)


TRANSFORM_TIMEOUT_S = 300  # the child imports torch (stoker.data) on a loaded login node
_TRANSFORM_REFUSED = 3
# Run by the child: the loader's own import, so the check says what the workers will.
_IMPORT_TRANSFORM = """
import inspect, json, sys
from stoker.data.stream.worker import import_transform
from stoker.errors import StokerError
try:
    function = import_transform(sys.argv[1], key="data.transform")
except StokerError as exc:
    print(json.dumps({"message": exc.message, "fix": exc.fix}))
    sys.exit(3)  # _TRANSFORM_REFUSED
try:
    where = f"{inspect.getsourcefile(function)}:{inspect.getsourcelines(function)[1]}"
except (OSError, TypeError):
    where = getattr(function, "__module__", "?")
print(json.dumps({"where": where}))
"""


def _check_transform(resolved: ResolvedConfig) -> str:
    path = resolved.config.data.transform
    assert path is not None
    source = resolved.source_of(("data", "transform"))
    argv = [sys.executable, "-c", _IMPORT_TRANSFORM, path]
    try:
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=TRANSFORM_TIMEOUT_S,
            check=False,
            env={**os.environ, **resolved.config.job.env},  # as the job imports it
        )
    except subprocess.TimeoutExpired as exc:
        raise StokerError(
            f"importing data.transform {path} took more than {TRANSFORM_TIMEOUT_S} s",
            fix="try again when the machine is less busy",
        ) from exc
    lines = result.stdout.strip().splitlines()
    if result.returncode == _TRANSFORM_REFUSED and lines:
        refusal = json.loads(lines[-1])
        raise StokerError(
            f"{refusal['message']} (data.transform from {source})", fix=refusal["fix"]
        )
    if result.returncode != 0 or not lines:
        raise StokerError(
            f"the import check of data.transform {path} (from {source}) failed with exit "
            f"{result.returncode}: {result.stderr.strip()[-2000:]}",
            fix="fix the error above: the loader's workers import the transform the same way",
        )
    return f"data.transform {path} imports ({json.loads(lines[-1])['where']})"


def _check_checkpoint_root(root: str | None) -> Finding | str:
    from stoker.launcher.doctor.storage import writable_folder
    from stoker.launcher.jobs.rundir import runs_root

    if root is None:
        folder = runs_root()
        problem = writable_folder(folder)
        if problem:
            return Finding("checkpoints", "fail", problem, "set STOKER_HOME to a writable folder")
        return f"in each run folder, under {folder}"
    return _writable_url(root)


def _writable_url(root: str) -> str:
    """Write and delete one small file under `root` (any fsspec URL)."""
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(root)
        probe = f"{path.rstrip('/')}/.stoker-check-{uuid.uuid4().hex}"
        # A local folder is made as a save would; on an object store makedirs would
        # create a missing bucket, which a check must not do.
        if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
            fs.makedirs(path, exist_ok=True)
        fs.pipe_file(probe, b"stoker check\n")
        fs.rm_file(probe)
    except (ImportError, ValueError) as exc:
        raise StokerError(
            f"checkpoint.root {root!r}: {exc}",
            fix="install the fsspec package for its scheme (s3fs for s3://), or fix the URL",
        ) from exc
    except OSError as exc:
        raise StokerError(
            f"checkpoint.root {root!r} does not take a file: {exc}",
            fix="check the URL, its credentials (AWS_* variables) and permissions",
        ) from exc
    return f"checkpoint.root {root} takes a file"


def _check_store(uri: str | None) -> Finding:
    from stoker.launcher.doctor.tracking_store import check_tracking_store
    from stoker.tracking.store import resolve_tracking_uri, tracking_off

    if tracking_off(uri):
        return Finding(
            "MLflow",
            "ok",
            "tracking.uri is none: no MLflow store; each run "
            "writes metrics.jsonl in its run folder",
        )
    found = check_tracking_store(resolve_tracking_uri(uri))
    return Finding("MLflow", found.status, found.detail, found.fix)
