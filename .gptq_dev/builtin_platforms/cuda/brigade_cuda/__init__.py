"""brigade-cuda: the NVIDIA GPU platform for Brigade, with Triton kernels (``attention``, ``ops``).

Importing this package imports nothing heavy; the entry point is ``brigade_cuda.plugin``.
"""
