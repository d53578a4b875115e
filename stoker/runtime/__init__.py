"""The training runtime that runs inside a job: distributed setup, models, loop, metrics."""
