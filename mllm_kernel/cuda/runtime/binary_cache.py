"""CUBIN/PTX in the package cache, with the JIT core's guarantees (jit_utils.cache).

The key covers the source text, its file name and directory (for relative
``#include``), the options, the kind and arch, the compiler's identity and the
include-path variables (``CPATH``); what the compiler read is recorded in the
manifest and checked on every lookup, as for JIT modules
(:mod:`mllm_kernel.jit_utils.build_inputs`: headers by content, the toolkit's by
stat and content, and how each name resolved, so a new shadowing header rebuilds). A
build runs under the key's cross-process lock in a staging directory and is renamed
into place; a truncated or altered artifact fails its checksum and is rebuilt. A
cache hit reads the key and the file: no compiler runs.

Layout: ``<cache root>/cuda_<kind>_<label>_<arch>_<hash>/`` holding the artifact,
``manifest.json`` and ``compile.log`` (the command and its register/spill report).
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import time
from pathlib import Path

from mllm_kernel.cuda.runtime.compile_request import CompileOutput, CompileRequest
from mllm_kernel.cuda.runtime.compiler import compile_in, compiler_identity
from mllm_kernel.jit_utils import build_inputs, cache, env, trust
from mllm_kernel.jit_utils.cache_key import ModuleKey
from mllm_kernel.jit_utils.cache_names import binary_dirname
from mllm_kernel.jit_utils.logging_setup import get_logger
from mllm_kernel.jit_utils.spec import CACHE_FORMAT, stable_hash
from mllm_kernel.jit_utils.status import CacheState

_logger = get_logger()
COMPILE_LOG = "compile.log"
# Bump when what a runtime cache entry holds changes meaning.
RUNTIME_FORMAT = 1


def binary_key(request: CompileRequest, cache_dir: str | Path | None = None) -> ModuleKey:
    """Where ``request``'s artifact lives (``cache_dir`` overrides the cache root)."""
    material = {
        "format": CACHE_FORMAT,
        "runtime_format": RUNTIME_FORMAT,
        "source_sha256": hashlib.sha256(request.source.encode()).hexdigest(),
        "source_name": request.source_name,
        "source_dir": str(request.source_path.parent) if request.source_path else None,
        "kind": request.kind,
        "target": request.target,
        "options": list(request.options),
        "backend": request.backend,
        "compiler": compiler_identity(request.backend),
        # They move headers in and out of nvcc's search path.
        "include_path_variables": env.include_path_variables(),
    }
    compiler_variables = env.compiler_variables()  # NVCC_APPEND_FLAGS and the like
    if compiler_variables:  # absent when none is set: earlier entries keep their keys
        material["compiler_variables"] = compiler_variables
    digest = stable_hash(material)
    dirname = binary_dirname(request.kind, request.label, request.target, digest)
    root = Path(cache_dir).expanduser().absolute() if cache_dir else trust.writable_root()
    return ModuleKey(hash=digest, dirname=dirname, root=root)


def _manifest(request: CompileRequest, key: ModuleKey, output: CompileOutput) -> cache.Manifest:
    return cache.Manifest(
        name=request.label,
        device="cuda",
        template_args=[request.kind, request.target, request.backend],
        key_hash=key.hash,
        artifact=output.artifact.name,
        artifact_size=output.artifact.stat().st_size,
        artifact_sha256=build_inputs.file_digest(output.artifact),
        deps=output.inputs.deps,
        toolchain_deps=output.inputs.toolchain_deps,
        include_search=output.inputs.include_search,
        exports=[],
        built_at=time.time(),
        build_seconds=round(output.seconds, 3),
        toolchain=output.toolchain,
        cuda_archs=[str(request.arch)],
    )


def _report(log: str) -> str:
    """The compiler's register/spill lines (``ptxas info ...``) from a compile log."""
    lines = log.splitlines()[1:]  # the first is the command
    return "\n".join(x for x in lines if x.lstrip().startswith("ptxas") or "spill" in x)


def _print_verbose(request: CompileRequest, what: str, log: str) -> None:
    print(f"[mllm_kernel] {request.describe()}: {what}", file=sys.stderr)
    command = log.splitlines()[0] if log else ""
    print(f"  {command}", file=sys.stderr)
    report = _report(log)
    if report:
        print("  " + report.replace("\n", "\n  "), file=sys.stderr)


def compile_cached(
    request: CompileRequest, *, cache_dir: str | Path | None = None, verbose: bool = False
) -> bytes:
    """The artifact of ``request``: from the cache when valid, else compiled (once across
    threads and processes) and installed atomically. Raises KernelBuildError."""
    key = binary_key(request, cache_dir)
    found = cache.lookup(key)
    if found.status is not CacheState.HIT:
        with cache.module_lock(key, purpose=f"compiling {request.describe()}"):
            found = cache.lookup(key)
            if found.status is not CacheState.HIT:
                return _build(request, key, found, verbose)
    if verbose:
        log_file = key.path / COMPILE_LOG
        log = log_file.read_text() if log_file.is_file() else ""
        _print_verbose(request, f"from the cache ({key.path})", log)
    return found.artifact.read_bytes()


def _build(request: CompileRequest, key: ModuleKey, found: cache.Lookup, verbose: bool) -> bytes:
    if found.status is CacheState.CORRUPT:
        _logger.warning("cache entry %s is corrupt (%s); recompiling", key.path, found.reason)
    elif found.status is CacheState.STALE:
        _logger.info("recompiling %s: %s", request.describe(), found.reason)
    staging = cache.new_staging_dir(key)
    try:
        output = compile_in(request, staging, cache.failure_log_path(key))
        (staging / COMPILE_LOG).write_text(output.log)
        _manifest(request, key, output).write(staging)
        data = output.artifact.read_bytes()
        cache.install(staging, key)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if verbose:
        _print_verbose(request, f"compiled in {output.seconds:.2f}s", output.log)
    _logger.info("compiled %s in %.1fs: %s", request.describe(), output.seconds, key.path)
    return data
