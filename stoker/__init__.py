"""stoker: SLURM-native training of generative video and audio models."""

__version__ = "0.1.0"
