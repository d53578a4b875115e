"""The login node's side of a job: submit, watch, diagnose. Wings, bottom-up: slurm, jobs,
script; local, doctor; launch, why; watch; insights (docs/architecture.md). Login-node
code: imports no torch, triton or mlflow at module level."""
