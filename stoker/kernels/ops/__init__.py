"""Raw Triton kernels and their launchers. Imported only when a Triton path runs:
`import stoker.kernels` must work without triton installed (the reference path)."""
