"""`stoker data pack`: media files in, a data set out (plan, write each shard, cut
clips, the manifest)."""
