"""Opening a data set by URL (a manifest, or plain WebDataset shards indexed in memory)
and putting its samples into buckets of clip size and length."""
