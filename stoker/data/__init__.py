"""AV data sets: their on-storage format, the media in them, `stoker data pack` and
`stoker data encode` (latents), the streaming loader a training loop holds, and the
SLURM array tasks of `data pack --slurm` and `data encode --slurm` (jobs/: the task's
command line, its stop signals and requeue exit; the launcher renders and submits their
batch scripts). Nothing here imports the launcher.

Wings, bottom up (a wing imports its own and lower tiers only):
format < media, write < sets < stream, pack, encode < jobs, synthetic; the modules on
top (inspect_dataset, bench_loader, and the public paths loader and tiny_encoder) may
use them all. Nothing is imported here: `import stoker.data` stays light.
"""
