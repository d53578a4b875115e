"""`stoker data encode`: the latents of a data set through an encoder (the encoder
contract, stoker's tiny encoder, the plan, each shard encoded, the manifest)."""
