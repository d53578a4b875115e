"""AV shards, their writer and the fsspec streaming loader; knows nothing of SLURM."""
