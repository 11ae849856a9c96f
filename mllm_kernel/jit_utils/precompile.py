"""Building registered kernel variants ahead of time, in parallel, into the cache.

CI compiles every CUDA kernel for sm_90a on a machine without a GPU, and a
deployment image can ship a warm cache. Where the module can be loaded here (a
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

from mllm_kernel.jit_utils import cache, loader, registry, toolchain
from mllm_kernel.jit_utils.cache_key import module_key
from mllm_kernel.jit_utils.cuda_arch import cuda_arch_override, resolve_cuda_archs
from mllm_kernel.jit_utils.errors import CudaArchError, KernelBuildError, ToolchainError
from mllm_kernel.jit_utils.registry import KernelEntry
from mllm_kernel.logging_setup import get_logger

DEVICE_CHOICES = ("cpu", "cuda", "all")
_logger = get_logger()


@dataclass(frozen=True)
class Job:
    """One variant of one registered kernel to build."""

    entry: KernelEntry
    variant: tuple[Any, ...]

    def describe(self) -> str:
        return f"{self.entry.name}<{', '.join(map(str, self.variant))}> ({self.entry.device})"


@dataclass(frozen=True)
class JobResult:
    """How one job went: ``status`` is ``built``, ``cached`` (already valid) or ``failed``.

    A failure carries the first compiler error (``error``) and the full log's path.
    """

    job: Job
    status: str
    seconds: float
    path: Path | None = None
    error: str = ""
    log_path: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "failed"


@dataclass
class PrecompileReport:
    """Every job's result, and notes on what was skipped (e.g. CUDA without a toolkit)."""

    results: list[JobResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[JobResult]:
        return [r for r in self.results if not r.ok]

    def count(self, status: str) -> int:
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


def cuda_unavailable_reason() -> str | None:
    """Why CUDA kernels cannot be built here (no toolkit, no arch), or None if they can.

    Call inside :func:`cuda_arch_override` to account for an explicit arch.
    """
    try:
        toolchain.find_cuda()
        resolve_cuda_archs()
    except (ToolchainError, CudaArchError) as exc:
        return str(exc)
    return None


def select_jobs(device: str = "all", kernels: Sequence[str] | None = None) -> list[Job]:
    """Every variant of the registered kernels on ``device`` (``cpu``, ``cuda`` or
    ``all``), or only of the ``kernels`` named. Unknown names raise ValueError."""
    if device not in DEVICE_CHOICES:
        raise ValueError(f"device must be one of {DEVICE_CHOICES}, got {device!r}")
    entries = [e for e in registry.kernels() if e.builder is not None]
    if kernels:
        known = {e.name for e in entries}
        unknown = sorted(set(kernels) - known)
        if unknown:
            raise ValueError(
                f"unknown kernel(s) {', '.join(unknown)}; registered: "
                f"{', '.join(sorted(known)) or 'none'}"
            )
        entries = [e for e in entries if e.name in kernels]
    entries = [e for e in entries if device in ("all", e.device)]
    return [Job(e, tuple(v)) for e in entries for v in e.variants]


def run_job(job: Job, load: bool | None = None) -> JobResult:
    """Builds one job into the cache (``load``: verify by loading; default: where possible)."""
    started = time.monotonic()
    load = can_load(job.entry.device) if load is None else load
    try:
        spec = job.entry.plan(job.variant)
        key = module_key(spec)
        if cache.lookup(key).status == "hit":
            return JobResult(job, "cached", time.monotonic() - started, key.path)
        if load:
            loader.load_spec(spec)
            status = "built"
        else:
            status = loader.build_into_cache(spec, key)
        return JobResult(job, status, time.monotonic() - started, key.path)
    except KernelBuildError as exc:
        return JobResult(
            job, "failed", time.monotonic() - started, error=exc.first_error, log_path=exc.log_path
        )
    except Exception as exc:  # no toolchain, a missing source, a bad arch: report, go on
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        return JobResult(job, "failed", time.monotonic() - started, error=first_line)


def precompile(
    device: str = "all",
    kernels: Sequence[str] | None = None,
    arch: str | None = None,
    jobs: int | None = None,
    load: bool | None = None,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[JobResult], None] | None = None,
) -> PrecompileReport:
    """Builds every selected kernel variant into the cache, ``jobs`` at a time.

    ``arch`` (e.g. ``"9.0a"``) targets CUDA builds at that arch, GPU or not.
    With ``device="all"``, CUDA kernels are skipped (with a note in the report)
    where no toolkit or arch is available; with ``device="cuda"`` that raises
    ToolchainError / CudaArchError. ``on_start(total)`` and ``on_result(result)``
    are called from the calling thread, for progress display.
    """
    selected = select_jobs(device, kernels)
    report = PrecompileReport()
    override = cuda_arch_override(arch) if arch else contextlib.nullcontext()
    with override:
        if any(job.entry.device == "cuda" for job in selected):
            reason = cuda_unavailable_reason()
            if reason is not None:
                if device == "cuda":
                    toolchain.find_cuda()  # re-raise the specific error
                    resolve_cuda_archs()
                report.skipped.append(f"CUDA kernels skipped: {reason}")
                selected = [job for job in selected if job.entry.device != "cuda"]
        if on_start is not None:
            on_start(len(selected))
        workers = max(1, min(jobs or os.cpu_count() or 1, len(selected) or 1))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="precompile") as pool:
            # Each task runs in its own copy of this context, so the arch override
            # (a context variable) reaches the worker threads.
            futures = [
                pool.submit(contextvars.copy_context().run, run_job, job, load) for job in selected
            ]
            for future in as_completed(futures):
                result = future.result()
                report.results.append(result)
                if on_result is not None:
                    on_result(result)
    order = {id(job): i for i, job in enumerate(selected)}
    report.results.sort(key=lambda r: order[id(r.job)])
    return report
