"""``precompile``: build every registered kernel variant into the cache, in parallel."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from mllm_kernel.cli import env_info
from mllm_kernel.cli.arguments import number_at_least
from mllm_kernel.cli.output import format_cache_root, paint
from mllm_kernel.jit_utils import cache_wheel, precompile
from mllm_kernel.jit_utils.errors import CudaArchError, ToolchainError
from mllm_kernel.jit_utils.logging_setup import LOGGER_NAME
from mllm_kernel.jit_utils.status import BuildOutcome


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``precompile`` to the CLI."""
    parser = subparsers.add_parser(
        "precompile",
        help="build registered kernels into the cache ahead of time",
        description="Build every registered kernel variant (or those of --kernel) into the "
        "cache, -j at a time. With --arch, CUDA kernels are built for those archs without a "
        "GPU (compiled and installed, not loaded): each kernel for the archs its module "
        "declares it runs on, with a note for each module and arch it is not built for. "
        "With --output, every build is also "
        "written into DIR as a self-contained prebuilt cache, to be named in "
        "MLLM_KERNEL_CACHE_PATH where it runs (no compiler needed there); --wheel also packs "
        "DIR into a wheel whose install makes it a cache found without any setting. "
        "Exits 1 listing each failure.",
    )
    parser.add_argument(
        "--device",
        choices=precompile.DEVICE_CHOICES,
        default="all",
        help="build this device's kernels (default: all, which skips CUDA kernels with "
        "a note where no CUDA toolkit or arch is found; cuda makes that an error)",
    )
    parser.add_argument(
        "--arch",
        metavar="LIST",
        help="CUDA archs to build for, e.g. 9.0a or '8.0;9.0a'; with --output, "
        "comma-separated archs (9.0a,10.0a) are built as one entry each",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="list the builds (each variant with its archs) and the skips; build nothing",
    )
    parser.add_argument(
        "--output",
        metavar="DIR",
        type=Path,
        help="also write the builds into DIR as a prebuilt read-only cache",
    )
    parser.add_argument(
        "--wheel",
        metavar="WHEEL_DIR",
        nargs="?",
        type=Path,
        const=True,
        help="with --output: also pack DIR into an installable wheel "
        "(mllm-kernel-cache-<arch>), written into WHEEL_DIR (default: DIR's parent)",
    )
    parser.add_argument(
        "--kernel",
        metavar="NAME",
        action="append",
        help="only this kernel (repeat for several)",
    )
    parser.add_argument(
        "-j",
        "--jobs",
        type=number_at_least(1, "a positive integer", integer=True),
        metavar="N",
        help="parallel builds (default: CPU count)",
    )
    parser.set_defaults(func=run)


def _has_sized_terminal(stream) -> bool:
    """Whether ``stream`` is a terminal that reports a size: one that says 0x0 (some
    CI consoles, a detached pty) would get a bar tqdm draws zero columns wide."""
    try:
        if not stream.isatty():
            return False
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no fileno, a closed or odd stream
        return False
    return size.columns > 0 and size.lines > 0


class _Progress:
    """A tqdm bar on a terminal, one plain line per finished build otherwise (a pipe, a
    file, or a terminal that reports no size)."""

    def __init__(self, stream=None) -> None:
        self.stream = sys.stdout if stream is None else stream
        self.bar = None
        self.done = 0
        self.total = 0

    def start(self, total: int) -> None:
        self.total = total
        if total and _has_sized_terminal(self.stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="module", desc="precompile", file=self.stream)

    def result(self, result: precompile.JobResult) -> None:
        self.done += 1
        line = f"{result.status:<6} {result.job.describe()} ({result.seconds:.1f}s)"
        if self.bar is not None:
            self.bar.set_postfix_str(result.job.describe(), refresh=False)
            self.bar.update(1)
            if not result.ok:
                self.bar.write(paint(line, "red"), file=self.stream)
        else:
            print(f"[{self.done}/{self.total}] {line}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run(args: argparse.Namespace) -> int:
    """Runs :func:`mllm_kernel.jit_utils.precompile.precompile` with progress and a summary
    (and :func:`mllm_kernel.jit_utils.cache_wheel.pack` for ``--wheel``); with
    ``--dry-run``, lists its jobs and skips instead."""
    if args.wheel is not None and args.output is None:
        print("mllm_kernel precompile: error: --wheel needs --output DIR", file=sys.stderr)
        return 2
    if args.dry_run:  # before the checks that create --output's directory
        return _dry_run(args)
    if args.output is not None:
        problem = _output_problem(args.output)
        if problem is not None:  # one error, not one per build
            print(f"mllm_kernel precompile: error: {problem}", file=sys.stderr)
            return 1
    root = env_info.cache_root_info()
    if root["cache_root_in_use"] is None:  # one error, not one per build
        print(f"mllm_kernel precompile: error: {root['cache_root_problem']}", file=sys.stderr)
        return 1
    started = time.monotonic()
    progress = _Progress()
    logger = logging.getLogger(LOGGER_NAME)
    previous_level = logger.level
    logger.setLevel(max(previous_level, logging.WARNING))  # progress says what is built
    try:
        report = precompile.precompile(
            device=args.device,
            kernels=args.kernel,
            arch=args.arch,
            jobs=args.jobs,
            on_start=progress.start,
            on_result=progress.result,
            output=args.output,
        )
    except _REFUSALS as exc:
        return _refused(exc)
    finally:
        progress.close()
        logger.setLevel(previous_level)
    _print_notes(report)
    total = len(report.results)
    print(
        f"precompiled {total} variant(s) in {time.monotonic() - started:.1f}s: "
        f"{report.count(BuildOutcome.BUILT)} built, "
        f"{report.count(BuildOutcome.CACHED)} already cached, "
        f"{_prebuilt_count(report)}"
        f"{len(report.failures)} failed{_skips(report)}"
    )
    if root["cache_root_problem"]:
        print(paint(f"note: built into {format_cache_root(root)}", "yellow"))
    if args.output is not None and total > len(report.failures):
        print(f"prebuilt cache: {args.output.absolute()} (use it with MLLM_KERNEL_CACHE_PATH)")
    if not report.failures:
        return _pack_wheel(args) if args.wheel is not None else 0
    print(paint(f"{len(report.failures)} build(s) failed:", "red"), file=sys.stderr)
    for failure in report.failures:
        print(f"  {failure.job.describe()}: {failure.error}", file=sys.stderr)
        if failure.log_path:
            print(f"    full log: {failure.log_path}", file=sys.stderr)
    if args.wheel is not None:
        print("no wheel written: fix the failed builds first", file=sys.stderr)
    return 1


# What precompile raises for bad usage (ValueError: exit 2) or a machine that cannot build.
_REFUSALS = (ValueError, ToolchainError, CudaArchError)


def _refused(exc: Exception) -> int:
    print(f"mllm_kernel precompile: error: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, ValueError) else 1


def _print_notes(report: precompile.PrecompileReport) -> None:
    for note in report.notes():
        print(paint(f"note: {note}", "yellow"))


def _skips(report: precompile.PrecompileReport) -> str:
    """The summary's count of variants not built for an arch, or ``""``."""
    if not report.arch_skips:
        return ""
    return f", {report.skipped_builds} skipped (archs their kernels do not run on: notes above)"


def _dry_run(args: argparse.Namespace) -> int:
    """``--dry-run``: what precompile would build, for which archs, and what it skips."""
    try:
        report = precompile.precompile(
            device=args.device,
            kernels=args.kernel,
            arch=args.arch,
            output=args.output,
            dry_run=True,
        )
    except _REFUSALS as exc:
        return _refused(exc)
    for job in report.planned:
        print(f"would build {job.describe()}")
    _print_notes(report)
    print(f"would build {len(report.planned)} variant(s){_skips(report)}")
    return 0


def _output_problem(output: Path) -> str | None:
    """Why ``--output`` cannot hold a prebuilt cache (a file in the way, a directory that
    cannot be created), or None; a missing directory is created here, as the export would."""
    if output.is_dir():
        return None
    if output.exists():
        return f"--output {output} is a file: give a directory for the prebuilt cache"
    try:
        output.mkdir(parents=True)
    except OSError as exc:
        return (
            f"--output {output}: cannot create the directory ({exc.strerror}); give a "
            "directory you can write"
        )
    return None


def _prebuilt_count(report: precompile.PrecompileReport) -> str:
    """``"N served by a prebuilt cache, "`` where a read-only cache served any."""
    served = report.count(BuildOutcome.PREBUILT)
    return f"{served} served by a prebuilt cache, " if served else ""


def _pack_wheel(args: argparse.Namespace) -> int:
    wheel_dir = args.output.absolute().parent if args.wheel is True else args.wheel
    try:
        wheel = cache_wheel.pack(args.output, wheel_dir)
    except (OSError, ValueError) as exc:
        print(f"mllm_kernel precompile: error: cannot write the wheel: {exc}", file=sys.stderr)
        return 1
    print(f"wheel: {wheel} (pip install it where the kernels run; no setting needed)")
    return 0
