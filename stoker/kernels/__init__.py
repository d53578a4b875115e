"""Triton kernels, each with a pure-torch reference; knows nothing of the runtime."""
