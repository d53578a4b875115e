"""`stoker plan`'s engine: candidates traced on fake tensors (trace.py), timed by a
roofline model (timing.py), searched fastest first (search.py), compared with what a
run measured (calibrate.py). docs/plan.md says what it models and what it does not."""
