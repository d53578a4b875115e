"""What a data set is on storage: WebDataset tar shards, an index beside each, one
manifest; and what a latent data set (`stoker data encode`) adds to it."""
