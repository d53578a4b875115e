"""`SystemSampler`: a node's CPU, memory and GPUs, sampled into the job's MLflow run.

Local rank 0 of every node runs one (stoker/runtime/observe/rank_tracking.py). psutil and
pynvml (nvidia-ml-py) are used where installed; without psutil, /proc is read;
without pynvml, no GPU metrics. No torch: GPUs are numbered as CUDA_VISIBLE_DEVICES
lists them, as torch numbers them.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from stoker.metric_names import node_metric
from stoker.tracking.file_logger import FileRunLogger
from stoker.tracking.logger import RunLogger


class SystemSampler:
    """Samples this node's CPU, memory and GPUs every `interval_s` into a RunLogger (or
    the FileRunLogger of tracking.uri none).

    Keys: `system/<node>/cpu_percent` (all cores, 0-100), `system/<node>/memory_gb`
    (used: total minus available, 1e9 bytes), and per visible GPU (CUDA_VISIBLE_DEVICES
    order, as torch numbers them) `system/<node>/gpu<i>/utilization` (percent),
    `.../gpu<i>/memory_gb` and `.../gpu<i>/power_w`, when pynvml (nvidia-ml-py) is
    importable.

    The step is whole seconds since the run started (the store's start time, read by
    `RunLogger.start()`; this sampler's start when the store did not answer then): a
    node other than rank 0's does not know the training step, seconds put every node
    on one axis, and they keep growing across requeues, so a requeued job's samples
    are not taken for steps already logged. Samples less than a second apart share a
    step and only the first is kept.
    """

    def __init__(
        self,
        logger: RunLogger | FileRunLogger,
        *,
        interval_s: float = 10.0,
        node: str | None = None,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        self.node = re.sub(r"[^\w.\-]", "_", name) or "node"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._origin = time.time()
        self._last_cpu: tuple[int, int] | None = None
        self._psutil: Any = None
        self._nvml: Any = None
        self._gpus: list[Any] = []
        self._warned: set[str] = set()

    def start(self) -> None:
        self._origin = self.logger.run_start_s or time.time()
        self._last_step = -1
        try:
            import importlib

            self._psutil = importlib.import_module("psutil")
            self._psutil.cpu_percent(interval=None)  # the first call sets its baseline
        except ImportError:
            self._last_cpu = _read_cpu_times()
        self._open_gpus()
        self._thread = threading.Thread(
            target=self._loop, name=f"stoker-system-sampler-{self.node}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling, with one last sample: a run shorter than the
        interval still records its node."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._log_sample()
        if self._nvml is not None:
            with contextlib.suppress(Exception):  # NVMLError: the sampler is done either way
                self._nvml.nvmlShutdown()
            self._nvml = None

    def sample(self) -> dict[str, float]:
        """One reading of every metric this node has (keys as in the class docstring)."""
        prefix = node_metric(self.node, "").rstrip("/")
        values: dict[str, float] = {}
        cpu = self._cpu_percent()
        if cpu is not None:
            values[f"{prefix}/cpu_percent"] = cpu
        used = self._memory_used()
        if used is not None:
            values[f"{prefix}/memory_gb"] = used / 1e9
        for index, handle in enumerate(self._gpus):
            for name in ("utilization", "memory_gb", "power_w"):
                try:
                    values[f"{prefix}/gpu{index}/{name}"] = self._read_gpu(handle, name)
                except Exception:  # NVMLError_NotSupported (MIG, some boards): skip it
                    self._say_once(f"gpu-{name}", f"GPU {index} gives no {name}: not logged")
        return values

    def _read_gpu(self, handle: Any, name: str) -> float:
        nvml = self._nvml
        if name == "utilization":
            return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        if name == "memory_gb":
            return float(nvml.nvmlDeviceGetMemoryInfo(handle).used) / 1e9
        return float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0  # milliwatts

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._log_sample()

    def _log_sample(self) -> None:
        step = int(time.time() - self._origin)
        if step <= self._last_step:
            return
        self._last_step = step
        try:
            self.logger.log_metrics(self.sample(), step)
        except Exception as exc:  # a sampler must never stop training
            self._say_once("sample", f"system metrics of {self.node} failed: {exc}")

    def _cpu_percent(self) -> float | None:
        if self._psutil is not None:
            return float(self._psutil.cpu_percent(interval=None))
        now = _read_cpu_times()
        before, self._last_cpu = self._last_cpu, now
        if now is None or before is None or now[1] <= before[1]:
            return None
        return 100.0 * (now[0] - before[0]) / (now[1] - before[1])

    def _memory_used(self) -> int | None:
        if self._psutil is not None:
            memory = self._psutil.virtual_memory()
            return int(memory.total - memory.available)
        return _read_memory_used()

    def _open_gpus(self) -> None:
        import importlib

        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            if _has_nvidia_gpu():  # else there is nothing to miss: say nothing
                self._say_once("nvml", "pynvml (nvidia-ml-py) is not installed: no GPU metrics")
            return
        try:
            nvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible is None:
                ids: list[str] = [str(i) for i in range(nvml.nvmlDeviceGetCount())]
            else:
                ids = [part.strip() for part in visible.split(",") if part.strip()]
            for ident in ids:
                if ident.isdigit():
                    self._gpus.append(nvml.nvmlDeviceGetHandleByIndex(int(ident)))
                elif ident.startswith("GPU-"):
                    self._gpus.append(nvml.nvmlDeviceGetHandleByUUID(ident))
                else:  # MIG-... instances have no utilisation counters of their own
                    self._say_once(f"gpu-{ident}", f"no GPU metrics for {ident}")
        except Exception as exc:  # NVMLError: no driver on this node
            self._say_once("nvml", f"NVML is not usable ({exc}): no GPU metrics")
            self._gpus = []
            return
        self._nvml = nvml

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(f"stoker: {message}", file=sys.stderr, flush=True)


def _read_cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(x) for x in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user).
    idle = fields[3] + fields[4]
    total = sum(fields)
    return total - idle, total


def _read_memory_used() -> int | None:
    """MemTotal - MemAvailable from /proc/meminfo, in bytes; None off Linux."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(values) < 2:
        return None
    return values["MemTotal"] - values["MemAvailable"]


def _has_nvidia_gpu() -> bool:
    """An NVIDIA driver's device node, or GPUs SLURM or the user made visible."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return Path("/dev/nvidiactl").exists() or visible not in ("", "-1", "NoDevFiles")
