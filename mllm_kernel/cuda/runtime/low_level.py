"""``Kernel()``: the CuTe runtime's low-level object API, over :mod:`.kernel`.

>>> k = Kernel()  # doctest: +SKIP
>>> k.load_cubin("add.cubin")  # doctest: +SKIP
>>> k.set_kernel("add", signature="const float*, const float*, float*, int")  # doctest: +SKIP
>>> k.launch((a, b, c, n), grid=(n + 255) // 256, block=256)  # doctest: +SKIP
>>> k.synchronize()  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from mllm_kernel.cuda.runtime.kernel import (
    CompiledKernel,
    CudaModule,
    Dims,
    load_cubin,
    load_ptx,
)


class Kernel:
    """Load a module, pick a kernel, launch it: one kernel at a time, as the CuTe
    runtime's ``Kernel`` does. Each step raises RuntimeError if its predecessor is
    missing."""

    def __init__(self) -> None:
        self.module: CudaModule | None = None
        self.kernel: CompiledKernel | None = None

    def load_cubin(self, path: str | bytes | os.PathLike[str]) -> None:
        """Loads a CUBIN file (or bytes); forgets the kernel set before."""
        self.module, self.kernel = load_cubin(path), None

    def load_ptx(self, path: str | bytes | os.PathLike[str]) -> None:
        """Loads a PTX file (or text); forgets the kernel set before."""
        self.module, self.kernel = load_ptx(path), None

    def set_kernel(self, name: str, signature: str | None = None) -> None:
        """Selects kernel ``name``; ``signature`` gives its C parameter types."""
        if self.module is None:
            raise RuntimeError("no module loaded: call load_cubin(path) or load_ptx(path) first")
        self.kernel = self.module.get_function(name, signature)

    def launch(
        self,
        args: Sequence[Any],
        grid: Dims,
        block: Dims,
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        """Launches the selected kernel with ``args`` (see CompiledKernel for their types)."""
        self._selected()(*args, grid=grid, block=block, shared_mem=shared_mem, stream=stream)

    def synchronize(self) -> None:
        """Waits for the GPU the kernel last ran on."""
        self._selected().synchronize()

    def _selected(self) -> CompiledKernel:
        if self.kernel is None:
            raise RuntimeError("no kernel selected: call set_kernel(name, signature) first")
        return self.kernel
