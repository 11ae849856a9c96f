"""``@jit``: the original mllm-kernel's decorator, built on load_cpu_jit / load_cuda_jit.

The decorated function gets the compiled module as its first argument; the module
is built (or found in the cache, with its locks and checks) on the first call and
kept. Each decorated kernel is registered (:func:`.registry.register_kernel`) so
that ``show-config`` and ``precompile`` list and build it before it is called, and
its metadata is recorded the way the original recorded it
(:func:`.registry.get_jit_kernel_registry`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from mllm_kernel.jit_utils import loader, registry
from mllm_kernel.jit_utils.cpp_args import make_cpp_args
from mllm_kernel.jit_utils.kernel_module import ModuleMemo
from mllm_kernel.jit_utils.memo import cache_once
from mllm_kernel.jit_utils.spec import DEVICES, check_module_name

F = TypeVar("F", bound=Callable[..., Any])
Device = Literal["auto", "cpu", "cuda"]
_DEVICES = ("auto", *DEVICES)

# Registering a variant reads the registry's entry and adds to it: one lock for both.
_register_lock = threading.Lock()


def _template_args(args: Any) -> tuple[Any, ...]:
    if args is None:
        return ()
    if isinstance(args, (list, tuple)):
        return tuple(args)
    return (args,)


def _scan_into(values: Any, found: list) -> None:
    # found = [first CUDA tensor or None, whether a non-CUDA tensor was seen]
    for value in values:
        if isinstance(value, torch.Tensor):
            if not value.is_cuda:
                found[1] = True
            elif found[0] is None:
                found[0] = value
        elif isinstance(value, (list, tuple)):
            _scan_into(value, found)
        elif isinstance(value, dict):
            _scan_into(value.values(), found)


def _scan(call_args: tuple, call_kwargs: dict) -> tuple[Any | None, bool]:
    """(the first CUDA tensor argument or None, whether any tensor argument is not CUDA),
    looking into lists, tuples and dicts as the original did."""
    found: list = [None, False]
    _scan_into(call_args, found)
    if call_kwargs:
        _scan_into(call_kwargs.values(), found)
    return found[0], found[1]


def _auto_device(
    export_name: str, has_cuda: bool, call_args: tuple, call_kwargs: dict
) -> tuple[str, Any | None]:
    """``device="auto"``: ("cuda", its first CUDA tensor or None) or ("cpu", None), as
    the original chose: by the tensors' device (ValueError if CPU and CUDA tensors are
    mixed); without tensors, CUDA if there are CUDA sources or a GPU is visible."""
    cuda_tensor, other = _scan(call_args, call_kwargs)
    if cuda_tensor is not None and other:
        raise ValueError(
            f"@jit kernel {export_name!r}: device='auto' cannot choose between CPU and CUDA "
            "tensors in one call; move them to one device or pass device='cpu' or 'cuda' "
            "to @jit"
        )
    if cuda_tensor is not None:
        return "cuda", cuda_tensor
    if other:
        return "cpu", None
    if has_cuda:
        return "cuda", None
    return ("cuda" if torch.cuda.is_available() else "cpu"), None


def _register_variant(export_name: str, device: str, cpp_args: tuple[str, ...], load) -> None:
    """Adds ``cpp_args`` to the registry kernel ``export_name`` on ``device``.

    Kernels decorated with one func_name and different args (add_constant<1>,
    add_constant<2>, ...) are one registry kernel with a variant each; its builder
    holds each variant's loader (a fresh one once clear_jit_kernel_registry dropped it).
    """
    with _register_lock:
        entry = registry.find(export_name, device)
        table = getattr(entry.builder, "jit_variants", None) if entry else None
        if table is None and entry is not None and entry.builtin:
            # One of the package's kernels has this name (code copied from the original's
            # ops uses theirs): it keeps its place in show-config and precompile.
            return
        if table is None:
            table = {}

            @cache_once
            def build_variant(*variant: str) -> Any:
                return table[variant]()

            build_variant.jit_variants = table
        else:
            build_variant = entry.builder
        table[cpp_args] = load
        registry.register_kernel(export_name, device=device, variants=list(table), builtin=False)(
            build_variant
        )


def _wrappers(
    export_name: str,
    cpp_args: tuple[str, ...],
    cpp_wrappers: Sequence[tuple[str, str]] | None,
    cuda_wrappers: Sequence[tuple[str, str]] | None,
    has_cuda_files: bool,
) -> tuple[list, list, list]:
    """(CPU build's cpp wrappers, CUDA build's cpp wrappers, CUDA build's cuda wrappers).

    When neither list is given, ``(export_name, "export_name<args>")`` is the one
    wrapper, exported from the CUDA sources of a CUDA build that has them, else from
    the C++ sources.
    """
    if cpp_wrappers is not None or cuda_wrappers is not None:
        given_cpp, given_cuda = list(cpp_wrappers or ()), list(cuda_wrappers or ())
        return given_cpp, given_cpp, given_cuda
    expression = f"{export_name}<{', '.join(cpp_args)}>" if cpp_args else export_name
    default = [(export_name, expression)]
    return default, ([] if has_cuda_files else default), (default if has_cuda_files else [])


def jit(
    *,
    args: Any = None,
    device: Device = "auto",
    func_name: str | None = None,
    cpp_files: Sequence[str | Path] | None = None,
    cuda_files: Sequence[str | Path] | None = None,
    cpp_wrappers: Sequence[tuple[str, str]] | None = None,
    cuda_wrappers: Sequence[tuple[str, str]] | None = None,
    extra_cxx_flags: Sequence[str] | None = None,
    extra_cuda_cxx_flags: Sequence[str] | None = None,
    extra_ld_flags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str | Path] | None = None,
    use_highway: bool = True,
    build_directory: str | None = None,
) -> Callable[[F], F]:
    """Compiles a kernel module on the first call and passes it as the first argument.

    - ``args``: template arguments (one value or a list; see :func:`make_cpp_args`).
    - ``func_name``: the export name (default: the function's name); it also names the
      module in the cache, ``show-config`` and ``precompile``.
    - ``cpp_files`` / ``cuda_files``: sources, relative ones looked up in the package's
      kernel sources, then the current directory (absolute paths are safest).
    - ``cpp_wrappers`` / ``cuda_wrappers``: ``(export_name, C++ expression)`` pairs;
      when neither is given, ``(func_name, "func_name<args>")`` (``"func_name"``
      without args) is exported from the CUDA sources if there are any, else the C++ ones.
    - ``device``: ``"cpu"``, ``"cuda"`` or ``"auto"``: CUDA when a tensor argument is on a
      GPU (it must then have CUDA sources), CPU when they are on the CPU, and without
      tensor arguments CUDA if it has CUDA sources or a GPU is visible. CUDA modules are
      compiled for the GPU of the first CUDA tensor argument.
    - ``extra_cxx_flags`` / ``extra_cuda_cxx_flags`` / ``extra_ld_flags`` /
      ``extra_include_paths``: added to the defaults.
    - ``use_highway``: accepted and has no effect: this package does not use Highway (a
      kernel that includes ``hwy/`` headers adds their directory to extra_include_paths).
    - ``build_directory``: cache the module under this directory instead of the cache
      root, with the same locking, atomic install and corruption checks
      (``show-config`` and ``precompile`` still look under the cache root).

    >>> @jit(args=16, device="cpu", cpp_files=["/abs/my_kernel.cpp"],
    ...      cpp_wrappers=[("my_kernel", "my_namespace::my_kernel<16>")],
    ...      func_name="my_kernel")  # doctest: +SKIP
    ... def _my_kernel_16(compiled_module, dst, src):
    ...     compiled_module.my_kernel(dst, src)
    """
    if device not in _DEVICES:
        raise ValueError(f"@jit: device must be one of {_DEVICES}, got {device!r}")
    lists = {
        "cpp_files": cpp_files,
        "cuda_files": cuda_files,
        "extra_cxx_flags": extra_cxx_flags,
        "extra_cuda_cxx_flags": extra_cuda_cxx_flags,
        "extra_ld_flags": extra_ld_flags,
        "extra_include_paths": extra_include_paths,
    }
    for arg, value in lists.items():
        loader.check_list(value, arg, "@jit: ")
    cpp_args = tuple(make_cpp_args(*_template_args(args)))
    has_cuda = bool(cuda_files or cuda_wrappers)

    def decorate(fn: F) -> F:
        export_name = check_module_name(func_name or fn.__name__)
        cpu_wrappers, gpu_cpp_wrappers, gpu_cuda_wrappers = _wrappers(
            export_name, cpp_args, cpp_wrappers, cuda_wrappers, bool(cuda_files)
        )

        def load_cpu() -> Any:
            return loader.load_cpu_jit(
                export_name,
                *cpp_args,
                cpp_files=cpp_files or (),
                cpp_wrappers=cpu_wrappers,
                extra_cxx_flags=extra_cxx_flags,
                extra_ldflags=extra_ld_flags,
                extra_include_paths=extra_include_paths,
                build_directory=build_directory,
            )

        def load_cuda(device_index: int | None = None) -> Any:
            return loader.load_cuda_jit(
                export_name,
                *cpp_args,
                cpp_files=cpp_files,
                cuda_files=cuda_files,
                cpp_wrappers=gpu_cpp_wrappers,
                cuda_wrappers=gpu_cuda_wrappers,
                extra_cxx_flags=extra_cxx_flags,
                extra_cuda_flags=extra_cuda_cxx_flags,
                extra_ldflags=extra_ld_flags,
                extra_include_paths=extra_include_paths,
                device_index=device_index,
                build_directory=build_directory,
            )

        cpu_module = cache_once(load_cpu)
        # One memo per device index: the index is the CUDA build's input (its arch).
        cuda_modules = ModuleMemo("cuda", lambda index: load_cuda(index))
        if device == "auto":  # the devices it has sources for
            targets = [
                d for d, ok in (("cpu", cpp_files or not has_cuda), ("cuda", has_cuda)) if ok
            ]
        else:
            targets = [device]
        for target in targets:
            # The plain loaders: reading a spec (show-config, precompile) reaches the loader.
            _register_variant(
                export_name, target, cpp_args, {"cpu": load_cpu, "cuda": load_cuda}[target]
            )
        info = {
            "key": (
                f"{fn.__module__}.{fn.__qualname__}|export={export_name}|device={device}|"
                f"template={','.join(cpp_args) if cpp_args else '-'}"
            ),
            "module": fn.__module__,
            "qualified_name": fn.__qualname__,
            "export_name": export_name,
            "decorator_device": device,
            "has_cuda_config": has_cuda,
            "template_args": cpp_args,
            "cpp_files": tuple(map(str, cpp_files or ())),
            "cuda_files": tuple(map(str, cuda_files or ())),
            "cpp_wrappers": tuple(map(tuple, gpu_cpp_wrappers if has_cuda else cpu_wrappers)),
            "cuda_wrappers": tuple(map(tuple, gpu_cuda_wrappers)),
            "use_highway": use_highway,
            "build_directory": build_directory,
        }
        registry.register_jit_kernel(info, entries=[(export_name, t) for t in targets])

        def module(target: str, cuda_tensor: Any) -> Any:
            if target == "cuda":
                if not has_cuda:
                    raise ValueError(
                        f"@jit kernel {export_name!r}: the call resolved to CUDA (device="
                        f"{device!r}) but the kernel has no CUDA sources; give it "
                        "cuda_files/cuda_wrappers, or device='cpu'"
                    )
                if cuda_tensor is not None:
                    return cuda_modules[cuda_tensor.get_device()]
                return cuda_modules.current()
            return cpu_module()

        @functools.wraps(fn)
        def call(*call_args: Any, **call_kwargs: Any) -> Any:
            if device == "cpu":
                return fn(cpu_module(), *call_args, **call_kwargs)
            if device == "cuda":
                tensor, _ = _scan(call_args, call_kwargs)
                return fn(module("cuda", tensor), *call_args, **call_kwargs)
            target, tensor = _auto_device(export_name, has_cuda, call_args, call_kwargs)
            return fn(module(target, tensor), *call_args, **call_kwargs)

        return call  # type: ignore[return-value]

    return decorate
