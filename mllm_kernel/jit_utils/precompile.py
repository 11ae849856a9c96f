"""Building registered kernel variants ahead of time, in parallel, into the cache.

CI compiles every CUDA kernel for sm_90a on a machine without a GPU, and a
deployment image can ship a prebuilt cache (``output``: see :mod:`.prebuilt`). Where
the module can be loaded here (a
CPU kernel, or a CUDA kernel with a GPU present) the loader's own path builds
it and verifies it by loading; a CUDA module on a machine without a usable GPU
is compiled, linked and installed by :func:`loader.build_into_cache` without
being loaded (dlopen of a CUDA module may fail without libcuda).

>>> report = precompile(device="cpu", kernels=["add_constant"])  # doctest: +SKIP
>>> [r.status for r in report.results]  # doctest: +SKIP
['built', 'built', 'built', 'built', 'built']
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mllm_kernel.jit_utils import cache, loader, prebuilt, registry, toolchain
from mllm_kernel.jit_utils.cache_key import module_key
from mllm_kernel.jit_utils.cuda_arch import (
    CudaArch,
    cuda_arch_override,
    op_archs,
    resolve_cuda_archs,
)
from mllm_kernel.jit_utils.errors import CudaArchError, KernelBuildError, ToolchainError
from mllm_kernel.jit_utils.logging_setup import get_logger
from mllm_kernel.jit_utils.nvcc_archs import check_known
from mllm_kernel.jit_utils.registry import KernelEntry
from mllm_kernel.jit_utils.spec import DEVICES
from mllm_kernel.jit_utils.status import BuildOutcome, CacheState

DEVICE_CHOICES = (*DEVICES, "all")
_logger = get_logger()


@dataclass(frozen=True)
class Job:
    """One variant of one registered kernel to build (``arch``: a CUDA kernel's archs,
    ``"8.0;9.0a"``, those of the arch list its kernels run on)."""

    entry: KernelEntry
    variant: tuple[Any, ...]
    arch: str | None = None

    def describe(self) -> str:
        where = f"{self.entry.device}, {self.arch}" if self.arch else self.entry.device
        return f"{self.entry.name}<{', '.join(map(str, self.variant))}> ({where})"


@dataclass(frozen=True)
class JobResult:
    """How one job went (``status``: built, cached, i.e. already valid, prebuilt, i.e.
    served by a read-only cache, or failed).

    A failure carries the first compiler error (``error``) and the full log's path.
    """

    job: Job
    status: BuildOutcome
    seconds: float
    path: Path | None = None
    error: str = ""
    log_path: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not BuildOutcome.FAILED


@dataclass(frozen=True)
class ArchSkip:
    """The ``variants`` of kernel module ``entry`` not built for ``arch``, which its
    kernels do not run on (its declared ``archs``); ``instead``: the modules of the same
    op that do run there."""

    entry: KernelEntry
    arch: CudaArch
    variants: int
    instead: tuple[str, ...]

    def note(self) -> str:
        """``skipped gemm (12 variants) for 8.0: it runs on sm_90a only (it uses wgmma
        and TMA); op gemm has gemm_sm80 for 8.0``."""
        op = self.entry.op or self.entry.name
        plural = "s" if self.variants != 1 else ""
        there = (
            f"op {op} has {', '.join(self.instead)} for {self.arch}"
            if self.instead
            else f"op {op} has no kernel for {self.arch}"
        )
        return (
            f"skipped {self.entry.name} ({self.variants} variant{plural}) for {self.arch}: "
            f"it runs on {self.entry.archs.explain()}; {there}"
        )


@dataclass
class PrecompileReport:
    """Every job's result; notes on what was not attempted (``skipped``: e.g. CUDA
    without a toolkit); the kernels not built for an arch they do not run on
    (``arch_skips``, one per module and arch); with ``dry_run``, the jobs ``planned``."""

    results: list[JobResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    arch_skips: list[ArchSkip] = field(default_factory=list)
    planned: list[Job] = field(default_factory=list)

    @property
    def failures(self) -> list[JobResult]:
        return [r for r in self.results if not r.ok]

    @property
    def skipped_builds(self) -> int:
        """Variants not built for an arch, summed over modules and archs."""
        return sum(skip.variants for skip in self.arch_skips)

    def notes(self) -> list[str]:
        """``skipped``, then one line per :class:`ArchSkip`."""
        return [*self.skipped, *(skip.note() for skip in self.arch_skips)]

    def count(self, status: BuildOutcome) -> int:
        return sum(r.status == status for r in self.results)


def can_load(device: str) -> bool:
    """Whether a module for ``device`` can be loaded (and so verified) on this machine."""
    if device == "cpu":
        return True
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def check_cuda() -> None:
    """ToolchainError / CudaArchError where CUDA kernels cannot be built here: no
    toolkit, no arch, or an arch the toolkit's nvcc does not compile for (``sm_70`` for
    CUDA 13), refused here rather than by every build."""
    toolchain.find_cuda()
    for arch in resolve_cuda_archs():
        check_known(arch)


def cuda_unavailable_reason() -> str | None:
    """Why CUDA kernels cannot be built here (:func:`check_cuda`), or None if they can.

    Call inside :func:`cuda_arch_override` to account for an explicit arch.
    """
    try:
        check_cuda()
    except (ToolchainError, CudaArchError) as exc:
        return str(exc)
    return None


def _within_arch_support(
    jobs: list[Job], archs: tuple[CudaArch, ...], report: PrecompileReport
) -> list[Job]:
    """``jobs``, each CUDA one for the archs of ``archs`` its kernels run on (its
    ``arch``), without those that run on none; the variants left out are counted in
    ``report.arch_skips``, once per module and arch, with the op's modules that run
    there (the declarations are the one table: :func:`~.cuda_arch.op_archs`)."""
    kept: list[Job] = []
    left_out: dict[tuple[str, CudaArch], int] = {}
    entries: dict[str, KernelEntry] = {}
    for job in jobs:
        if job.entry.device != "cuda":
            kept.append(job)
            continue
        support = job.entry.archs
        built = tuple(arch for arch in archs if support.supports(arch))
        for arch in archs:
            if arch not in built:
                key = (job.entry.name, arch)
                left_out[key] = left_out.get(key, 0) + 1
                entries[job.entry.name] = job.entry
        if built:
            kept.append(Job(job.entry, job.variant, ";".join(map(str, built))))
    ops = {op.op: op for op in op_archs(registry.kernels("cuda"))}
    for (name, arch), count in sorted(left_out.items()):
        entry = entries[name]
        instead = ops[entry.op or name].modules_for(arch)
        report.arch_skips.append(ArchSkip(entry, arch, count, instead))
    return kept


def select_jobs(device: str = "all", kernels: Sequence[str] | None = None) -> list[Job]:
    """Every variant of the registered kernels on ``device`` (``cpu``, ``cuda`` or
    ``all``), or only of the ``kernels`` named; an op's name also selects the helper
    modules that serve it (``gptq_marlin_gemm``: its fused and dequantize modules too).
    Unknown names raise ValueError."""
    if device not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {device!r}")
    entries = [e for e in registry.kernels() if e.builder is not None]
    if kernels:
        known = {e.name for e in entries}
        unknown = sorted(set(kernels) - known - {e.op for e in entries})
        if unknown:
            raise ValueError(
                f"unknown kernel(s) {registry.unknown_names(unknown, known)}; registered: "
                f"{', '.join(sorted(known)) or 'none'}"
            )
        entries = [e for e in entries if e.name in kernels or e.op in kernels]
    entries = [e for e in entries if device in ("all", e.device)]
    return [Job(e, tuple(v)) for e in entries for v in e.variants]


def run_job(job: Job, load: bool | None = None, output: Path | None = None) -> JobResult:
    """Builds one job into the cache (``load``: verify by loading; default: where
    possible); with ``output``, then copies it into that prebuilt cache. Without
    ``output``, a variant a read-only cache serves (``MLLM_KERNEL_CACHE_PATH``, an
    installed cache wheel) is not built again: the loader takes it from there."""
    started = time.monotonic()
    load = can_load(job.entry.device) if load is None else load
    try:
        spec = job.entry.spec(job.variant)
        if output is None:
            served = prebuilt.find(spec)
            if served is not None:
                elapsed = time.monotonic() - started
                return JobResult(job, BuildOutcome.PREBUILT, elapsed, served.artifact)
        key = module_key(spec)
        if cache.lookup(key).status is CacheState.HIT:
            status = BuildOutcome.CACHED
        elif load:
            loader.build_and_load(spec, key)
            status = BuildOutcome.BUILT
        else:
            status = loader.build_into_cache(spec, key)
        path = key.path if output is None else prebuilt.export(spec, key.path, output)
        return JobResult(job, status, time.monotonic() - started, path)
    except KernelBuildError as exc:
        return JobResult(
            job,
            BuildOutcome.FAILED,
            time.monotonic() - started,
            error=exc.first_error,
            log_path=exc.log_path,
        )
    except Exception as exc:  # no toolchain, a missing source, a bad arch: report, go on
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        return JobResult(job, BuildOutcome.FAILED, time.monotonic() - started, error=first_line)


def precompile(
    device: str = "all",
    kernels: Sequence[str] | None = None,
    arch: str | None = None,
    jobs: int | None = None,
    load: bool | None = None,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[JobResult], None] | None = None,
    output: Path | None = None,
    dry_run: bool = False,
) -> PrecompileReport:
    """Builds every selected kernel variant into the cache, ``jobs`` at a time.

    ``arch`` (e.g. ``"9.0a"``, ``"8.0,9.0a"``) targets CUDA builds at those archs, GPU
    or not; each CUDA kernel is built for the archs of those its module declares it
    runs on (``Job.arch``), and a module is not built for the others:
    ``report.arch_skips`` says which, once per module and arch, and what the op runs
    there instead. With ``device="all"``, CUDA kernels are skipped (with a note in the
    report) where no toolkit or usable arch is available; with ``device="cuda"`` that
    raises ToolchainError / CudaArchError. ``on_start(total)`` and ``on_result(result)``
    are called from the calling thread, for progress display. ``dry_run``: build
    nothing; the jobs are in ``report.planned``.

    ``output``: also write every build into that directory as a self-contained
    prebuilt cache (:mod:`.prebuilt`). There each arch of a comma-separated ``arch``
    (``"9.0a,10.0a"``) is built as its own entry, since a GPU machine looks up the
    one arch it has.
    """
    selected = select_jobs(device, kernels)
    targets = [a.strip() for a in arch.split(",")] if arch and output is not None else [arch]
    report = PrecompileReport()
    queued: list[tuple[contextvars.Context, Job]] = []
    for index, target in enumerate(targets):
        chosen = [j for j in selected if index == 0 or j.entry.device == "cuda"]
        override = cuda_arch_override(target) if target else contextlib.nullcontext()
        with override:
            if any(job.entry.device == "cuda" for job in chosen):
                reason = cuda_unavailable_reason()
                if reason is not None:
                    if device == "cuda":
                        check_cuda()  # re-raise the specific error
                    note = f"CUDA kernels skipped: {reason}"
                    if note not in report.skipped:  # once, not once per arch
                        report.skipped.append(note)
                    chosen = [job for job in chosen if job.entry.device != "cuda"]
                else:
                    chosen = _within_arch_support(chosen, resolve_cuda_archs(), report)
            # Each task runs in its own copy of this context, so the arch override
            # (a context variable) reaches the worker threads.
            queued += [(contextvars.copy_context(), job) for job in chosen]
    report.arch_skips.sort(key=lambda skip: (skip.entry.name, skip.arch))
    if dry_run:
        report.planned = [job for _, job in queued]
        return report
    if on_start is not None:
        on_start(len(queued))
    workers = max(1, min(jobs or os.cpu_count() or 1, len(queued) or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="precompile") as pool:
        futures = [pool.submit(ctx.run, run_job, job, load, output) for ctx, job in queued]
        for future in as_completed(futures):
            result = future.result()
            report.results.append(result)
            if on_result is not None:
                on_result(result)
    order = {id(job): i for i, (_, job) in enumerate(queued)}
    report.results.sort(key=lambda r: order[id(r.job)])
    return report
