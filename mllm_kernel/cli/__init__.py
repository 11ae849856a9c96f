"""The ``mllm-kernel`` / ``python -m mllm_kernel`` command line.

Each command is a thin layer over a library function, so scripts and tests
call the same code:

======================================  ==============================================
``show-env``                            :func:`mllm_kernel.cli.env_info.collect`
``show-config``                         :func:`mllm_kernel.jit_utils.cache_admin.config_report`
``show-clangd-recommend-config``        :func:`mllm_kernel.cli.clangd.recommend`
``clear-cache``                         :func:`mllm_kernel.jit_utils.cache_admin.clear_cache`
``precompile``                          :func:`mllm_kernel.jit_utils.precompile.precompile`
======================================  ==============================================
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from mllm_kernel.cli import clangd_config, clear_cache, precompile, show


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    from mllm_kernel import __version__

    parser = argparse.ArgumentParser(
        prog="mllm_kernel",
        description="mllm-kernel developer tools: inspect the environment and the kernel "
        "cache, precompile kernels, configure clangd.",
    )
    parser.add_argument("--version", action="version", version=f"mllm-kernel {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="<command>", required=True)
    show.register(subparsers)
    clangd_config.register(subparsers)
    clear_cache.register(subparsers)
    precompile.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI on ``argv`` (default: ``sys.argv[1:]``) and returns the exit code.

    Bad usage exits with status 2 and argparse's message.
    """
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)
