"""The cache keys of a module: one function each, used by the loader and the CLI alike.

Two keys, for two kinds of cache:

* :func:`module_key`, for the writable cache this machine builds into: everything
  that changes the binary, this machine's compilers included (their real path,
  size and mtime), so that upgrading a compiler rebuilds. The rest of it,
  :func:`toolchain_free_hash`, is recorded in each entry's manifest: a process whose
  compiler was removed since finds the entry by it, and loads it as a prebuilt one.
* :func:`relocatable_key`, for prebuilt read-only caches (``MLLM_KERNEL_CACHE_PATH``,
  written by ``precompile --output``) built on another machine: what the binary is
  built *from* and *for*, nothing about where or with what. It needs no toolchain to
  compute, so a machine without one can look entries up.

What a prebuilt entry is checked against, before it is loaded:

=====================  ======================================================
key (exact match)      module name, device, template args, the wrapper
                       expressions, every flag (C++, CUDA, link), CUDA archs,
                       source files and ``extra_include_paths`` (the
                       package's own by their place in the package, ``@cpu/...``,
                       ``@include/...``; others by absolute path), tvm-ffi
                       and mllm-kernel versions, the machine (``x86_64``), and
                       for ``-march=native`` builds the host's ISA flags
manifest               sha256 of every source and header the build read
                       outside the toolchain (the package's re-anchored to
                       this install), the artifact's size and sha256
trust                  not writable by group or others (:mod:`.trust`)
=====================  ======================================================

Not checked: the compilers and the CUDA toolkit that built it (recorded in the
manifest's ``toolchain``; the headers they supply, libstdc++ and CUDA's, come with
them), include-path variables and header shadowing (they change what a compiler
here would see, and nothing is compiled here). An entry whose library cannot load
here (a libstdc++ or CUDA runtime too old) is skipped like a missing one.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import tvm_ffi

from mllm_kernel import __version__
from mllm_kernel.jit_utils import env, paths, toolchain, trust
from mllm_kernel.jit_utils.cache_names import entry_dirname
from mllm_kernel.jit_utils.spec import CACHE_FORMAT, BuildSpec, stable_hash


@dataclass(frozen=True)
class ModuleKey:
    """Where a spec's artifact lives: ``<cache root>/<dirname>``."""

    hash: str
    dirname: str
    root: Path

    @property
    def path(self) -> Path:
        return self.root / self.dirname

    def under(self, root: Path) -> ModuleKey:
        """The same key in another cache root."""
        return replace(self, root=root)


def uses_native_isa(spec: BuildSpec) -> bool:
    return any("native" in flag for flag in (*spec.cxx_flags, *spec.cuda_flags))


def toolchain_free_material(spec: BuildSpec) -> dict:
    """The part of :func:`key_material` that needs no toolchain to compute."""
    material = {
        "format": CACHE_FORMAT,
        "spec": asdict(spec),
        "include_dirs": [str(paths.include_dir()), *map(str, paths.tvm_ffi_include_dirs())],
        "include_path_variables": env.include_path_variables(),
        "tvm_ffi": tvm_ffi.__version__,
        "mllm_kernel": __version__,
    }
    if uses_native_isa(spec):
        material["host_isa"] = toolchain.host_isa()
    compiler_variables = env.compiler_variables()
    if compiler_variables:  # absent when none is set: earlier entries keep their keys
        material["compiler_variables"] = compiler_variables
    return material


def toolchain_free_hash(spec: BuildSpec) -> str:
    """The hash of :func:`toolchain_free_material`: how a writable entry is found once
    the compiler that built it is gone (:func:`.cache.lookup_without_toolchain`)."""
    return stable_hash(toolchain_free_material(spec))


def key_material(spec: BuildSpec) -> dict:
    """Everything that changes the binary and is known before compiling: the
    toolchain-free material and the compilers' identity (ToolchainError without them).

    Source and header *contents* are not here: the manifest records the real
    include closure (from the compiler's dependency output) and the loader
    rebuilds when any of it changed or a name in it now resolves to another
    file (see :mod:`.include_search`). The include-path variables are here
    because they move headers in and out of the search path.
    """
    material = toolchain_free_material(spec)
    material["cxx"] = toolchain.find_cxx().identity
    if spec.device == "cuda":
        cuda = toolchain.find_cuda()
        material["nvcc"] = cuda.identity
        material["cuda_lib_dir"] = str(cuda.lib_dir)
    return material


def module_key(spec: BuildSpec, root: Path | None = None) -> ModuleKey:
    """``spec``'s key in the cache ``root`` (default: the writable cache root, which is
    then chosen and checked; a ``build_directory`` needs neither)."""
    digest = stable_hash(key_material(spec))
    root = trust.writable_root() if root is None else root
    return ModuleKey(hash=digest, dirname=entry_dirname(spec, digest), root=root)


def relocatable_key_material(spec: BuildSpec) -> dict:
    """What a prebuilt entry is looked up by (see the module docstring): no toolchain,
    no path outside the package except those the user gave."""
    described = asdict(spec)
    for field_name in ("cpp_files", "cuda_files", "include_paths"):
        described[field_name] = [paths.anchored(p) for p in getattr(spec, field_name)]
    material = {
        "format": CACHE_FORMAT,
        "relocatable": True,
        "spec": described,
        "tvm_ffi": tvm_ffi.__version__,
        "mllm_kernel": __version__,
        "machine": platform.machine(),
    }
    if uses_native_isa(spec):
        material["host_isa"] = toolchain.host_isa()
    return material


def relocatable_key(spec: BuildSpec, root: Path) -> ModuleKey:
    """Where ``spec``'s entry is in the prebuilt cache ``root``."""
    digest = stable_hash(relocatable_key_material(spec))
    return ModuleKey(hash=digest, dirname=entry_dirname(spec, digest), root=root)
