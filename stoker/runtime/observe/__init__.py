"""What a job tells about itself while it trains: the hang watchdog's heartbeats, the
straggler report, step timing and memory, the profiler, progress.json, each start's
time account, the data sets read, and the metric sinks (rank 0's MLflow run, else a
file) they all write to."""
