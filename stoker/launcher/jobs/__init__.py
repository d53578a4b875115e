"""The record of each job on this machine: the ledger (`ledger.py`), its run folder
(`rundir.py`) and the text of its logs (`log_text.py`), the JSON fields read from it
(`json_fields.py`), and which jobs a command targets (`targets.py`). A lowest wing."""
