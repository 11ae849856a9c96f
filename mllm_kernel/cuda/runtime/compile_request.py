"""A compilation of CUDA source to one CUBIN or PTX file, described as data, and what
it returns: shared by the backends (nvcc in :mod:`.compiler`, :mod:`.nvrtc`), which
import it and not each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mllm_kernel.jit_utils import build_inputs, include_search
from mllm_kernel.jit_utils.cuda_arch import CudaArch

KINDS = ("cubin", "ptx")
BACKENDS = ("nvcc", "nvrtc")


@dataclass(frozen=True)
class CompileRequest:
    """One source compiled to one ``kind`` (``cubin`` or ``ptx``) for one ``arch``.

    ``label`` names the source in compiler messages and in the cache: the file's stem,
    or for source text the kernel's name (``vector_add.cu(3): error: ...``).
    """

    source: str
    source_path: Path | None
    label: str
    kind: str
    arch: CudaArch
    options: tuple[str, ...] = ()
    backend: str = "nvcc"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be 'nvcc' or 'nvrtc', got {self.backend!r}")

    @property
    def target(self) -> str:
        """``sm_90a`` for a CUBIN, ``compute_90a`` for PTX."""
        return f"{'sm' if self.kind == 'cubin' else 'compute'}_{self.arch.number}"

    @property
    def source_name(self) -> str:
        return self.source_path.name if self.source_path else f"{self.label}.cu"

    def describe(self) -> str:
        return f"{self.source_name} -> {self.kind} for {self.target} ({self.backend})"


@dataclass
class CompileOutput:
    """A finished compilation: the artifact, what to record and what to report."""

    artifact: Path
    log: str
    seconds: float
    inputs: build_inputs.BuildInputs = field(default_factory=build_inputs.BuildInputs)
    toolchain: dict[str, str] = field(default_factory=dict)


class CompileFailed(Exception):
    """A backend's compiler failed; carries its full log (turned into KernelBuildError)."""

    def __init__(self, log: str) -> None:
        super().__init__(log)
        self.log = log


def search_path(request: CompileRequest, options: Sequence[str]) -> list[str]:
    """Where ``request``'s ``#include`` directives are looked up (``options``: the
    compiler's, ``-I`` and ``-isystem`` included), as the JIT core models it."""
    return include_search.search_path_of(
        source_dirs=[request.source_path.parent] if request.source_path else [],
        flags=options,
        include_paths=[],
        is_cuda=True,
        tvm_ffi=False,
    )


def record_inputs(
    request: CompileRequest, opened: list[str], dirs: Sequence[str], started_ns: int
) -> build_inputs.BuildInputs:
    """The manifest's records of what compiling ``request`` read (see
    :mod:`mllm_kernel.jit_utils.build_inputs`): the headers ``opened``, the toolkit's
    and the C++ compiler's fingerprinted, and how each name resolved in ``dirs``. Source
    text counts by its directives (the key holds the text itself). A file written since
    ``started_ns`` (the wall clock before compiling) counts as changed."""
    text = request.source.encode() if request.source_path is None else b""
    unit = build_inputs.CompiledUnit(opened, dirs, text)
    return build_inputs.record(
        [unit], include_search.toolchain_dirs_of(cuda=True), started_ns=started_ns
    )
