"""The original mllm-kernel beside ours in one process, for the benchmarks that compare
against it (bench_gdn, bench_quant_gemm).

The original is a source tree (``--original``, by default :data:`DEFAULT_ROOT`) whose
package is also named ``mllm_kernel``. :func:`original_modules` imports from it for the
length of a ``with`` block; :func:`load_original` takes one function out of it, built by
its own JIT (tvm-ffi's ``load_inline``) on a first call inside the block, so that the
function keeps working once ours is ``mllm_kernel`` again::

    gemm = load_original(root, "mllm_kernel.cuda.jit.gptq_marlin", "gptq_marlin_gemm",
                         example, "bench_quant_gemm")
    if gemm is None:  # the reason is on stderr; the column stays '-'
        ...

Some of its builds take many minutes (its gptq_marlin_gemm: every kernel of a dtype in
one translation unit, about 25 minutes of one core). A benchmark with a time limit builds
it first in a process of its own, :func:`build_in_child`, and loads it (then a quick load
from its JIT's cache) only if that finished in time. Or the build runs beforehand on a
machine without a GPU, for the GPU's arch, and the GPU machine loads its product::

    python benchmarks/original_peer.py prebuild-marlin _peers/original-sm90 --arch 9.0
    MLLM_ORIGINAL_PREBUILT=_peers/original-sm90 python benchmarks/bench_quant_gemm.py

(:func:`prebuilt_modules`: a module of the original's JIT whose shared library lies in
that folder is loaded from it instead of being built.)
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
# Where the original's checkout sits beside ours (ignored by git).
DEFAULT_ROOT = REPO / "_peers" / "mllm-kernel"


def default_root() -> Path | None:
    """:data:`DEFAULT_ROOT` where it holds the original's package, else None (a
    benchmark then runs without the original's column)."""
    return DEFAULT_ROOT if (DEFAULT_ROOT / "mllm_kernel" / "__init__.py").is_file() else None


class _OriginalFinder(importlib.abc.MetaPathFinder):
    """Resolves ``mllm_kernel`` and its submodules to the original's source tree (a
    package of the same name), ahead of any other finder (an editable install of ours)."""

    def __init__(self, root: Path) -> None:
        self.package = root / "mllm_kernel"

    def find_spec(self, name, path=None, target=None):
        if name == "mllm_kernel":
            return importlib.util.spec_from_file_location(
                name, self.package / "__init__.py", submodule_search_locations=[str(self.package)]
            )
        if name.startswith("mllm_kernel."):
            parent = sys.modules[name.rpartition(".")[0]]
            return importlib.machinery.PathFinder.find_spec(name, parent.__path__)
        return None


@contextlib.contextmanager
def original_modules(root: Path) -> Iterator[None]:
    """Inside: ``import mllm_kernel...`` imports the original's modules; after: ours
    again. The original's functions keep their own modules (their globals), so they work
    after the block as long as its JIT built them inside it (a first call)."""

    def ours(name: str) -> bool:
        return name == "mllm_kernel" or name.startswith("mllm_kernel.")

    saved = {name: module for name, module in sys.modules.items() if ours(name)}
    for name in saved:
        del sys.modules[name]
    finder = _OriginalFinder(root)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(saved)


# A folder of the original's JIT products built elsewhere (see the module's docstring).
PREBUILT_ENV = "MLLM_ORIGINAL_PREBUILT"


@contextlib.contextmanager
def _load_inline_wrapped(wrap: Callable[..., object]) -> Iterator[None]:
    """Inside: tvm-ffi's ``load_inline`` (which the original's JIT calls for each of its
    modules) is ``wrap(build, name, *args, **kwargs)``, ``build`` the real one."""
    import tvm_ffi.cpp

    build = tvm_ffi.cpp.load_inline
    tvm_ffi.cpp.load_inline = lambda name, *args, **kwargs: wrap(build, name, *args, **kwargs)
    try:
        yield
    finally:
        tvm_ffi.cpp.load_inline = build


@contextlib.contextmanager
def prebuilt_modules(folder: str | None) -> Iterator[None]:
    """Inside: a module of the original's JIT whose ``<folder>/<name>.so`` exists is
    loaded from it instead of being built; nothing changes without a folder."""
    if not folder:
        yield
        return
    import tvm_ffi

    def load_prebuilt(build, name: str, *args, **kwargs):
        library = Path(folder) / f"{name}.so"
        if library.is_file():
            return tvm_ffi.load_module(str(library))
        return build(name, *args, **kwargs)

    with _load_inline_wrapped(load_prebuilt):
        yield


def prebuild_marlin(root: Path, folder: Path, arch: str) -> Path:
    """Builds the original's fp16 gptq_marlin_gemm (the one bench_quant_gemm times) for
    CUDA ``arch`` (``9.0``) without a GPU, and copies its shared library into ``folder``
    for :func:`prebuilt_modules`. Returns the copy. It forces the build through the
    original's ``jit`` decorator: the wrapper it returns closes over ``_load_module``."""
    os.environ["TVM_FFI_CUDA_ARCH_LIST"] = arch
    if "CUDA_HOME" not in os.environ:
        from mllm_kernel.jit_utils import toolchain

        os.environ["CUDA_HOME"] = str(toolchain.find_cuda().home)
    with original_modules(root):
        gptq_marlin = importlib.import_module("mllm_kernel.cuda.jit.gptq_marlin")
        wrapper = gptq_marlin._make_gptq_marlin_gemm_kernel(torch.float16)
        cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__ or (), strict=True))
        if "_load_module" not in cells:
            raise RuntimeError("the original's jit wrapper no longer closes over _load_module")
        captured: list[str] = []

        def record(build, name: str, *args, **kwargs):
            captured.append(str(Path(kwargs["build_directory"]) / f"{name}.so"))
            return build(name, *args, **kwargs)

        with _load_inline_wrapped(record):
            cells["_load_module"].cell_contents("cuda")
    if not captured:  # the original's own cache answered: its build folder is not known
        raise RuntimeError("the original's module was already loaded; run in a fresh process")
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(captured[0], folder))


def load_original(
    root: Path, module: str, name: str, example: dict, caller: str
) -> Callable[..., object] | None:
    """The original's function ``name`` of ``module``, built by a first call on the
    keyword arguments ``example`` and ready; None, with the reason on stderr (prefixed
    by ``caller``, the benchmark's name), where it cannot be had (an import or build
    failure)."""
    from mllm_kernel.jit_utils import toolchain

    # Its JIT (tvm-ffi's) finds the CUDA libraries from CUDA_HOME and the arch from
    # nvidia-smi: both set from what ours found, unless the caller set them.
    os.environ.setdefault("CUDA_HOME", str(toolchain.find_cuda().home))
    major, minor = torch.cuda.get_device_capability()
    os.environ.setdefault("TVM_FFI_CUDA_ARCH_LIST", f"{major}.{minor}")
    try:
        with original_modules(root), prebuilt_modules(os.environ.get(PREBUILT_ENV)):
            function = getattr(importlib.import_module(module), name)
            function(**example)
            torch.cuda.synchronize()
        return function
    except Exception:
        print(f"{caller}: the original's {name} from {root} is not available:", file=sys.stderr)
        traceback.print_exc()
        return None


def build_in_child(command: list[str], wait: float) -> str | None:
    """Runs ``command`` (a process that builds the original, by :func:`load_original`)
    in a process group of its own and waits up to ``wait`` seconds: None once it
    succeeded, else why not. One still running is stopped with its compilers (its
    group), so that nothing outlives the benchmark; a build the original's JIT finished
    before stays in its cache, where a later load finds it at once."""
    child = subprocess.Popen(command, start_new_session=True)
    try:
        status = child.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait()
        return f"its build did not finish in {wait:g} s and was stopped"
    return None if status == 0 else f"its build exited with status {status} (see stderr)"


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Builds the original's kernels ahead.")
    commands = parser.add_subparsers(dest="command", required=True)
    marlin = commands.add_parser(
        "prebuild-marlin", help="its fp16 gptq_marlin_gemm, for MLLM_ORIGINAL_PREBUILT"
    )
    marlin.add_argument("folder", type=Path, help="where the shared library goes")
    marlin.add_argument("--arch", required=True, help="the GPU's compute capability: 9.0")
    marlin.add_argument("--original", type=Path, default=DEFAULT_ROOT, help="its source tree")
    args = parser.parse_args()
    print(prebuild_marlin(args.original, args.folder, args.arch))


if __name__ == "__main__":
    main()
