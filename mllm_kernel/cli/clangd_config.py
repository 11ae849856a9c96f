"""``show-clangd-recommend-config``: write a ``.clangd`` that understands the package."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mllm_kernel.cli import clangd
from mllm_kernel.cli.output import paint
from mllm_kernel.jit_utils.errors import CudaArchError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``show-clangd-recommend-config`` to the CLI."""
    parser = subparsers.add_parser(
        "show-clangd-recommend-config",
        help="write ./.clangd (despite 'show' in the name) for mllm-kernel's C++/CUDA headers",
        description="Writes a .clangd file (in the current directory, or --output): despite "
        "'show' in the command's name it does not only print. The config has -std=c++20, the "
        "tvm-ffi, DLPack and mllm-kernel include paths, and a CUDA fragment for .cu/.cuh "
        "files. An existing file is left untouched (the recommended content is printed "
        "instead) unless --force is given.",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(".clangd"),
        help="where to write (default: ./.clangd); its directory must exist",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    parser.add_argument(
        "--cuda-arch",
        metavar="ARCH",
        help="the GPU arch for CUDA files (sm_80, 9.0a...; one nvcc --list-gpu-arch lists); "
        "default: the loader's "
        "(MLLM_KERNEL_CUDA_ARCH_LIST, TORCH_CUDA_ARCH_LIST, the GPU), else "
        f"{clangd.DEFAULT_CUDA_ARCH}",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Writes :func:`mllm_kernel.cli.clangd.recommend`'s config unless the file exists.

    The first line of output says what happened to the file (wrote it, or kept it).
    """
    try:
        config = clangd.recommend(args.cuda_arch)
    except CudaArchError as exc:  # a bad --cuda-arch: usage, as argparse's errors
        print(f"mllm_kernel show-clangd-recommend-config: error: {exc}", file=sys.stderr)
        return 2
    try:
        wrote = clangd.write(args.output, config, force=args.force)
    except OSError as exc:
        print(f"mllm_kernel show-clangd-recommend-config: error: {exc}", file=sys.stderr)
        return 1
    if wrote:
        print(f"wrote {args.output} (CUDA arch {config.cuda_arch}, from {config.cuda_arch_source})")
    else:
        print(
            paint(f"{args.output} already exists and was left untouched.", "yellow")
            + " The recommended content is below; rerun with --force to overwrite it."
        )
    for note in config.notes:
        print(f"note: {note}")
    if wrote:
        if clangd.clangd_path() is None:
            print("note: clangd is not on PATH; install it to use this config")
        return 0
    print()
    print(config.text, end="")
    return 0
