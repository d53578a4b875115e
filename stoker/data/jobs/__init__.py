"""The SLURM array tasks of `data pack --slurm` and `data encode --slurm`: each runs as
`python -m stoker.data.jobs.<pack|encode>_task`, does its shards, stops on request and
exits for a requeue; the last to end writes the manifest."""
