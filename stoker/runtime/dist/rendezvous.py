"""Every rank joins, or the job fails within the rendezvous timeout naming who did not.

torch's own rendezvous waits for a missing rank as long as a collective would
(train.collective_timeout_s, minutes) and then says only that it timed out. Here
each rank first signs in at the job's store (a TCPStore on MASTER_ADDR:MASTER_PORT,
hosted by rank 0), and the process group is built on that store only once all
have:

    every rank      store.set("stoker/joined/<rank>", its node); store.add(count, 1)
    every rank      polls the count until it is the world size
    rank 0, at its  lists the ranks without a key, with the node each was given
    deadline        (SLURM_JOB_NODELIST and the ranks per node), and tells the others
                    (a verdict key, and a large number added to the count); it keeps
                    its store up until they have read it, and every rank raises
                    RendezvousError with that list (`stoker why`: rendezvous)

Rank 0's deadline (train.rendezvous_timeout_s) counts from its own arrival: ranks
import torch at different speeds on a loaded node, so it must cover that skew, not
a collective. The others wait for its verdict a little longer, then say that rank 0
gave none (it is the one that hangs).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Mapping, Sequence

import torch
from torch._C._distributed_c10d import TCPStore

from stoker.errors import StokerError
from stoker.protocol import expand_nodelist
from stoker.runtime.dist import flight_recorder
from stoker.runtime.dist.dist_env import DistEnv, node_name

_JOINED = "stoker/joined"
_VERDICT = "stoker/verdict"
_READ = "stoker/verdict-read"
# Added to the count by rank 0 when it gives up: the others see it at their next poll.
_GIVEN_UP = 1 << 40
_VERDICT_GRACE_S = 15.0
_POLL_S = 0.05
_FIX = (
    "read the missing ranks' logs (`stoker logs JOB --rank N`): a rank that did not start "
    "or hangs before training points at its node (`stoker doctor`); on a big job whose "
    "nodes start slowly, raise train.rendezvous_timeout_s"
)


class RendezvousError(StokerError):
    """Some ranks did not join in time. Its message starts with "rendezvous:", which
    `stoker why` reads as the cause."""


def expected_node(rank: int, env: DistEnv, environ: Mapping[str, str]) -> str | None:
    """The node SLURM gave `rank`, with its ranks in blocks of the ranks per node
    (srun's default distribution); None outside SLURM."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return None
    try:
        nodes = expand_nodelist(nodelist)
    except ValueError:
        return None
    index = rank // env.local_world_size
    return nodes[index] if index < len(nodes) else None


def describe_missing(missing: Sequence[int], env: DistEnv, environ: Mapping[str, str]) -> str:
    """ "rank 3 (node n2), rank 5 (node n3)" """
    parts = []
    for rank in missing:
        node = expected_node(rank, env, environ)
        parts.append(f"rank {rank} (node {node})" if node else f"rank {rank}")
    return ", ".join(parts)


def _connect(env: DistEnv, timeout_s: float) -> TCPStore:
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    try:
        return TCPStore(
            addr,
            port,
            env.world_size,
            env.rank == 0,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except (RuntimeError, torch.distributed.DistError) as exc:
        if env.rank == 0:
            raise  # cannot host the store: the port is taken (`why`: port-in-use)
        raise RendezvousError(
            f"rendezvous: rank 0 did not open the job's store at {addr}:{port} within "
            f"{timeout_s:g} s (train.rendezvous_timeout_s): {exc}",
            fix="read rank 0's log (`stoker logs JOB --rank 0`): it failed or did not "
            "start; if it runs, check that this node reaches MASTER_ADDR on MASTER_PORT",
        ) from exc


def join(
    env: DistEnv,
    device: torch.device,
    *,
    rendezvous_timeout_s: float,
    collective_timeout_s: float,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Join the job's process group (nccl on GPUs, gloo on CPUs) once every rank has
    signed in; RendezvousError naming the missing ranks after `rendezvous_timeout_s`.
    Nothing for one process or when a process group exists already."""
    if not env.distributed or torch.distributed.is_initialized():
        return
    environ = os.environ if environ is None else environ
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if name not in environ:
            raise StokerError(
                f"{env.world_size} ranks ({env.source}) but {name} is not set",
                fix="start ranks with `stoker submit`, `stoker run` or torchrun, which set it",
            )
    store = _connect(env, rendezvous_timeout_s)
    if env.rank == 0:
        print(
            f"stoker: rendezvous at {environ['MASTER_ADDR']}:{environ['MASTER_PORT']}: "
            f"waiting for {env.world_size} ranks (train.rendezvous_timeout_s="
            f"{rendezvous_timeout_s:g})",
            file=sys.stderr,
            flush=True,
        )
    try:
        _sign_in_and_wait(store, env, environ, rendezvous_timeout_s)
    except (RuntimeError, torch.distributed.DistError) as exc:
        raise RendezvousError(
            f"rendezvous: rank 0's store went away before all ranks had joined: {exc}",
            fix="read rank 0's log (`stoker logs JOB --rank 0`): it failed first",
        ) from exc
    # The store's timeout becomes the collectives' (it also bounds gloo's connections).
    store.set_timeout(datetime.timedelta(seconds=collective_timeout_s))
    flight_recorder.configure(os.environ, cuda=device.type == "cuda")  # read at the next line
    torch.distributed.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=collective_timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    groups_made_later_time_out_alike(datetime.timedelta(seconds=collective_timeout_s))


def groups_made_later_time_out_alike(timeout: datetime.timedelta) -> None:
    """Every process group made from here on without a timeout of its own (device
    meshes' dimensions, context parallelism's groups, a plugin's) times out as the
    world's does. torch gives each new group its backend's default instead (30 minutes
    for gloo, 10 for NCCL), not init_process_group's timeout: a rank waiting on a frozen
    peer in such a group would hang for that long, past train.collective_timeout_s.
    The checkpointer's group asks for its own, longer one (checkpointer.py)."""
    from torch.distributed import distributed_c10d

    # Module globals that torch reads each time a group is made without a timeout
    # (_get_default_timeout); torch offers no public setter for them.
    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):
        if not hasattr(distributed_c10d, name):  # a torch that moved them: say so, train on
            print(
                f"stoker: warning: this torch ({torch.__version__}) has no "
                f"distributed_c10d.{name}: process groups made after the join keep "
                "torch's own timeout (30 minutes for gloo), not "
                "train.collective_timeout_s",
                file=sys.stderr,
                flush=True,
            )
            continue
        setattr(distributed_c10d, name, timeout)


def _sign_in_and_wait(
    store: TCPStore,
    env: DistEnv,
    environ: Mapping[str, str],
    timeout_s: float,
) -> None:
    deadline = time.monotonic() + timeout_s
    store.set(f"{_JOINED}/{env.rank}", node_name())
    joined = store.add(_JOINED, 1)
    # Every rank polls rank 0's store: slower with thousands of them.
    poll_s = _POLL_S * max(1.0, env.world_size / 64)
    while True:
        if joined >= _GIVEN_UP:
            # Rank 0's verdict: read it, say so (rank 0 keeps its store up until then).
            verdict = store.get(_VERDICT).decode()
            store.add(_READ, 1)
            raise RendezvousError(verdict, fix=_FIX)
        if joined >= env.world_size:
            return
        now = time.monotonic()
        if env.rank == 0 and now > deadline:
            _give_up(store, env, environ, timeout_s, joined)
        elif now > deadline + _VERDICT_GRACE_S:
            raise RendezvousError(
                f"rendezvous: rank 0 gave no verdict {timeout_s + _VERDICT_GRACE_S:g} s after "
                f"this rank joined, with {joined} of {env.world_size} ranks in",
                fix="read rank 0's log (`stoker logs JOB --rank 0`)",
            )
        time.sleep(poll_s)
        joined = store.add(_JOINED, 0)


def _give_up(
    store: TCPStore,
    env: DistEnv,
    environ: Mapping[str, str],
    timeout_s: float,
    joined: int,
) -> None:
    """Rank 0 at the deadline: name the missing ranks to every rank that joined, and
    keep the store up until they have read it (bounded), then raise."""
    missing = [r for r in range(env.world_size) if not store.check([f"{_JOINED}/{r}"])]
    if not missing:
        return  # all arrived since the last poll
    who = describe_missing(missing, env, environ)
    verdict = (
        f"rendezvous: {len(missing)} of {env.world_size} ranks did not join within "
        f"{timeout_s:g} s (train.rendezvous_timeout_s), {env.world_size - len(missing)} "
        f"did: missing {who}"
    )
    store.set(_VERDICT, verdict)
    store.add(_JOINED, _GIVEN_UP)
    others = env.world_size - len(missing) - 1
    until = time.monotonic() + _VERDICT_GRACE_S
    while store.add(_READ, 0) < others and time.monotonic() < until:
        time.sleep(_POLL_S)
    raise RendezvousError(verdict, fix=_FIX)
