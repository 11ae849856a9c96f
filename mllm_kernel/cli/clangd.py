"""A ``.clangd`` configuration that lets clangd understand mllm-kernel's C++ and CUDA.

The config adds ``-std=c++20`` and the include directories the JIT passes to
the compiler (tvm-ffi, DLPack, the package's headers), and a CUDA fragment for
``.cu``/``.cuh`` files (``-xcuda``, the GPU arch, the toolkit path).

>>> config = recommend()
>>> print(config.text)  # doctest: +SKIP
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mllm_kernel.jit_utils import paths, toolchain
from mllm_kernel.jit_utils.cuda_arch import choose_cuda_archs, parse_arch_list
from mllm_kernel.jit_utils.errors import CudaArchError, ToolchainError
from mllm_kernel.jit_utils.nvcc_archs import check_known

DEFAULT_CUDA_ARCH = "sm_90a"
# clangd's PathMatch is a regular expression over the file's path (anchored at both ends).
CUDA_PATH_MATCH = r".*\.cuh?"


@dataclass(frozen=True)
class ClangdConfig:
    """The recommended ``.clangd`` text and notes on how its values were chosen."""

    text: str
    cuda_arch: str
    cuda_arch_source: str
    cuda_path: Path | None
    notes: list[str] = field(default_factory=list)


def detect_cuda_arch() -> tuple[str, str]:
    """``(sm_XX, where it came from)``: the newest arch that
    :func:`~mllm_kernel.jit_utils.cuda_arch.choose_cuda_archs` picks (the loader's own
    order), else :data:`DEFAULT_CUDA_ARCH`: clangd needs some arch to parse CUDA."""
    try:
        archs, source = choose_cuda_archs()
    except CudaArchError:
        return DEFAULT_CUDA_ARCH, "default (no GPU or arch list found)"
    return f"sm_{max(archs).number}", source


def _yaml_list(items: list[str], indent: str = "    ") -> str:
    # Double-quoted YAML scalars: backslashes and quotes escaped, nothing else special.
    return "\n".join(
        f'{indent}- "{item.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for item in items
    )


def recommend(cuda_arch: str | None = None) -> ClangdConfig:
    """The recommended config; ``cuda_arch`` (``sm_80``, ``9.0a``...) overrides detection.

    Raises CudaArchError for a ``cuda_arch`` that does not parse or that nvcc does not
    compile for (:func:`~mllm_kernel.jit_utils.nvcc_archs.check_known`)."""
    notes: list[str] = []
    if cuda_arch:
        given = [check_known(a, "--cuda-arch") for a in parse_arch_list(cuda_arch)]
        arch = f"sm_{given[-1].number}"
        source = "given"
    else:
        arch, source = detect_cuda_arch()
    include_flags = [f"-isystem{p}" for p in paths.tvm_ffi_include_dirs()]
    include_flags.append(f"-isystem{paths.include_dir()}")
    cuda_flags = ["-xcuda", f"--cuda-gpu-arch={arch}"]
    try:
        cuda_path: Path | None = toolchain.find_cuda().home
        cuda_flags.append(f"--cuda-path={cuda_path}")
    except ToolchainError as exc:
        cuda_path = None
        notes.append(
            f"no CUDA toolkit found, so --cuda-path is left out (clangd will search itself): {exc}"
        )
    # clangd's clang may be older than the toolkit; it still parses the headers.
    cuda_flags.append("-Wno-unknown-cuda-version")
    lines = [
        "# clangd configuration for mllm-kernel sources, written by",
        "# `python -m mllm_kernel show-clangd-recommend-config`.",
        f"# CUDA arch {arch}: {source}.",
        "CompileFlags:",
        "  Add:",
        _yaml_list(["-std=c++20", *include_flags]),
        "---",
        "# .cu and .cuh files are CUDA (clangd would otherwise parse .cu as C++ or not at all).",
        "If:",
        f"  PathMatch: '{CUDA_PATH_MATCH}'",
        "CompileFlags:",
        "  Add:",
        _yaml_list(cuda_flags),
        "",
    ]
    if source.startswith("default"):
        notes.append(f"no GPU or arch list found: using {arch}; pass --cuda-arch to change it")
    return ClangdConfig("\n".join(lines), arch, source, cuda_path, notes)


def write(path: Path, config: ClangdConfig, force: bool = False) -> bool:
    """Writes ``config`` to ``path`` unless a file is already there (``force`` overwrites).

    Returns whether it wrote. A missing directory is not created (a mistyped path would
    leave a tree of them): FileNotFoundError / NotADirectoryError names it.
    """
    if path.is_dir():
        raise IsADirectoryError(
            f"cannot write {path}: it is a directory; give a file path such as {path / '.clangd'}"
        )
    if path.exists() and not force:
        return False
    parent = path.absolute().parent
    if not parent.is_dir():
        error = NotADirectoryError if parent.exists() else FileNotFoundError
        raise error(
            f"cannot write {path}: {parent} "
            f"{'is not a directory' if parent.exists() else 'does not exist'} (it is not "
            f"created); create it first (mkdir -p {parent}) or give another --output"
        )
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(config.text)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(
            exc.errno, f"cannot write {path}: {exc.strerror}; give another --output"
        ) from None
    return True


def clangd_path() -> str | None:
    """clangd on PATH, if installed (to check the config: ``clangd --check=FILE``)."""
    return shutil.which("clangd")
