"""The kernel benchmark behind `stoker bench kernels` and benchmarks/kernels.py:
each kernel against torch eager, torch.compile and Liger-Kernel, with a byte
model and the device's measured copy bandwidth as the roofline."""
