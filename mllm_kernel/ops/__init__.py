"""The ops, each declared once for every device (:mod:`.op`).

A module here holds an op family's declarations: the signature and docstring of each
op, its fake, autograd and argument rules (the contract both devices share). The
device packages (:mod:`mllm_kernel.cpu.jit`, :mod:`mllm_kernel.cuda.jit`) hold the
kernel modules and give each op its kernel on that device; the public functions live
there. Nothing here imports a device package.
"""
