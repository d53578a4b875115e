"""MLflow, for the launcher (runs made at submit) and the job (what it logs): one home.

| module | what it is |
|---|---|
| `store` | which store runs go to (`resolve_tracking_uri`); opening it, locked or not |
| `limits` | MLflow's limits on names, values and calls: `check_key`, `cut` |
| `runs` | the runs stoker creates (`precreate_run`, a sweep's), the config as params |
| `direct_runs` | those runs, in a sqlite store, written with sqlite3: no mlflow import |
| `logger` | `RunLogger`: the job's writer into one run; calls enqueue and return |
| `record_queue` | the queue between the training thread and the writer thread |
| `writer` | the writer thread: batches to the store, an outage spooled and replayed |
| `spool` | the records and the spool file that keeps them through an outage |
| `packing` | records into `log_batch` calls within MLflow's limits; one point per step and key |
| `logged_models` | checkpoints and final weights as MLflow logged models, created exactly once |
| `dataset_inputs` | the data sets a run reads as MLflow dataset inputs, once per run |
| `stderr` | what the writer tells the user: a warning line, never an exception |
| `system_metrics` | `SystemSampler`: a node's CPU, memory and GPUs |

Light to import: launcher modules import this package on login nodes, so mlflow is
imported inside the functions that talk to a store, never at module level (any
`mlflow.*` import costs 1 to 2.7 s).
"""
