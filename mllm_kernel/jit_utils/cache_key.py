"""The cache key of a module: one function, used by the loader and the CLI alike."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import tvm_ffi

from mllm_kernel import __version__
from mllm_kernel.jit_utils import env, paths, toolchain, trust
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


def uses_native_isa(spec: BuildSpec) -> bool:
    return any("native" in flag for flag in (*spec.cxx_flags, *spec.cuda_flags))


def key_material(spec: BuildSpec) -> dict:
    """Everything that changes the binary and is known before compiling.

    Source and header *contents* are not here: the manifest records the real
    include closure (from the compiler's dependency output) and the loader
    rebuilds when any of it changed or a name in it now resolves to another
    file (see :mod:`.include_search`). The include-path variables are here
    because they move headers in and out of the search path.
    """
    material = {
        "format": CACHE_FORMAT,
        "spec": asdict(spec),
        "cxx": toolchain.find_cxx().identity,
        "include_dirs": [str(paths.include_dir()), *map(str, paths.tvm_ffi_include_dirs())],
        "include_path_variables": env.include_path_variables(),
        "tvm_ffi": tvm_ffi.__version__,
        "mllm_kernel": __version__,
    }
    if spec.device == "cuda":
        cuda = toolchain.find_cuda()
        material["nvcc"] = cuda.identity
        material["cuda_lib_dir"] = str(cuda.lib_dir)
    if uses_native_isa(spec):
        material["host_isa"] = toolchain.host_isa()
    return material


def module_key(spec: BuildSpec) -> ModuleKey:
    digest = stable_hash(key_material(spec))
    return ModuleKey(hash=digest, dirname=spec.dirname(digest), root=trust.writable_root())
