"""What a process of stoker's is given: the cores it may use (cores.py), the caller's
environment when it comes from a fork server (environment.py), and its garbage collector
paused while it imports (gc_pause.py). Leaves: no other stoker imports, nothing heavy."""
