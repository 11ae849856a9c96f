"""Inputs that used to abort, hang, inject code or fail with the wrong error (issue 31,
items 10-12): negative-stride arrays, one-line sources, odd source paths and build
directories, a str where a list belongs, huge scalars, attributes in kernel parameters,
and compilers that outlived a killed builder."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import OK_SOURCE, child_env

from mllm_kernel.cuda import compile_to_ptx, load_cubin, load_ptx
from mllm_kernel.cuda.runtime.compiler import read_source
from mllm_kernel.cuda.runtime.signature import kernel_params, parse_signature
from mllm_kernel.jit_utils import jit, load_cpu_jit, load_cuda_jit, op_inputs
from mllm_kernel.jit_utils.loader import cpu_spec


def _python(script: str, *args: str, env: dict | None = None, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        env=child_env(**(env or {})),
        **popen,
    )


# --------------------------------------------------------------------------- item 10
# In a subprocess: before the fix torch.from_dlpack aborted the interpreter (SIGABRT).
_NEGATIVE_STRIDES = textwrap.dedent("""\
    import json
    import numpy as np
    from mllm_kernel.cpu import jit as cpu
    from mllm_kernel.jit_utils import op_inputs

    x = np.random.randn(4, 8).astype(np.float32)
    w = np.ones(8, np.float32)
    calls = {
        "add_constant src": lambda: cpu.add_constant(x[::-1], 1),
        "add_constant_runtime out": lambda: cpu.add_constant_runtime(x, 0.5, out=x.copy()[::-1]),
        "rmsnorm input": lambda: cpu.rmsnorm(x[::-1], w),
        "rmsnorm weight": lambda: cpu.rmsnorm(x, w[::-1]),
        "fused_add_rmsnorm residual": lambda: cpu.fused_add_rmsnorm(x.copy(), x.copy()[::-1], w),
        "silu_and_mul input": lambda: cpu.silu_and_mul(x[:, ::-1]),
        "softmax x": lambda: cpu.softmax(x[::-1, ::-1]),
        "silu_and_mul_backward grad_output": lambda: cpu.silu_and_mul_backward(x[::-1, :4], x),
    }
    results = {}
    for name, call in calls.items():
        try:
            call()
            results[name] = "no error"
        except Exception as error:
            results[name] = f"{type(error).__name__}: {error}"
    # A reversed dimension of size 1 has no stride to speak of: torch takes it.
    one_row = op_inputs.tensor(x[:1][::-1], "x")
    results["one row"] = bool((one_row.numpy() == x[:1]).all())
    print(json.dumps(results))
""")


def test_negative_stride_arrays_are_refused_naming_the_argument():
    proc = _python(_NEGATIVE_STRIDES, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"the process died ({proc.returncode}): {err[-2000:]}"
    results = json.loads(out)
    assert results.pop("one row") is True
    for name, result in results.items():
        arg = name.split()[-1]
        assert result.startswith(f"ValueError: argument '{arg}': "), (name, result)
        assert "negative strides" in result and "np.ascontiguousarray" in result, result


# --------------------------------------------------------------------------- item 11
def test_one_line_source_text_of_any_length_is_text_without_touching_the_disk(monkeypatch):
    text = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }' + " " * 300

    include, comment = '#include "kernels/add.cuh"', "__global__ void k(); // see k.cu"

    def no_disk(*args, **kwargs):
        raise AssertionError("source text was looked up on the file system")

    with monkeypatch.context() as patched:
        patched.setattr(os, "stat", no_disk)
        sources = [read_source(text), read_source(include), read_source(comment)]
    assert sources == [(text, None), (include, None), (comment, None)]


def test_a_one_line_source_file_name_is_still_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("add.cu").write_text("// a kernel\n")
    assert read_source("add.cu") == ("// a kernel\n", (tmp_path / "add.cu").absolute())
    with pytest.raises(FileNotFoundError, match=r"'missing\.cuh' does not exist"):
        read_source("missing.cuh")


@pytest.mark.nvcc
def test_long_one_line_source_compiles(monkeypatch):
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "9.0a")
    text = 'extern "C" __global__ void long_line(float* x) { x[0] = 1.0f; }' + " " * 300
    assert ".entry long_line" in compile_to_ptx(text)


def test_long_one_line_text_given_to_load_ptx_is_not_ptx():
    with pytest.raises(ValueError, match=r"not PTX \(no \.version"):
        load_ptx("garbage " * 60)


# --------------------------------------------------------------------------- item 12a
@pytest.mark.parametrize("name", ['quote".cpp', 'evil"\n#error injected\n"x.cpp', "cr\r.cpp"])
def test_source_paths_that_cannot_be_included_are_refused(tmp_path, name):
    source = tmp_path / name
    source.write_text(OK_SOURCE)
    with pytest.raises(ValueError, match=r"cannot be written in an #include line") as info:
        cpu_spec("injected", cpp_files=[source], cpp_wrappers=[("f", "ok::f<1>")])
    assert repr(str(source)) in str(info.value)


# --------------------------------------------------------------------------- item 12b
@pytest.mark.parametrize("below", ["", "sub"])
def test_build_directory_that_is_a_file_is_refused_without_suggesting_rm(ok_source, below):
    target = ok_source / below if below else ok_source
    with pytest.raises(ValueError, match=r"build_directory must be a directory") as info:
        load_cpu_jit(
            "on_a_file",
            cpp_files=[ok_source],
            cpp_wrappers=[("f", "ok::f<1>")],
            build_directory=target,
        )
    assert "rm " not in str(info.value) and str(ok_source) in str(info.value)
    assert ok_source.read_text() == OK_SOURCE


# --------------------------------------------------------------------------- item 12c
_LOADER_LISTS = [
    (load, arg)
    for load, args in (
        (
            load_cpu_jit,
            (
                "cpp_files",
                "extra_cxx_flags",
                "extra_ldflags",
                "extra_ld_flags",
                "extra_include_paths",
            ),
        ),
        (
            load_cuda_jit,
            (
                "cpp_files",
                "cuda_files",
                "extra_cxx_flags",
                "extra_cuda_flags",
                "extra_cuda_cxx_flags",
                "extra_ldflags",
                "extra_ld_flags",
                "extra_include_paths",
            ),
        ),
    )
    for arg in args
]


@pytest.mark.parametrize(
    ("load", "arg"), _LOADER_LISTS, ids=[f"{f.__name__}-{a}" for f, a in _LOADER_LISTS]
)
def test_a_str_where_the_loaders_take_a_list_is_refused(ok_source, monkeypatch, load, arg):
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "9.0a")
    wrappers = "cuda_wrappers" if arg == "cuda_files" else "cpp_wrappers"
    kwargs = {"cpp_files": [ok_source], wrappers: [("f", "ok::f<1>")]}
    value = str(ok_source) if arg.endswith("_files") else "-O2"
    with pytest.raises(TypeError, match=rf"^{arg} must be a list, e\.g\. {arg}=\[") as info:
        load("listed", **{**kwargs, arg: value})
    assert "one character at a time" in str(info.value)
    if arg == "cpp_files":  # a single Path is not a list either
        with pytest.raises(TypeError, match=r"^cpp_files must be a list.*got a PosixPath"):
            load("listed", **{**kwargs, arg: ok_source})


@pytest.mark.parametrize(
    ("load", "arg"), _LOADER_LISTS, ids=[f"{f.__name__}-{a}" for f, a in _LOADER_LISTS]
)
def test_an_item_of_another_type_in_a_loader_list_is_refused(ok_source, monkeypatch, load, arg):
    """Before: a bare TypeError from inside subprocess (a flag that is an int) or a str()
    of whatever was given."""
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "9.0a")
    wrappers = "cuda_wrappers" if arg == "cuda_files" else "cpp_wrappers"
    kwargs = {"cpp_files": [ok_source], wrappers: [("f", "ok::f<1>")]}
    kind = "a str or a path" if arg.endswith(("_files", "_paths")) else "a str"
    good = ok_source if arg.endswith(("_files", "_paths")) else "-O2"
    with pytest.raises(TypeError, match=rf"^{arg}: each item must be {kind}, but got 3 \(int\)"):
        load("listed", **{**kwargs, arg: [good, 3]})


@pytest.mark.parametrize("load", [load_cpu_jit, load_cuda_jit], ids=lambda f: f.__name__)
def test_wrappers_must_be_two_str_and_a_module_needs_a_source(ok_source, monkeypatch, load):
    monkeypatch.setenv("MLLM_KERNEL_CUDA_ARCH_LIST", "9.0a")
    for bad in (("f", 5), ("f", None), (b"f", "ok::f<1>")):
        with pytest.raises(TypeError, match=r"^each of cpp_wrappers must be .*two str, got"):
            load("wrapped", cpp_files=[ok_source], cpp_wrappers=[bad])
    for sources in (None, []):
        with pytest.raises(
            ValueError, match=r"cpp_files.*: no source file given for module 'bare'"
        ):
            load("bare", cpp_files=sources, cpp_wrappers=[("f", "ok::f<1>")])


@pytest.mark.parametrize(
    "arg",
    [
        "cpp_files",
        "cuda_files",
        "extra_cxx_flags",
        "extra_cuda_cxx_flags",
        "extra_ld_flags",
        "extra_include_paths",
    ],
)
def test_a_str_where_jit_takes_a_list_is_refused_when_decorating(arg):
    with pytest.raises(TypeError, match=rf"^@jit: {arg} must be a list, e\.g\. {arg}=\["):
        jit(device="cpu", **{"cpp_files": ["k.cpp"], arg: "abc"})


# --------------------------------------------------------------------------- item 12d
def test_a_number_beyond_float_range_names_the_argument_and_the_range():
    with pytest.raises(OverflowError, match=r"^argument 'eps': 1358298529049385849\.\.\. \(") as e:
        op_inputs.number(2**1100, "eps")
    assert "1.797693e+308" in str(e.value)
    assert op_inputs.number(2**1000, "eps") == float(2**1000)


# --------------------------------------------------------------------------- item 12e
def test_empty_string_is_neither_an_image_nor_a_file():
    with pytest.raises(ValueError, match=r"^load_ptx: an empty string is neither PTX"):
        load_ptx("")
    with pytest.raises(ValueError, match=r"^load_cubin: an empty string is neither a CUBIN"):
        load_cubin("")


# --------------------------------------------------------------------------- item 12f
@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("[[maybe_unused]] int n", "int32"),
        ("const float* [[maybe_unused]] x", "pointer:float32"),
        ("[[gnu::unused, maybe_unused]] unsigned long n", "uint64"),
        ("int __attribute__((unused)) n", "int32"),
        ("__attribute__((unused)) float* x", "pointer:float32"),
    ],
)
def test_attributes_in_a_parameter_are_skipped(text, kind):
    (param,) = parse_signature(text)
    assert (param.kind, param.name) == (kind, text.split()[-1])


def test_attributes_in_a_kernel_declaration_are_skipped():
    source = 'extern "C" __global__ void k(float* x, [[maybe_unused]] int n) { x[0] = 0; }'
    assert [p.kind for p in kernel_params(source, "k")] == ["pointer:float32", "int32"]
    with pytest.raises(ValueError, match=r"'n' \(int\*\*\) is a pointer to pointer"):
        parse_signature("[[maybe_unused]] int** n")


# --------------------------------------------------------------------------- item 12g
def _processes_mentioning(marker: str) -> dict[int, str]:
    """pid -> command name of every live (not zombie) process whose command line holds
    ``marker``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:  # a process may exit between the listing and any of these reads
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if marker in cmdline and stat.rsplit(")", 1)[1].split()[0] != "Z":
            found[int(entry.name)] = comm
    return found


_CPU_BUILDER = textwrap.dedent("""\
    import sys
    from mllm_kernel.jit_utils import load_cpu_jit

    load_cpu_jit("stalled", cpp_files=[sys.argv[1]], cpp_wrappers=[("f", "stalled::f")])
""")
_NVCC_BUILDER = textwrap.dedent("""\
    import sys
    from pathlib import Path
    from mllm_kernel.cuda import compile_to_ptx

    compile_to_ptx(Path(sys.argv[1]), arch="sm_90a")
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    ("builder", "suffix"),
    [(_CPU_BUILDER, ".cpp"), pytest.param(_NVCC_BUILDER, ".cu", marks=pytest.mark.nvcc)],
    ids=["load_cpu_jit", "compile_to_ptx"],
)
def test_compilers_die_with_a_killed_builder(tmp_path, builder, suffix):
    # The compiler blocks opening a FIFO: "mid-compile" for as long as the test needs.
    fifo = tmp_path / "stall.h"
    os.mkfifo(fifo)
    source = tmp_path / f"stalled{suffix}"
    source.write_text(f'#include "{fifo}"\nnamespace stalled {{ int f() {{ return 0; }} }}\n')
    marker = str(tmp_path)
    proc = _python(
        builder,
        str(source),
        env={"MLLM_KERNEL_CACHE_DIR": str(tmp_path / "cache")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    left: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while "cc1plus" not in _processes_mentioning(marker).values():
            assert proc.poll() is None, f"the builder exited ({proc.returncode}) before compiling"
            assert time.monotonic() < deadline, "no compiler started"
            time.sleep(0.1)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 5
        while _processes_mentioning(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _processes_mentioning(marker)
        assert not left, f"still running after the builder was killed: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in left:  # the orphans this test started, by id
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
