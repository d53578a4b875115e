"""Sharded checkpoints over fsspec: save, commit, verify, load; knows nothing of SLURM."""
