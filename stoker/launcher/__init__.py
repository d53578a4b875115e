"""Job specs, sbatch rendering, the SLURM client, the ledger of submitted jobs.

Login-node code: imports no torch, triton or mlflow at module level."""
