"""Log signatures: a line in a log that names the cause of a failure.

`find_signature` tries the table in order: the first signature that matches any
line wins, so a specific cause (the port is taken) comes before a generic one
(the rendezvous failed). Extend the table here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    """A line in a log that names a cause. First match in table order wins."""

    cause: str
    pattern: re.Pattern[str]
    summary: str
    fix: str


def _sig(cause: str, regex: str, summary: str, fix: str) -> Signature:
    return Signature(cause, re.compile(regex), summary, fix)


HOST_MEMORY_FIX = (
    "ask for more host memory (--mem / job.mem, e.g. twice the peak; --mem 0 takes a "
    "whole node's), or use less: fewer data loader workers (data.num_workers), a smaller "
    "data.batch_size"
)

# Signature(cause, regex, summary, fix): extend here. Ordered: a specific cause before a
# generic one.
SIGNATURES: tuple[Signature, ...] = (
    _sig(
        "host-oom",
        r"exceeded memory limit|Exceeded (?:job|step) memory limit|Detected \d+ oom[-_ ]kill"
        r"|oom[-_]kill event|Out of memory: Killed process|Memory cgroup out of memory",
        "host out of memory: killed for exceeding its memory",
        HOST_MEMORY_FIX,
    ),
    _sig(
        "gpu-oom",
        r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError|CUDA error: out of memory"
        r"|HIP out of memory|CUBLAS_STATUS_ALLOC_FAILED",
        "GPU out of memory",
        "use less GPU memory per rank: a smaller data.batch_size (raise train.grad_accum to "
        "keep the global batch), train.activation_checkpointing=selective or full, or more "
        "GPUs to shard over (job.nodes); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "helps when the message shows much reserved but unallocated memory",
    ),
    _sig(
        "nccl-timeout",
        r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imed? ?out"
        r"|NCCL.*timed out|collective operation timeout",
        "NCCL collective timed out: some rank stopped taking part",
        "find the rank that stopped first (it hung or failed: `stoker logs JOB --tail 30`); "
        "a slow rank points at its node (`stoker logs JOB --rank N`), a hang at a deadlock "
        "or stuck I/O. Raise the timeout only if one step legitimately takes that long",
    ),
    _sig(
        "nccl",
        r"ProcessGroupNCCL|NCCL error|ncclInternalError|ncclSystemError"
        r"|ncclUnhandledCudaError|ncclRemoteError|ncclInvalidUsage|DistBackendError",
        "NCCL communication error",
        "rerun with job.env.NCCL_DEBUG=INFO to see which transport and peer failed; check "
        "the nodes' network (IB/RoCE, NCCL_SOCKET_IFNAME) with `stoker doctor`; a "
        "'remote process exited' error means another rank failed first: read its log",
    ),
    _sig(
        "port-in-use",
        r"Address already in use|EADDRINUSE",
        "the rendezvous port is already in use on the first node",
        "MASTER_PORT is taken by another process on the first node (another job, or a "
        "leftover process): resubmit; set job.env.MASTER_PORT to a free port if it persists",
    ),
    _sig(
        "rendezvous",
        r"rendezvous: (?:\d+ of \d+ ranks did not join|rank 0 did not open|rank 0 gave no)",
        "not every rank joined the job at its start (the line names the missing ranks)",
        "read the missing ranks' logs (`stoker logs JOB --rank N`): a rank that did not "
        "start or hangs before training points at its node (`stoker doctor`); on a big job "
        "whose nodes start slowly, raise train.rendezvous_timeout_s",
    ),
    _sig(
        "rendezvous",
        r"RendezvousTimeoutError|RendezvousConnectionError|RendezvousClosedError"
        r"|DistNetworkError|DistStoreError|TCPStore|[Cc]onnection refused"
        r"|Connection reset by peer|Name or service not known|No route to host"
        r"|Socket Timeout|connect\(\) timed out",
        "ranks could not meet at the rendezvous (MASTER_ADDR:MASTER_PORT)",
        "check that every node reaches MASTER_ADDR (the first node's NodeAddr in `scontrol "
        "show node`) on MASTER_PORT (no firewall, the name resolves on the nodes), and that "
        "rank 0 started: if it failed first, its log has the real error",
    ),
    _sig(
        "host-oom",
        r"^\s*MemoryError\b|std::bad_alloc|Cannot allocate memory",
        "host out of memory: an allocation failed",
        HOST_MEMORY_FIX,
    ),
    _sig(
        "gpu-error",
        r"CUDA error: (?:an illegal memory access|unspecified launch failure|device-side assert)"
        r"|Xid \d+|uncorrectable ECC error",
        "CUDA error on a GPU",
        "a device-side assert or illegal access is a bug (rerun with CUDA_LAUNCH_BLOCKING=1); "
        "ECC or Xid errors are the GPU's: resubmit and report the node",
    ),
)


@dataclass(frozen=True)
class SignatureHit:
    signature: Signature
    line: str
    source: str  # "rank 3" or "batch.log"


def find_signature(text: str, source: str) -> SignatureHit | None:
    """The first signature (in table order) that matches a line of `text`."""
    lines = text.splitlines()
    for signature in SIGNATURES:
        for line in lines:
            if signature.pattern.search(line):
                return SignatureHit(signature, line.strip(), source)
    return None
