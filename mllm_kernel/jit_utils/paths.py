"""Where the package's headers, kernel sources and CMake config are.

An installed wheel carries them inside the package (``include/``,
``<device>/sources/``, ``share/cmake/``); a source checkout (``PYTHONPATH=.``
or an editable install) has them at ``include/`` and ``<device>/csrc/``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from mllm_kernel.jit_utils.spec import DEVICES

PACKAGE_DIR = Path(__file__).resolve().parent.parent
_CHECKOUT_DIR = PACKAGE_DIR.parent


def include_dir() -> Path:
    """The directory holding ``mllm_kernel/*.hpp`` (to pass as ``-I``)."""
    for candidate in (PACKAGE_DIR / "include", _CHECKOUT_DIR / "include"):
        if (candidate / "mllm_kernel" / "utils.hpp").is_file():
            return candidate
    raise FileNotFoundError(
        f"mllm-kernel's C++ headers are missing: looked in {PACKAGE_DIR / 'include'} and "
        f"{_CHECKOUT_DIR / 'include'}. Reinstall the package (pip install mllm-kernel)."
    )


def kernel_source_dir(device: str) -> Path | None:
    """The package's kernel sources for ``device``, or None if not installed.

    A wheel built with ``MLLM_KERNEL_BUILD_<DEVICE>=OFF`` has none.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    for candidate in (PACKAGE_DIR / device / "csrc", PACKAGE_DIR / device / "sources"):
        if candidate.is_dir():
            return candidate
    return None


def cmake_dir() -> Path | None:
    """The directory holding ``MllmKernelConfig.cmake`` (installs only: a bare source
    checkout has none).

    Pass it to CMake as ``-DMllmKernel_DIR=...`` to ``find_package(MllmKernel)``.
    """
    import mllm_kernel

    # An editable install keeps what CMake installed in site-packages, one of the
    # package's __path__ entries, while the code runs from the checkout.
    for package_dir in (PACKAGE_DIR, *map(Path, mllm_kernel.__path__)):
        candidate = package_dir / "share" / "cmake" / "MllmKernel"
        if (candidate / "MllmKernelConfig.cmake").is_file():
            return candidate
    return None


def tvm_ffi_include_dirs() -> list[Path]:
    """tvm-ffi's and DLPack's include directories (deduplicated)."""
    from tvm_ffi import libinfo

    dirs: list[Path] = []
    for found in (libinfo.find_include_path(), libinfo.find_dlpack_include_path()):
        path = Path(found)
        if path not in dirs:
            dirs.append(path)
    return dirs


def tvm_ffi_library() -> Path:
    """The ``libtvm_ffi`` shared library every module links against."""
    from tvm_ffi import libinfo

    return Path(libinfo.find_libtvm_ffi())


@functools.cache  # where the package is does not change within a process
def anchors() -> dict[str, Path]:
    """The package's own file trees by a name that holds on every install: ``@include``
    (the headers) and ``@cpu`` / ``@cuda`` (the kernel sources, where installed).

    A source checkout and a wheel keep them at different places; a prebuilt cache
    names the files it was built from relative to these, so that it matches wherever
    the package is installed (see :func:`anchored`).
    """
    found = {"@include": include_dir()}
    for device in DEVICES:
        directory = kernel_source_dir(device)
        if directory is not None:
            found[f"@{device}"] = directory.resolve()
    return found


def anchored(path: str | Path) -> str:
    """``path`` as ``@anchor/relative`` when it is inside one of :func:`anchors`, else as
    the absolute path it is.

    >>> anchored(include_dir() / "mllm_kernel" / "utils.hpp")
    '@include/mllm_kernel/utils.hpp'
    """
    path = Path(path)
    for name, directory in anchors().items():
        if path.is_relative_to(directory):
            return f"{name}/{path.relative_to(directory).as_posix()}"
    return str(path)


def unanchored(text: str) -> Path:
    """The file :func:`anchored` named, in this install (FileNotFoundError for an anchor
    this install lacks, e.g. ``@cuda`` in a CPU-only wheel)."""
    if not text.startswith("@"):
        return Path(text)
    name, _, relative = text.partition("/")
    directory = anchors().get(name)
    if directory is None:
        raise FileNotFoundError(f"{text}: this install has no {name} files")
    return directory / relative
