"""The streaming loader: the global batch schedule, fetching and decoding in DataLoader
workers, the loader's resumable state, and its worker processes' lifetime."""
