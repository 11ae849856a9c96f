"""load_cpu_jit / load_cuda_jit: build (once) or find in the cache, then load."""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import tvm_ffi

from mllm_kernel.jit_utils import (
    build,
    build_inputs,
    cache,
    module_errors,
    paths,
    prebuilt,
    registry,
)
from mllm_kernel.jit_utils.cache_key import ModuleKey, module_key, toolchain_free_hash
from mllm_kernel.jit_utils.cpp_args import to_cpp_arg
from mllm_kernel.jit_utils.cuda_arch import CudaArch, resolve_cuda_archs
from mllm_kernel.jit_utils.errors import KernelBuildError, ToolchainError
from mllm_kernel.jit_utils.logging_setup import get_logger
from mllm_kernel.jit_utils.spec import BuildSpec, Wrapper, check_module_name, check_one_line
from mllm_kernel.jit_utils.status import BuildOutcome, CacheState

_logger = get_logger()

# -march=native: CPU kernels are built for the machine they run on (the host
# ISA then joins the cache key), so the compiler can vectorise for it.
DEFAULT_CXX_FLAGS = ("-std=c++20", "-O3", "-fPIC", "-fvisibility=hidden", "-march=native")


def host_vector_flags(machine: str | None = None) -> tuple[str, ...]:
    """The vector-width flags CPU modules get on ``machine`` (default: this one's).

    x86: the full vector width where the host has AVX-512 (GCC otherwise stops at 256
    bits); an x86-only option, which an AArch64 g++ rejects. AArch64 (NEON is 128 bits,
    SVE's width is the hardware's) and others: none.

    >>> host_vector_flags("x86_64"), host_vector_flags("aarch64")
    (('-mprefer-vector-width=512',), ())
    """
    machine = (machine or platform.machine()).lower()
    return ("-mprefer-vector-width=512",) if machine in ("x86_64", "amd64") else ()


# OpenMP (threads and `omp simd`) for every CPU module, and the host's vector flags.
DEFAULT_CPU_OPENMP_FLAGS = ("-fopenmp", *host_vector_flags())
DEFAULT_CPU_LDFLAGS = ("-fopenmp",)
DEFAULT_CUDA_HOST_CXX_FLAGS = ("-std=c++20", "-O3", "-fPIC", "-fvisibility=hidden")
DEFAULT_CUDA_FLAGS = (
    "-std=c++20",
    "-O3",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-fvisibility=hidden",
    "--expt-relaxed-constexpr",
)

WrapperList = Sequence[tuple[str, str]] | None


def resolve_source(path: str | Path, device: str) -> Path:
    """An absolute source path; relative ones are looked up in the package's
    ``<device>`` kernel directory, then the current directory."""
    path = Path(path)
    if path.is_absolute():
        if path.is_file():
            return path
        raise FileNotFoundError(f"kernel source {path} does not exist")
    looked = []
    package_dir = paths.kernel_source_dir(device)
    for base in ([package_dir] if package_dir else []) + [Path.cwd()]:
        candidate = base / path
        looked.append(str(candidate))
        if candidate.is_file():
            return candidate.resolve()
    note = (
        ""
        if package_dir
        else (
            f" (this install has no {device} kernel sources: it was built with "
            f"MLLM_KERNEL_BUILD_{device.upper()}=OFF)"
        )
    )
    raise FileNotFoundError(
        f"kernel source {str(path)!r} not found; looked in: {', '.join(looked)}{note}"
    )


def _template_args(args: Iterable[Any]) -> tuple[str, ...]:
    out = []
    for arg in args:
        text = arg if isinstance(arg, str) else to_cpp_arg(arg)
        out.append(check_one_line(text, "template argument"))
    return tuple(out)


def _wrappers(wrappers: WrapperList, what: str) -> tuple[Wrapper, ...]:
    result = []
    for item in wrappers or ():
        if not (
            isinstance(item, (tuple, list))
            and len(item) == 2
            and all(isinstance(part, str) for part in item)
        ):
            raise TypeError(
                f"each of {what} must be (export_name, cpp_expression), two str, got {item!r}"
            )
        result.append(Wrapper(item[0], item[1]))
    return tuple(result)


def _paths(items: Iterable[str | Path] | None) -> tuple[Path, ...]:
    return tuple(Path(p).absolute() for p in items or ())


# The list arguments that name files or directories (str or path items); the others
# hold flags (str items).
_PATH_LISTS = frozenset({"cpp_files", "cuda_files", "extra_include_paths"})


def check_list(value: Any, name: str, where: str = "") -> None:
    """TypeError naming ``name`` when ``value`` is a str, bytes or path where a list of
    them belongs (iterated, a str would give one file or flag per character), or a list
    or tuple with an item of another type than its kind takes (paths: str or
    os.PathLike, for the file and directory lists; flags: str).

    ``where`` prefixes the message (``"@jit: "``)."""
    if isinstance(value, str | bytes | os.PathLike):
        shown = str(value) if isinstance(value, os.PathLike) else value
        raise TypeError(
            f"{where}{name} must be a list, e.g. {name}=[{shown!r}], but got a "
            f"{type(value).__name__} (a str would be read one character at a time)"
        )
    kinds, wanted = (
        ((str, os.PathLike), "a str or a path") if name in _PATH_LISTS else (str, "a str")
    )
    for item in value if isinstance(value, list | tuple) else ():
        if not isinstance(item, kinds):
            raise TypeError(
                f"{where}{name}: each item must be {wanted}, but got {item!r} "
                f"({type(item).__name__})"
            )


def _check_build_directory(build_directory: str | Path | None) -> None:
    """ValueError when ``build_directory``, or a directory it would be created in, is an
    existing file: it is likely the user's own (a source, say) and is left alone."""
    if build_directory is None:
        return
    path = Path(build_directory).expanduser().absolute()
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            return
        if candidate.exists():
            where = "" if candidate == path else f" (it would be created inside {candidate})"
            raise ValueError(
                f"build_directory must be a directory, but {str(candidate)!r} is a file"
                f"{where}: pass the path of a directory (existing, or one to create)"
            )


def _either(ours: Any, theirs: Any, our_name: str, their_name: str) -> Any:
    """One of two spellings of a keyword (ours, or the original mllm-kernel's)."""
    if ours is not None and theirs is not None:
        raise TypeError(f"give {our_name} or {their_name} (the same option), not both")
    return ours if ours is not None else theirs


def load_cpu_jit(
    name: str,
    *template_args: Any,
    cpp_files: Sequence[str | Path],
    cpp_wrappers: WrapperList,
    extra_cxx_flags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str | Path] | None = None,
    extra_ld_flags: Sequence[str] | None = None,
    use_highway: bool = True,
    build_directory: str | Path | None = None,
) -> tvm_ffi.Module:
    """Builds (or loads from the cache) a CPU module and returns it, a
    :class:`tvm_ffi.Module` whose exports are its attributes.

    Each ``(export_name, cpp_expression)`` in ``cpp_wrappers`` becomes
    ``module.export_name``. Template arguments are only recorded (for the cache
    directory name and the registry); put them into the expressions yourself::

        args = make_cpp_args(16)
        mod = load_cpu_jit("my_kernel", *args, cpp_files=["my_kernel.cpp"],
                           cpp_wrappers=[("my_kernel", f"my_ns::my_kernel<{args}>")])
        mod.my_kernel(x, y)

    ``build_directory`` caches this module under that directory instead of the cache
    root (same lock, atomic install and checks). The original mllm-kernel's keyword
    names work too: ``extra_ld_flags`` (= ``extra_ldflags``), and ``use_highway``,
    accepted without effect (no kernel here uses Highway).

    Raises FileNotFoundError (a source), TypeError (a str where a list belongs, such as
    ``cpp_files="k.cpp"``), ValueError (a ``build_directory`` that is a file, a source
    path holding a double quote or a line break), ToolchainError (no compiler),
    KernelBuildError (the compiler failed; the message leads with its first error).
    """
    del use_highway
    check_list(extra_ld_flags, "extra_ld_flags")
    _check_build_directory(build_directory)
    ldflags = _either(extra_ldflags, extra_ld_flags, "extra_ldflags", "extra_ld_flags")
    spec = cpu_spec(
        name,
        *template_args,
        cpp_files=cpp_files,
        cpp_wrappers=cpp_wrappers,
        extra_cxx_flags=extra_cxx_flags,
        extra_ldflags=ldflags,
        extra_include_paths=extra_include_paths,
    )
    # User modules only: their exports name the C++ parameter in argument errors.
    return module_errors.name_arguments(load_spec(spec, build_directory), spec)


def cpu_spec(
    name: str,
    *template_args: Any,
    cpp_files: Sequence[str | Path],
    cpp_wrappers: WrapperList,
    extra_cxx_flags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str | Path] | None = None,
) -> BuildSpec:
    """The BuildSpec :func:`load_cpu_jit` loads for these arguments; nothing is built.

    The loader's defaults come first: C++20, -O3, -march=native, OpenMP (see
    ``DEFAULT_CPU_OPENMP_FLAGS``); extra flags follow, so they can override them.
    """
    check_module_name(name)
    lists = {
        "cpp_files": cpp_files,
        "extra_cxx_flags": extra_cxx_flags,
        "extra_ldflags": extra_ldflags,
        "extra_include_paths": extra_include_paths,
    }
    for arg, value in lists.items():
        check_list(value, arg)
    if not cpp_files:
        raise ValueError(
            f"cpp_files: no source file given for module {name!r}; pass the files "
            "that define what the wrappers call"
        )
    return BuildSpec(
        name=name,
        device="cpu",
        template_args=_template_args(template_args),
        cpp_files=tuple(resolve_source(p, "cpu") for p in cpp_files or ()),
        cpp_wrappers=_wrappers(cpp_wrappers, "cpp_wrappers"),
        cxx_flags=(*DEFAULT_CXX_FLAGS, *DEFAULT_CPU_OPENMP_FLAGS, *(extra_cxx_flags or ())),
        ldflags=(*DEFAULT_CPU_LDFLAGS, *(extra_ldflags or ())),
        include_paths=_paths(extra_include_paths),
    )


def load_cuda_jit(
    name: str,
    *template_args: Any,
    cpp_files: Sequence[str | Path] | None = None,
    cuda_files: Sequence[str | Path] | None = None,
    cpp_wrappers: WrapperList = None,
    cuda_wrappers: WrapperList = None,
    extra_cxx_flags: Sequence[str] | None = None,
    extra_cuda_flags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str | Path] | None = None,
    device_index: int | None = None,
    extra_cuda_cxx_flags: Sequence[str] | None = None,
    extra_ld_flags: Sequence[str] | None = None,
    build_directory: str | Path | None = None,
) -> tvm_ffi.Module:
    """Builds (or loads from the cache) a CUDA module and returns the tvm-ffi module.

    Like :func:`load_cpu_jit`, with ``cuda_files`` compiled by nvcc and exported
    through ``cuda_wrappers``. The target arch comes from
    ``MLLM_KERNEL_CUDA_ARCH_LIST`` / ``TORCH_CUDA_ARCH_LIST``, else the GPU
    ``device_index`` (default: torch's current device); see :mod:`.cuda_arch`.
    ``build_directory`` and the original mllm-kernel's keyword names
    (``extra_cuda_cxx_flags`` = ``extra_cuda_flags``, ``extra_ld_flags`` =
    ``extra_ldflags``) as for :func:`load_cpu_jit`.
    """
    check_list(extra_cuda_cxx_flags, "extra_cuda_cxx_flags")
    check_list(extra_ld_flags, "extra_ld_flags")
    _check_build_directory(build_directory)
    cuda_flags = _either(
        extra_cuda_flags, extra_cuda_cxx_flags, "extra_cuda_flags", "extra_cuda_cxx_flags"
    )
    ldflags = _either(extra_ldflags, extra_ld_flags, "extra_ldflags", "extra_ld_flags")
    spec = cuda_spec(
        name,
        *template_args,
        cpp_files=cpp_files,
        cuda_files=cuda_files,
        cpp_wrappers=cpp_wrappers,
        cuda_wrappers=cuda_wrappers,
        extra_cxx_flags=extra_cxx_flags,
        extra_cuda_flags=cuda_flags,
        extra_ldflags=ldflags,
        extra_include_paths=extra_include_paths,
        device_index=device_index,
    )
    # User modules only: their exports name the C++ parameter in argument errors.
    return module_errors.name_arguments(load_spec(spec, build_directory), spec)


def cuda_spec(
    name: str,
    *template_args: Any,
    cpp_files: Sequence[str | Path] | None = None,
    cuda_files: Sequence[str | Path] | None = None,
    cpp_wrappers: WrapperList = None,
    cuda_wrappers: WrapperList = None,
    extra_cxx_flags: Sequence[str] | None = None,
    extra_cuda_flags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    extra_include_paths: Sequence[str | Path] | None = None,
    device_index: int | None = None,
    cuda_archs: tuple[CudaArch, ...] | None = None,
) -> BuildSpec:
    """The BuildSpec :func:`load_cuda_jit` loads for these arguments, for ``cuda_archs``
    (default: the archs resolved for GPU ``device_index``, see :mod:`.cuda_arch`);
    nothing is built."""
    check_module_name(name)
    lists = {
        "cpp_files": cpp_files,
        "cuda_files": cuda_files,
        "extra_cxx_flags": extra_cxx_flags,
        "extra_cuda_flags": extra_cuda_flags,
        "extra_ldflags": extra_ldflags,
        "extra_include_paths": extra_include_paths,
    }
    for arg, value in lists.items():
        check_list(value, arg)
    if not cpp_files and not cuda_files:
        raise ValueError(
            f"cpp_files, cuda_files: no source file given for module {name!r}; "
            "pass the files that define what the wrappers call"
        )
    return BuildSpec(
        name=name,
        device="cuda",
        template_args=_template_args(template_args),
        cpp_files=tuple(resolve_source(p, "cuda") for p in cpp_files or ()),
        cuda_files=tuple(resolve_source(p, "cuda") for p in cuda_files or ()),
        cpp_wrappers=_wrappers(cpp_wrappers, "cpp_wrappers"),
        cuda_wrappers=_wrappers(cuda_wrappers, "cuda_wrappers"),
        cxx_flags=(*DEFAULT_CUDA_HOST_CXX_FLAGS, *(extra_cxx_flags or ())),
        cuda_flags=(*DEFAULT_CUDA_FLAGS, *(extra_cuda_flags or ())),
        ldflags=tuple(extra_ldflags or ()),
        include_paths=_paths(extra_include_paths),
        cuda_archs=cuda_archs or resolve_cuda_archs(device_index),
    )


def load_spec(spec: BuildSpec, build_directory: str | Path | None = None) -> tvm_ffi.Module:
    """Loads ``spec``'s module: from a read-only cache (``MLLM_KERNEL_CACHE_PATH``, a cache package;
    no toolchain needed) or the writable cache if valid there, else builds it first.
    With ``build_directory``, that directory is the module's cache (no prebuilt lookup).
    Without a toolchain, a writable-cache entry built before it went away is loaded."""
    if registry.capture(spec):  # registry.builder_spec reads a hand-written builder's spec
        return spec
    if build_directory is not None:
        root = Path(build_directory).expanduser().absolute()
        try:
            key = module_key(spec, root)
        except ToolchainError as missing:
            return _load_without_toolchain(spec, root, missing)
        found = cache.lookup(key)
        module = _try_load(found.artifact, spec) if found.status is CacheState.HIT else None
        if module is not None:
            registry.record_loaded(spec)
            return module
        return build_and_load(spec, key)
    found = prebuilt.find(spec)
    if found is not None:
        module = _try_load(found.artifact, spec)
        if module is not None:
            registry.record_loaded(spec)
            return module
    try:
        key = module_key(spec)
    except ToolchainError as missing:
        return _load_without_toolchain(spec, None, missing)
    found = cache.lookup(key)
    if found.status is CacheState.HIT:
        module = _try_load(found.artifact, spec)
        if module is not None:
            registry.record_loaded(spec)
            return module
    return build_and_load(spec, key)


def _load_without_toolchain(
    spec: BuildSpec, root: Path | None, missing: ToolchainError
) -> tvm_ffi.Module:
    """``spec``'s module from the writable cache ``root`` (None: the default), built
    before the toolchain went away; else ToolchainError: a build needs it."""
    found = cache.lookup_without_toolchain(spec, root)
    if found.status is CacheState.HIT:
        module = _try_load(found.artifact, spec)
        if module is not None:
            registry.record_loaded(spec)
            return module
        why = "its library does not load"
    elif found.status is CacheState.MISSING:
        why = "not built"
    else:
        why = f"{found.status}: {found.reason}"
    raise ToolchainError(
        f"{spec.describe()}: no valid cached build ({why}), and building one needs the "
        f"compiler: {missing}"
    ) from None


def _try_load(artifact: Path, spec: BuildSpec) -> tvm_ffi.Module | None:
    try:
        _check_symbols(artifact, spec)  # an entry cached before it was checked so
        module = tvm_ffi.load_module(str(artifact))
        for export in spec.exports:
            module.get_function(export)
    except Exception as exc:  # a cached .so that cannot load is treated as corrupt
        _logger.warning("cached %s failed to load (%s); rebuilding", artifact, exc)
        return None
    return module


def build_and_load(spec: BuildSpec, key: ModuleKey | None = None) -> tvm_ffi.Module:
    """Builds ``spec`` under the cross-process lock (unless another process just
    did), installs it atomically and returns the loaded module."""
    _, module = _locked_build(spec, key or module_key(spec), load=True)
    return module


def build_into_cache(spec: BuildSpec, key: ModuleKey | None = None) -> BuildOutcome:
    """Like :func:`build_and_load` but never loads the module (for precompiling
    where it cannot load, e.g. a CUDA module without a driver). Returns
    ``CACHED`` if a valid build was already there, else ``BUILT``."""
    status, _ = _locked_build(spec, key or module_key(spec), load=False)
    return status


def _manifest(spec: BuildSpec, key: ModuleKey, result: build.BuildResult) -> cache.Manifest:
    return cache.Manifest(
        name=spec.name,
        device=spec.device,
        template_args=list(spec.template_args),
        key_hash=key.hash,
        artifact=result.artifact.name,
        artifact_size=result.artifact.stat().st_size,
        artifact_sha256=build_inputs.file_digest(result.artifact),
        deps=result.inputs.deps,
        toolchain_deps=result.inputs.toolchain_deps,
        include_search=result.inputs.include_search,
        exports=list(spec.exports),
        built_at=time.time(),
        build_seconds=round(result.seconds, 3),
        toolchain=result.toolchain,
        cuda_archs=[str(a) for a in spec.cuda_archs],
        toolchain_free_hash=toolchain_free_hash(spec),
    )


def _check_symbols(artifact: Path, spec: BuildSpec) -> None:
    """KernelBuildError unless every symbol the new library needs resolves now: loaded
    lazily, a missing one (a function declared but whose source was left out) would end
    the process at its first call, and every later run would load the cached library
    and end the same way."""
    try:
        ctypes.CDLL(str(artifact), mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        first = str(exc).splitlines()[0]
        if "cannot open shared object" in first:
            hint = (
                "a library it links is not found at load time: add -Wl,-rpath,<its "
                "directory> to extra_ldflags, or put the directory on LD_LIBRARY_PATH"
            )
        else:
            hint = (
                "a symbol is declared but not defined: is a source file missing from "
                "cpp_files/cuda_files, or a library from extra_ldflags?"
            )
        raise KernelBuildError(
            f"module {spec.name!r} built but cannot load: {first}. Hint: {hint}",
            module=spec.name,
            template_args=spec.template_args,
            first_error=first,
            log_path="",
            hint=hint,
        ) from None


def _load_checked(artifact: Path, spec: BuildSpec) -> tvm_ffi.Module:
    _check_symbols(artifact, spec)
    module = tvm_ffi.load_module(str(artifact))
    missing = [e for e in spec.exports if not module.implements_function(e)]
    if missing:
        raise KernelBuildError(
            f"module {spec.name!r} built but does not export {missing}",
            module=spec.name,
            template_args=spec.template_args,
            first_error=f"missing exports {missing}",
            log_path="",
        )
    return module


def _locked_build(
    spec: BuildSpec, key: ModuleKey, *, load: bool
) -> tuple[BuildOutcome, tvm_ffi.Module | None]:
    """``(CACHED or BUILT, module or None)``; the module only when ``load``."""
    try:
        return _locked_build_unchecked(spec, key, load=load)
    except OSError as exc:
        error = build.cache_write_error(spec, exc)
        if error is None:
            raise
        raise error from exc


def _locked_build_unchecked(
    spec: BuildSpec, key: ModuleKey, *, load: bool
) -> tuple[BuildOutcome, tvm_ffi.Module | None]:
    with cache.module_lock(key, purpose=f"building {spec.describe()}"):
        found = cache.lookup(key)
        if found.status is CacheState.HIT:
            module = _try_load(found.artifact, spec) if load else None
            if module is not None or not load:
                if load:
                    registry.record_loaded(spec)
                return BuildOutcome.CACHED, module
        elif found.status is CacheState.CORRUPT:
            _logger.warning("cache entry %s is corrupt (%s); rebuilding", key.path, found.reason)
        elif found.status is CacheState.UNTRUSTED:
            _logger.warning("cache entry not loaded: %s. Rebuilding it privately.", found.reason)
        elif found.status is CacheState.STALE:
            _logger.info("rebuilding %s: %s", spec.describe(), found.reason)
        _logger.info("compiling %s ...", spec.describe())
        staging = cache.new_staging_dir(key)
        try:
            result = build.build(spec, staging, cache.failure_log_path(key))
            _manifest(spec, key, result).write(staging)
            # Load once from staging: a module that cannot load never reaches the cache.
            module = _load_checked(result.artifact, spec) if load else None
            cache.install(staging, key)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    _logger.info("built %s in %.1fs: %s", spec.describe(), result.seconds, key.path)
    if load:
        registry.record_loaded(spec)
    return BuildOutcome.BUILT, module
