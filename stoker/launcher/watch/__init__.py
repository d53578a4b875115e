"""A job once queued, seen from here: `stoker status`'s rows (`status.py`), `stoker
logs` (`logs.py`), and what follows once a job is seen ended (`job_end.py`: its
reason, its account (`job_account.py`), its MLflow run ended)."""
