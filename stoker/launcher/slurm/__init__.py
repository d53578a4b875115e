"""SLURM itself: its commands run through one place (`cli.py`), what they answer about
jobs parsed (`query.py`: squeue, sacct, scontrol), and a partition's facts from sinfo
(`partition_facts.py`). The lowest wing: it knows nothing of stoker's jobs."""
