"""`scripts/gpu-check`: every GPU figure stoker owes, in one call on a lent GPU.

A lent H100/H200 comes for about 15 minutes of device time, 10 minutes a command,
with no network and without mlflow, av, soundfile or submitit. This package turns it
into results with one prepared command: parts in priority order (parts.py), each a
subprocess with its own deadline writing `<part>.json` into the output folder as it
goes, so that a timeout still returns what finished. docs/kernels.md ("The GPU
check") gives the device call and how to read the results.
"""
