"""CUDA kernels: sources in ``csrc/``, Python entry points in :mod:`mllm_kernel.cuda.jit`."""
