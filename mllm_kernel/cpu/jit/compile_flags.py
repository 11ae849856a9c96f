"""Compiler and linker flags shared by the CPU kernels (on top of the loader's
-O3 -march=native): OpenMP for threads and ``omp simd``, and on x86 the full
vector width where the host has AVX-512 (GCC otherwise stops at 256 bits)."""

from __future__ import annotations

import platform

CXX_FLAGS: tuple[str, ...] = ("-fopenmp",) + (
    ("-mprefer-vector-width=512",) if platform.machine().lower() in ("x86_64", "amd64") else ()
)
LDFLAGS: tuple[str, ...] = ("-fopenmp",)
