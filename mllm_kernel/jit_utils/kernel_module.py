"""A kernel module declared once: what it is built from, and the one memo of its loads.

Design
------
An op file declares each of its JIT modules as one :class:`KernelModule` value::

    _RMSNORM = KernelModule(
        "rmsnorm", device="cuda", sources=["rmsnorm.cu"],
        exports=["rmsnorm", "fused_add_rmsnorm"],
    )

and indexes it on the hot path by the variant, after the tensor's device index on
CUDA (a CPU module does not depend on a device)::

    _RMSNORM[input.get_device()].rmsnorm(out, input, weight, eps)         # CUDA
    _ADD_CONSTANT[src.get_device(), constant].add_constant(out, src)      # CUDA
    _RMSNORM[()].rmsnorm(out, input, weight, eps, threads)                # CPU
    _ADD_CONSTANT[constant].add_constant(out, src, threads)               # CPU

The declaration holds the facts each op file used to spell out in its own
``_module()`` (register_kernel + cache_once + load_*_jit):

* **name, device, sources**: the module's name (its cache directory and its name in
  ``show-config`` / ``precompile``), ``"cpu"`` or ``"cuda"``, and its source files
  (C++ for CPU, CUDA for CUDA), found in the package's kernel directory.
* **exports**: the C++ functions it wraps. An export ``"rmsnorm"`` wraps
  ``mllm_kernel::<device>::rmsnorm``, instantiated as ``rmsnorm<args>`` for a variant
  with template arguments; ``("name", "expression {args}")`` spells the expression.
* **variants**: the template-argument tuples it is built with (``[()]``: one build).
  Each is a tuple for :func:`make_cpp_args`. With ``check_variant``, the set is
  closed: a variant outside it is refused on its first lookup by
  ``check_variant(*variant)`` (the op's own error), so the hot path need not check
  values the memo already holds.
* **op** (optional): the public op a helper module serves when its name differs
  (``gptq_marlin_gemm``'s fused and dequantize modules), so that ``precompile
  --kernel gptq_marlin_gemm`` builds them with it.
* **archs** (CUDA, optional): the :class:`~mllm_kernel.jit_utils.cuda_arch.ArchSupport`
  of its kernels (``HOPPER_ONLY`` for wgmma kernels; default every arch). A build
  targets the archs of the arch list it supports and is refused when there are none,
  so no build of a kernel for an arch it cannot run on is ever made or loaded;
  precompile skips those with a note. A lookup for a GPU whose own arch it does not
  run on is refused (NotImplementedError naming the op, the GPU and the archs), even
  where an explicit arch list names an arch it does run on: that build would load and
  then fail at launch with "no kernel image".

From these the object is three things:

1. **A description**: :meth:`spec` returns a variant's :class:`BuildSpec` and builds
   nothing: a plain function, registered as the kernel's spec function, so show-config and
   precompile read the same spec the loader builds.
2. **A registration**: created once at import, it registers itself
   (:func:`~mllm_kernel.jit_utils.registry.register_kernel`) under its name.
3. **One memo of loaded modules** (the object is that dict), keyed by the variant
   and, for CUDA, the tensor's device index. The device index is an explicit input
   of the build (``spec(..., device_index=i)`` resolves the arch of GPU ``i``), so
   one memo is correct for every GPU: no second memo per device, no builder called
   around its cache. A hit is one dict subscript, with no Python call in between
   (``tensor.get_device()`` is the only other cost, on CUDA); a miss builds or
   loads under the object's lock (``__missing__``). The memo holds
   :class:`Exports`, whose functions are plain attributes.

A tensor that is not on a GPU (index -1: CPU, meta) reaching a CUDA module raises
ValueError before an arch is chosen or anything compiles; the op's
:func:`~mllm_kernel.jit_utils.op_inputs.explain` then names the argument.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from mllm_kernel.jit_utils import loader, registry
from mllm_kernel.jit_utils.cpp_args import make_cpp_args
from mllm_kernel.jit_utils.cuda_arch import (
    EVERY_ARCH,
    ArchSupport,
    arch_for_capability,
    resolve_cuda_archs,
)
from mllm_kernel.jit_utils.spec import BuildSpec

Export = str | tuple[str, str]


class Exports:
    """A loaded module's exported functions as plain attributes.

    What the memo hands out: reading ``exports.rmsnorm`` is an instance-dict lookup,
    where the tvm-ffi module's own attribute access costs about twice as much on every
    call. ``module`` is the tvm-ffi module itself.
    """

    def __init__(self, module: Any, exports: Iterable[Export]) -> None:
        self.module = module
        for export in exports:
            name = export if isinstance(export, str) else export[0]
            setattr(self, name, module.get_function(name))


class ModuleMemo(dict):
    """Loaded modules of one kernel, indexed by variant: ``memo[()]``, ``memo[8]``,
    ``memo[a, b]`` on the CPU; the same after the tensor's device index on CUDA:
    ``memo[x.get_device()]``, ``memo[x.get_device(), 8]``. The per-device lookup every
    CUDA op (and ``@jit``) goes through.

    A hit is a plain dict lookup (no Python call: the hot path of every op). A miss
    builds or loads the module under the memo's lock: ``load(device_index, *variant)``,
    ``device_index`` None on the CPU. On CUDA a negative index (a tensor not on a GPU)
    raises ValueError before an arch is chosen or anything compiles.
    """

    def __init__(self, device: str, load: Callable[..., Any]) -> None:
        super().__init__()
        self.device = device
        self._load = load
        self._lock = threading.Lock()

    def __missing__(self, key: Any) -> Any:
        if self.device == "cuda":
            index, variant = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
            if index is not None and (type(index) is not int or index < 0):
                raise ValueError(
                    f"expected a tensor on cuda but got one that is not on a GPU (device "
                    f"index {index!r})"
                )
        else:
            index, variant = None, key if isinstance(key, tuple) else (key,)
        with self._lock:
            module = self.get(key)
            if module is None:
                module = self._load(index, *variant)
                self[key] = module
        return module

    def current(self, *variant: Any) -> Any:
        """The module of ``variant`` for the current GPU (CUDA) or this machine (CPU).

        Without a visible GPU a CUDA module is built for the arch the environment names
        (``MLLM_KERNEL_CUDA_ARCH_LIST``), kept under the device index None.
        """
        if self.device == "cpu":
            return self[variant[0] if len(variant) == 1 else variant]
        index = torch.cuda.current_device() if torch.cuda.is_available() else None
        return self[(index, *variant)] if variant else self[index]

    def __eq__(self, other: object) -> bool:  # a memo is an object, not a value
        return self is other

    __hash__ = object.__hash__  # type: ignore[assignment]


class KernelModule(ModuleMemo):
    """One JIT module of the package: see the module docstring.

    >>> _SOFTMAX = KernelModule("softmax", device="cpu", sources=["softmax.cpp"],
    ...                         exports=["softmax"])  # doctest: +SKIP
    >>> _SOFTMAX[()].softmax(out, x, threads)  # doctest: +SKIP
    """

    def __init__(
        self,
        name: str,
        *,
        device: str,
        sources: Sequence[str],
        exports: Sequence[Export],
        variants: Iterable[tuple[Any, ...]] = ((),),
        check_variant: Callable[..., Any] | None = None,
        builtin: bool = True,
        op: str | None = None,
        archs: ArchSupport = EVERY_ARCH,
    ) -> None:
        super().__init__(device, self._load_for)
        self.name = name
        self.op = op
        self.archs = archs
        self.sources = tuple(sources)
        self.exports = tuple(exports)
        self.variants = [tuple(v) for v in variants]
        self._check_variant = check_variant
        self._declared = frozenset(self.variants)
        registry.register_kernel(
            name,
            device=device,
            variants=self.variants,
            builtin=builtin,
            spec_function=self.spec,
            op=op,
            archs=archs,
        )(self.load)

    def _wrappers(self, args: str) -> list[tuple[str, str]]:
        wrappers = []
        for export in self.exports:
            if isinstance(export, str):
                expression = f"mllm_kernel::{self.device}::{export}"
                wrappers.append((export, f"{expression}<{args}>" if args else expression))
            else:
                wrappers.append((export[0], export[1].format(args=args)))
        return wrappers

    def spec(self, *variant: Any, device_index: int | None = None) -> BuildSpec:
        """The BuildSpec of ``variant`` (for GPU ``device_index``, default the current
        one, where the arch is not set explicitly), for the archs of those that the
        module supports (UnsupportedArchError if none); builds nothing."""
        args = make_cpp_args(*variant)
        wrappers = self._wrappers(str(args))
        if self.device == "cpu":
            return loader.cpu_spec(self.name, *args, cpp_files=self.sources, cpp_wrappers=wrappers)
        return loader.cuda_spec(
            self.name,
            *args,
            cuda_files=self.sources,
            cuda_wrappers=wrappers,
            cuda_archs=self.archs.select(resolve_cuda_archs(device_index), self.name),
        )

    def load(self, *variant: Any, device_index: int | None = None) -> Any:
        """Builds (or loads from the cache) ``variant``'s module, bypassing the memo."""
        return loader.load_spec(self.spec(*variant, device_index=device_index))

    def _load_for(self, index: int | None, *variant: Any) -> Exports:
        if self._check_variant is not None and variant not in self._declared:
            self._check_variant(*variant)  # raises the op's own error
            raise ValueError(f"{self.name}: no variant {variant}; declared: {self.variants}")
        if index is not None:
            self._require_runs_on(index)
        return Exports(self.load(*variant, device_index=index), self.exports)

    def _require_runs_on(self, index: int) -> None:
        """NotImplementedError naming the op (and this module where its name differs),
        GPU ``index`` and the archs these kernels run on, unless the GPU's own arch is one
        of them. The arch list alone does not tell: on a T4 (sm_75) with
        ``MLLM_KERNEL_CUDA_ARCH_LIST="7.5;8.0"``, an sm_80-and-newer module would be built
        for sm_80 only, and its launches would fail with "no kernel image"."""
        # Imported here: mllm_kernel.cuda's ops import this module as they load.
        from mllm_kernel.cuda.device_facts import device_facts

        gpu = device_facts(index)
        major, minor = gpu.capability
        if self.archs.supports(arch_for_capability(major, minor)):
            return
        what = self.name if self.op in (None, self.name) else f"{self.op} (module {self.name})"
        raise NotImplementedError(
            f"{what} runs on {self.archs.explain()}; cuda:{index} ({gpu.name}) is "
            f"sm_{major}{minor} (compute capability {major}.{minor})"
        )

    def __repr__(self) -> str:
        return f"KernelModule({self.name!r}, device={self.device!r})"
