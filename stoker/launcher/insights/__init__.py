"""`stoker insights`: the accounts of many jobs summed (`report.py`), and the report
as an HTML page (`html.py`) and in Prometheus' text format (`prometheus.py`)."""
