"""The local backend (`submit --local`, `stoker run`): the ranks started as processes
on this machine (`backend.py`) under a detached supervisor (`supervisor.py`), which
records their outcome in local-state.json (`state.py`)."""
