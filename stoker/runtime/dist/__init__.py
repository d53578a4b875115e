"""Where a rank stands and how the ranks work together: the launcher's variables read
(dist_env), the process group joined (rendezvous), the model sharded over the device
mesh (parallelize: FSDP2/HSDP, activation checkpointing, compile), the precision the
device takes, and PyTorch's flight recorder of recent collectives for a post-mortem."""
