"""Launching: from a resolved experiment to a queued job. The checks a launch must
pass (`checks.py`, `model_fit.py`, `experiment_check.py` for `stoker check`), the code
snapshot, `submit`, sweeps and the data jobs' arrays."""
