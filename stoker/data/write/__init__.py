"""Writing a data set: one shard (a tar and its index), the shards finished under a
destination, the manifest once all are there, and local processes that write shards."""
