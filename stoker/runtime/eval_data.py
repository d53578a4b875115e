"""The held-out split's loader for train.eval_every: data.eval_url, or with the built-in
synthetic data a second synthetic set (other clips)."""

from __future__ import annotations

from typing import Any

from stoker.config import ExperimentConfig
from stoker.errors import StokerError
from stoker.runtime.dist.dist_env import DistEnv


def held_out_loader(
    cfg: ExperimentConfig, env: DistEnv, data_rank: int | None = None, data_world: int | None = None
) -> Any:
    """The held-out split's loader: clips from their start, the same batches every
    evaluation (the trainer resets its position each time), in the run's micro-batches;
    data_rank of data_world data-parallel groups (default: the rank of the world; with
    context parallelism each CP rank reads its group's batches itself)."""
    from stoker.data.stream.loader import loader_from_config

    url = cfg.data.eval_url
    if url is None:
        if cfg.data.url is not None or cfg.data.sources:
            raise StokerError(
                "train.eval_every is set but data.eval_url is null: no held-out data set",
                fix="set data.eval_url to a held-out data set, or train.eval_every=0",
            )
        from stoker.data.synthetic.default_set import ensure_synthetic_data

        say = print if env.is_main else None
        url = str(ensure_synthetic_data(cfg.data, say, split="eval"))
    # One data set (named apart from a mixture's), with the run's buckets.
    data = cfg.data.model_copy(update={"url": url, "sources": [], "clip_offset": "start"})
    return loader_from_config(
        cfg.model_copy(update={"data": data}),
        rank=env.rank if data_rank is None else data_rank,
        world_size=env.world_size if data_world is None else data_world,
        micro_batches=cfg.train.grad_accum,
    )
