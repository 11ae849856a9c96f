"""Code written against the original mllm-kernel runs here unchanged (issue 13).

Only the original's API is used, as its README and docstrings show it: the ``jit``
decorator (a CPU kernel that runs here, a CUDA kernel compiled for sm_90a without a
GPU), its registry functions and path constants, and the CUDA ops through its import
paths and argument orders (``cuda`` marker). The path constants of an installed copy
are checked in test_packaging.py, which builds the wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

# dst = src + kAdd over float32 tensors; a global template, so the decorator's default
# wrapper ("add_k", "add_k<N>") names it.
ADD_K_CPP = """
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.hpp"

template <int kAdd>
void add_k(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  using namespace mllm_kernel;
  SymbolicDevice device;
  TensorMatcher().dtype<fp32_t>().device(kDLCPU, device).contiguous().verify(src, "src");
  TensorMatcher().dtype<fp32_t>().device(kDLCPU, device).contiguous().verify(dst, "dst");
  ValueCheck(dst.numel() == src.numel(), "argument 'dst': wrong size");
  const float* in = data_ptr<const float>(src);
  float* out = data_ptr<float>(dst);
  for (int64_t i = 0, n = src.numel(); i < n; ++i) out[i] = in[i] + kAdd;
}
"""

# The same on a GPU, int32.
ADD_K_CU = """
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

template <int kAdd>
__global__ void add_k_kernel(int32_t* out, const int32_t* in, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + kAdd;
}

template <int kAdd>
void add_k_cuda(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  using namespace mllm_kernel;
  SymbolicDevice device;
  TensorMatcher().dtype<int32_t>().device(kDLCUDA, device).contiguous().verify(src, "src");
  TensorMatcher().dtype<int32_t>().device(kDLCUDA, device).contiguous().verify(dst, "dst");
  const int64_t n = src.numel();
  if (n == 0) return;
  KernelLauncher(dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), device.value())(
      add_k_kernel<kAdd>, data_ptr<int32_t>(dst), data_ptr<const int32_t>(src), n);
}
"""


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat_sources")
    (root / "add_k.cpp").write_text(ADD_K_CPP)
    (root / "add_k.cu").write_text(ADD_K_CU)
    return root


@pytest.fixture
def clean_jit_registry():
    """Each test starts and ends with no @jit kernels registered, nor the loaded-module
    entries the registry adds when a kernel it forgot is called again."""
    from mllm_kernel.jit_utils import clear_jit_kernel_registry, registry

    def clean():
        clear_jit_kernel_registry()
        for name in ("add_k", "add_k_cuda"):
            for device in ("cpu", "cuda"):
                registry.unregister(name, device)

    clean()
    yield
    clean()


def _user_kernels(name):
    from mllm_kernel.jit_utils import registry

    return {e.device: e for e in registry.kernels(include_builtin=False) if e.name == name}


def _poisoned(x):
    return torch.full_like(x, float("nan"))


# ------------------------------------------------------------------ the decorator (CPU)
def test_readme_pattern_on_a_cpu_kernel(sources, clean_jit_registry):
    import mllm_kernel
    from mllm_kernel.jit_utils import get_jit_kernel_registry

    seen = []

    @mllm_kernel.jit(
        args=16,
        device="cpu",
        cpp_files=[str(sources / "add_k.cpp")],
        cpp_wrappers=[("add_k", "add_k<16>")],
        func_name="add_k",
    )
    def _add_k_16(compiled_module, dst: torch.Tensor, src: torch.Tensor) -> None:
        seen.append(compiled_module)
        compiled_module.add_k(dst, src)

    src = torch.randn(1000, dtype=torch.float32)
    for _ in range(2):
        dst = _poisoned(src)
        assert _add_k_16(dst, src) is None
        torch.testing.assert_close(dst.double(), src.double() + 16, rtol=0, atol=1e-5)
    assert seen[0] is seen[1]  # built once, the same module passed each time
    assert _add_k_16.__name__ == "_add_k_16"  # functools.wraps, as the original

    (info,) = get_jit_kernel_registry().values()
    assert info["key"] == (
        f"{__name__}.test_readme_pattern_on_a_cpu_kernel.<locals>._add_k_16"
        "|export=add_k|device=cpu|template=16"
    )
    assert info["export_name"] == "add_k" and info["decorator_device"] == "cpu"
    assert info["template_args"] == ("16",) and info["has_cuda_config"] is False
    assert info["cpp_wrappers"] == (("add_k", "add_k<16>"),) and info["use_highway"] is True


def test_default_wrapper_auto_device_and_show_config(sources, clean_jit_registry):
    from mllm_kernel.jit_utils import jit, registry

    @jit(args=[2], cpp_files=[str(sources / "add_k.cpp")])
    def add_k(compiled_module, dst, src):
        compiled_module.add_k(dst, src)  # the default wrapper: ("add_k", "add_k<2>")

    @jit(args=16, device="cpu", cpp_files=[str(sources / "add_k.cpp")], func_name="add_k")
    def add_k_16(compiled_module, dst, src):
        compiled_module.add_k(dst, src)

    # Both kernels are one registry kernel with a variant each, seen before any call.
    entry = _user_kernels("add_k")["cpu"]
    assert entry.variants == [("2",), ("16",)] and not entry.builtin
    assert "cuda" not in _user_kernels("add_k")
    assert registry.variant_status(entry, ("2",)).status == "not built"

    src = torch.randn(3, 37)
    dst = _poisoned(src)
    add_k(dst, src=src)  # CPU tensors (one by keyword): device="auto" picks the CPU
    torch.testing.assert_close(dst.double(), src.double() + 2, rtol=0, atol=1e-5)
    assert registry.variant_status(entry, ("2",)).status == "cached"
    add_k_16(dst, src)
    torch.testing.assert_close(dst.double(), src.double() + 16, rtol=0, atol=1e-5)


def test_precompile_builds_a_decorated_kernel_before_its_first_call(
    sources, clean_jit_registry, fresh_cache
):
    from mllm_kernel.jit_utils import jit, precompile

    @jit(args=4, device="cpu", cpp_files=[str(sources / "add_k.cpp")], func_name="add_k")
    def add_k_4(compiled_module, dst, src):
        compiled_module.add_k(dst, src)

    report = precompile.precompile(device="cpu", kernels=["add_k"])
    assert [(r.job.variant, r.status) for r in report.results] == [(("4",), "built")]
    assert report.results[0].path.parent == fresh_cache
    src = torch.randn(10)
    dst = _poisoned(src)
    add_k_4(dst, src)  # loads what precompile built
    torch.testing.assert_close(dst, src + 4, rtol=0, atol=1e-5)
    again = precompile.precompile(device="cpu", kernels=["add_k"])
    assert [r.status for r in again.results] == ["cached"]


def test_build_directory_holds_the_module_and_is_reused(
    sources, clean_jit_registry, fresh_cache, tmp_path
):
    from mllm_kernel.jit_utils import build_inputs, cache, jit

    build_directory = tmp_path / "my_build"

    def decorated():
        @jit(
            args=3,
            device="cpu",
            cpp_files=[str(sources / "add_k.cpp")],
            func_name="add_k",
            build_directory=str(build_directory),
        )
        def add_k_3(compiled_module, dst, src):
            compiled_module.add_k(dst, src)

        return add_k_3

    src = torch.randn(64)
    dst = _poisoned(src)
    decorated()(dst, src)
    torch.testing.assert_close(dst, src + 3, rtol=0, atol=1e-5)
    (module_dir,) = [p for p in build_directory.iterdir() if p.name.startswith("add_k_cpu_3_")]
    manifest = cache.Manifest.read(module_dir)
    artifact = module_dir / manifest.artifact
    built_at = artifact.stat().st_mtime_ns
    assert not fresh_cache.exists() or not any(fresh_cache.glob("add_k_cpu_3_*"))

    # A second decorator (a new process would do the same) loads it without compiling.
    dst = _poisoned(src)
    decorated()(dst, src)
    torch.testing.assert_close(dst, src + 3, rtol=0, atol=1e-5)
    assert artifact.stat().st_mtime_ns == built_at

    # A corrupt artifact there is found and rebuilt, as in the cache root. Written as a
    # new file: truncating the mapped library of this process would crash it (SIGBUS).
    damaged = artifact.with_name("damaged.tmp")
    damaged.write_bytes(b"not a shared library")
    os.replace(damaged, artifact)
    dst = _poisoned(src)
    decorated()(dst, src)
    torch.testing.assert_close(dst, src + 3, rtol=0, atol=1e-5)
    assert build_inputs.file_digest(artifact) == cache.Manifest.read(module_dir).artifact_sha256


def test_load_jit_takes_the_originals_keyword_names(sources, fresh_cache, tmp_path):
    """The original's load_cpu_jit(*args, ..., extra_ld_flags, use_highway,
    build_directory) and load_cuda_jit's extra_cuda_cxx_flags spell our options."""
    from mllm_kernel.jit_utils import load_cpu_jit, load_cuda_jit, registry

    build_directory = tmp_path / "original_build"
    try:
        module = load_cpu_jit(
            "add_k",
            "5",
            cpp_files=[str(sources / "add_k.cpp")],
            cpp_wrappers=[("add_k", "add_k<5>")],
            extra_ld_flags=["-lm"],
            use_highway=True,
            build_directory=str(build_directory),
        )
        src = torch.randn(16)
        dst = _poisoned(src)
        module.add_k(dst, src)
        torch.testing.assert_close(dst, src + 5, rtol=0, atol=1e-5)
        assert [p for p in build_directory.iterdir() if p.name.startswith("add_k_cpu_5_")]
        assert not fresh_cache.exists() or not any(fresh_cache.glob("add_k_cpu_5_*"))
        with pytest.raises(TypeError, match="extra_ldflags or extra_ld_flags"):
            load_cpu_jit(
                "add_k",
                "5",
                cpp_files=[str(sources / "add_k.cpp")],
                cpp_wrappers=[("add_k", "add_k<5>")],
                extra_ldflags=["-lm"],
                extra_ld_flags=["-lm"],
            )
        with pytest.raises(TypeError, match="extra_cuda_flags or extra_cuda_cxx_flags"):
            load_cuda_jit(
                "add_k_cuda",
                cuda_files=[str(sources / "add_k.cu")],
                extra_cuda_flags=["-DX"],
                extra_cuda_cxx_flags=["-DX"],
            )
    finally:
        registry.unregister("add_k", "cpu")


def test_use_highway_has_no_effect(sources, clean_jit_registry):
    from mllm_kernel.jit_utils import jit, registry

    specs = []
    for use_highway in (True, False):

        @jit(
            args=5,
            device="cpu",
            cpp_files=[str(sources / "add_k.cpp")],
            func_name="add_k",
            use_highway=use_highway,
        )
        def add_k_5(compiled_module, dst, src):
            compiled_module.add_k(dst, src)

        specs.append(_user_kernels("add_k")["cpu"].spec(("5",)))
    assert specs[0] == specs[1]
    assert registry.get_jit_kernel_registry()  # both recorded (same key: the last wins)


def test_registry_functions(sources, clean_jit_registry):
    from mllm_kernel.jit_utils import (
        clear_jit_kernel_registry,
        get_jit_kernel_registry,
        jit,
        register_jit_kernel,
    )

    register_jit_kernel({"key": "pkg.f|export=f|device=cpu|template=-", "export_name": "f"})
    copy = get_jit_kernel_registry()
    copy["pkg.f|export=f|device=cpu|template=-"]["export_name"] = "changed"
    assert get_jit_kernel_registry() == {
        "pkg.f|export=f|device=cpu|template=-": {
            "key": "pkg.f|export=f|device=cpu|template=-",
            "export_name": "f",
        }
    }
    with pytest.raises(TypeError, match="register_jit_kernel: expected a dict with a 'key'"):
        register_jit_kernel({"export_name": "g"})

    @jit(args=7, device="cpu", cpp_files=[str(sources / "add_k.cpp")], func_name="add_k")
    def add_k_7(compiled_module, dst, src):
        compiled_module.add_k(dst, src)

    assert len(get_jit_kernel_registry()) == 2 and "cpu" in _user_kernels("add_k")
    clear_jit_kernel_registry()
    assert get_jit_kernel_registry() == {} and _user_kernels("add_k") == {}
    src = torch.randn(5)
    dst = _poisoned(src)
    add_k_7(dst, src)  # the decorated function keeps working
    torch.testing.assert_close(dst, src + 7, rtol=0, atol=1e-5)


def test_decorator_errors(sources, clean_jit_registry):
    from mllm_kernel.jit_utils import jit

    with pytest.raises(ValueError, match=r"@jit: device must be one of \('auto', 'cpu', 'cuda'\)"):
        jit(device="gpu")
    with pytest.raises(ValueError, match="module name 'my-kernel' must be a C identifier"):
        jit(func_name="my-kernel")(lambda module: None)

    @jit(args=1, device="cuda", cpp_files=[str(sources / "add_k.cpp")], func_name="add_k")
    def cpu_only(compiled_module, dst, src):
        compiled_module.add_k(dst, src)

    x = torch.zeros(2)
    with pytest.raises(
        ValueError,
        match=r"@jit kernel 'add_k': the call resolved to CUDA \(device='cuda'\) but the "
        r"kernel has no CUDA sources; give it cuda_files/cuda_wrappers, or device='cpu'",
    ):
        cpu_only(x, x)


# ----------------------------------------------------------------- the decorator (CUDA)
def _add_k_cuda(sources):
    from mllm_kernel.jit_utils import jit

    # No wrappers given: ("add_k_cuda", "add_k_cuda<8>") is exported from the CUDA sources.
    @jit(args=8, device="cuda", cuda_files=[str(sources / "add_k.cu")], func_name="add_k_cuda")
    def add_k_cuda_8(compiled_module, dst, src):
        compiled_module.add_k_cuda(dst, src)

    return add_k_cuda_8


@pytest.mark.nvcc
def test_cuda_kernel_compiles_through_precompile(sources, clean_jit_registry, fresh_cache):
    from mllm_kernel.jit_utils import cache, get_jit_kernel_registry, precompile

    _add_k_cuda(sources)
    assert set(_user_kernels("add_k_cuda")) == {"cuda"}
    (info,) = get_jit_kernel_registry().values()
    assert info["has_cuda_config"] is True
    assert info["cuda_wrappers"] == (("add_k_cuda", "add_k_cuda<8>"),)
    assert info["cpp_wrappers"] == ()

    report = precompile.precompile(device="cuda", arch="9.0a", kernels=["add_k_cuda"])
    assert [r.status for r in report.results] == ["built"], report.results
    assert cache.Manifest.read(report.results[0].path).cuda_archs == ["9.0a"]


@pytest.mark.cuda
def test_cuda_kernel_runs(sources, clean_jit_registry):
    add_k_cuda_8 = _add_k_cuda(sources)
    src = torch.randint(-1000, 1000, (4099,), dtype=torch.int32, device="cuda")
    dst = torch.full_like(src, -7)
    add_k_cuda_8(dst, src)
    torch.testing.assert_close(dst, src + 8, rtol=0, atol=0)


@pytest.mark.cuda
def test_auto_device_refuses_mixed_cpu_and_cuda_tensors(sources, clean_jit_registry):
    from mllm_kernel.jit_utils import jit

    @jit(args=8, cuda_files=[str(sources / "add_k.cu")], cpp_wrappers=[],
         cuda_wrappers=[("add_k_cuda", "add_k_cuda<8>")], func_name="add_k_cuda")  # fmt: skip
    def add_k_auto(compiled_module, dst, src):
        compiled_module.add_k_cuda(dst, src)

    with pytest.raises(ValueError, match="device='auto' cannot choose between CPU and CUDA"):
        add_k_auto(torch.zeros(4, dtype=torch.int32, device="cuda"), torch.zeros(4))
    src = torch.arange(300, dtype=torch.int32, device="cuda")
    dst = torch.full_like(src, -7)
    add_k_auto(dst, src)
    torch.testing.assert_close(dst, src + 8, rtol=0, atol=0)


# ------------------------------------------------------------------- path constants
def test_path_constants_in_a_checkout():
    import mllm_kernel
    from mllm_kernel.jit_utils import (
        MLLM_KERNEL_ASCEND_CSRC_DIR,
        MLLM_KERNEL_ASCEND_INCLUDE_DIR,
        MLLM_KERNEL_ASCEND_PATH,
        MLLM_KERNEL_CPU_CSRC_DIR,
        MLLM_KERNEL_CPU_INCLUDE_DIR,
        MLLM_KERNEL_CPU_PATH,
        MLLM_KERNEL_CUDA_CSRC_DIR,
        MLLM_KERNEL_CUDA_INCLUDE_DIR,
        MLLM_KERNEL_CUDA_PATH,
        MLLM_KERNEL_INCLUDE_DIR,
        MLLM_KERNEL_TOP_PATH,
    )
    from mllm_kernel.jit_utils import compile as original_compile

    top = Path(mllm_kernel.__file__).resolve().parent
    assert top == MLLM_KERNEL_TOP_PATH
    assert (MLLM_KERNEL_INCLUDE_DIR / "mllm_kernel" / "tensor.hpp").is_file()
    assert (top / "cpu", top / "cuda") == (MLLM_KERNEL_CPU_PATH, MLLM_KERNEL_CUDA_PATH)
    assert (MLLM_KERNEL_CPU_CSRC_DIR / "add_constant.cpp").is_file()
    assert (MLLM_KERNEL_CUDA_CSRC_DIR / "store_cache.cu").is_file()
    assert (MLLM_KERNEL_CPU_INCLUDE_DIR / "parallel.hpp").is_file()
    assert (MLLM_KERNEL_CUDA_INCLUDE_DIR / "activation.cuh").is_file()
    # No Ascend tree: the constants say where it would be, as the original's do.
    assert top / "ascend" == MLLM_KERNEL_ASCEND_PATH and not MLLM_KERNEL_ASCEND_PATH.exists()
    assert top / "ascend" / MLLM_KERNEL_CPU_CSRC_DIR.name == MLLM_KERNEL_ASCEND_CSRC_DIR
    assert MLLM_KERNEL_ASCEND_INCLUDE_DIR == MLLM_KERNEL_INCLUDE_DIR / "mllm_kernel" / "ascend"
    # The original's module path gives the same objects.
    assert original_compile.MLLM_KERNEL_CUDA_CSRC_DIR is MLLM_KERNEL_CUDA_CSRC_DIR
    assert original_compile.jit is mllm_kernel.jit


# ------------------------------------------------------------ names and module paths
def test_names_and_module_paths_in_a_fresh_interpreter():
    # Fresh: the first import of an op's module path must not replace the package's
    # function of the same name (Python sets the attribute to the submodule).
    script = textwrap.dedent("""
        import types
        import mllm_kernel.cuda.jit.store_cache
        import mllm_kernel.cuda.jit.create_kv_indices
        import mllm_kernel.cuda.jit.rms_norm_gated
        import mllm_kernel.cuda.jit.add_constant
        import mllm_kernel
        from mllm_kernel.cuda.jit import (
            add_constant, can_use_store_cache, create_kv_indices, rms_norm_gated, store_cache,
        )
        from mllm_kernel.cuda.jit.store_cache import store_cache as store_cache_2
        from mllm_kernel.cuda.jit.create_kv_indices import create_kv_indices as cki_2
        from mllm_kernel.cuda.jit.rms_norm_gated import rms_norm_gated as rng_2
        from mllm_kernel.cuda.jit.add_constant import add_constant as add_2
        from mllm_kernel.cpu.jit import add_constant_runtime
        from mllm_kernel.jit_utils.compile import cache_once, make_cpp_args
        for f in (add_constant, can_use_store_cache, create_kv_indices, rms_norm_gated,
                  store_cache):
            assert isinstance(f, types.FunctionType), f
        assert mllm_kernel.cuda.jit.store_cache is store_cache is store_cache_2
        assert (cki_2, rng_2, add_2) == (create_kv_indices, rms_norm_gated, add_constant)
        assert mllm_kernel.jit is mllm_kernel.jit_utils.jit
        assert mllm_kernel.cpu.jit.add_constant_runtime is add_constant_runtime
        assert isinstance(mllm_kernel.__version__, str)
        print("ok")
    """)
    import mllm_kernel

    # The package this session tests (the checkout, or CI's installed copy).
    package_root = Path(mllm_kernel.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_cpu_add_constant_as_the_original_readme_calls_it():
    from mllm_kernel.cpu.jit import add_constant, add_constant_runtime

    x = torch.randn(1024, dtype=torch.float32)
    torch.testing.assert_close(add_constant(x, 16), x + 16, rtol=0, atol=1e-5)
    torch.testing.assert_close(add_constant_runtime(x, 3.14159), x + 3.14159, rtol=0, atol=1e-5)


# ------------------------------------------------- store_cache arguments (no GPU needed)
@pytest.mark.parametrize("row_bytes", [0, -4, 2.5, "256", None, True])
def test_can_use_store_cache_is_false_not_an_error_for_sizes_it_cannot_take(row_bytes):
    from mllm_kernel.cuda.jit.store_cache import can_use_store_cache

    assert can_use_store_cache(row_bytes) is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_can_use_store_cache_is_false_where_the_kernel_cannot_be_built(monkeypatch):
    from mllm_kernel.cuda.jit.store_cache import can_use_store_cache

    monkeypatch.delenv("MLLM_KERNEL_CUDA_ARCH_LIST", raising=False)
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    assert can_use_store_cache(1024) is False


def _kv(device, tokens=4, width=128, dtype=torch.bfloat16):
    k = torch.randn(tokens, width, device=device).to(dtype)
    cache = torch.zeros(16, width, device=device, dtype=dtype)
    indices = torch.arange(tokens, device=device, dtype=torch.int32)
    return k, k.clone(), cache, cache.clone(), indices


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"row_bytes": 512},
            ValueError,
            r"^argument 'row_bytes': 512 disagrees with argument 'k', whose rows hold 256 bytes; "
            r"pass row_bytes=0",
        ),
        ({"row_bytes": -256}, ValueError, r"^argument 'row_bytes': -256 disagrees"),
        ({"row_bytes": 256.0}, TypeError, r"^argument 'row_bytes': expected an int but got float"),
        (
            {"num_split": 3},
            ValueError,
            r"^argument 'num_split': expected 0 \(automatic\), 1, 2 or 4, got 3",
        ),
        ({"num_split": -1}, ValueError, r"^argument 'num_split': expected 0 \(automatic\)"),
        (
            {"num_split": 4},
            ValueError,
            r"^argument 'num_split': 4 needs rows of a multiple of 512 bytes, got 256; "
            r"pass num_split=0",
        ),
        ({"num_split": "2"}, TypeError, r"^argument 'num_split': expected an int but got str"),
    ],
)
def test_store_cache_refuses_row_bytes_and_num_split_it_cannot_honour(kwargs, error, message):
    from mllm_kernel.cuda.jit.store_cache import store_cache

    # Checked before the device: CPU tensors reach the check and nothing compiles.
    with pytest.raises(error, match=message):
        store_cache(*_kv("cpu"), **kwargs)


# --------------------------------------------------------- the CUDA ops (on a GPU)
@pytest.mark.cuda
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(
    ("width", "num_split"), [(64, 0), (64, 1), (128, 2), (256, 4), (256, 0), (3, 0)]
)
def test_store_cache_as_the_original_calls_it(index_dtype, width, num_split):
    from mllm_kernel.cuda.jit.store_cache import can_use_store_cache, store_cache

    tokens, slots, dtype = 37, 100, torch.float16
    k = torch.randn(tokens, width, device="cuda").to(dtype)
    v = torch.randn(tokens, width, device="cuda").to(dtype)
    k_cache = torch.randn(slots, width, device="cuda").to(dtype)
    v_cache = torch.randn(slots, width, device="cuda").to(dtype)
    indices = torch.randperm(slots, device="cuda")[:tokens].to(index_dtype)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    k_expected[indices.long()] = k
    v_expected[indices.long()] = v
    row_bytes = width * k.element_size()
    assert can_use_store_cache(row_bytes) is True
    store_cache(k, v, k_cache, v_cache, indices, row_bytes=row_bytes, num_split=num_split)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)
    store_cache(k * 2, v * 2, k_cache, v_cache, indices)  # defaults: both automatic
    assert torch.equal(k_cache[indices.long()], k * 2)


@pytest.mark.cuda
@pytest.mark.parametrize("start", ["none", "empty", "given"])
@pytest.mark.parametrize("pool_dtype", [torch.int32, torch.int64])
def test_create_kv_indices_as_the_original_calls_it(start, pool_dtype):
    from mllm_kernel.cuda.jit.create_kv_indices import create_kv_indices

    # The original's tensors are all int32; req_pool_indices from torch.randperm is int64
    # unless converted, and either is taken.
    max_reqs, max_ctx, batch = 12, 300, 7
    req_to_token = torch.randint(0, 1 << 20, (max_reqs, max_ctx), device="cuda").int()
    req_pool_indices = torch.randperm(max_reqs, device="cuda")[:batch].to(pool_dtype)
    page_kernel_lens = torch.randint(1, 150, (batch,), device="cuda", dtype=torch.int32)
    kv_start = torch.randint(0, 150, (batch,), device="cuda", dtype=torch.int32)
    kv_indptr = torch.zeros(batch + 1, device="cuda", dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(page_kernel_lens, 0)
    kv_indices = torch.full((int(kv_indptr[-1]),), -1, device="cuda", dtype=torch.int32)
    kv_start_idx = {
        "none": None,
        "empty": req_pool_indices.new_empty(0, dtype=torch.int32),
        "given": kv_start,
    }[start]
    create_kv_indices(
        req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices
    )
    offsets = kv_start if start == "given" else torch.zeros_like(kv_start)
    expected = torch.cat(
        [
            req_to_token[int(r), int(s) : int(s) + int(n)]
            for r, s, n in zip(req_pool_indices, offsets, page_kernel_lens, strict=True)
        ]
    )
    assert torch.equal(kv_indices, expected)


@pytest.mark.cuda
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rms_norm_gated_as_the_original_calls_it(gated, dtype):
    from mllm_kernel.cuda.jit.rms_norm_gated import rms_norm_gated

    x = torch.randn(2, 33, 1000, device="cuda").to(dtype)  # (..., N), as its docstring
    weight = (1 + 0.5 * torch.randn(1000, device="cuda")).to(dtype)
    gate = torch.randn_like(x)
    output = rms_norm_gated(x, weight, z=gate if gated else None, eps=1e-6)
    assert output.shape == x.shape and output.dtype == x.dtype
    xd = x.double()
    expected = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
    if gated:
        expected = expected * torch.nn.functional.silu(gate.double())
    tol = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(output.double(), expected, rtol=tol, atol=tol)
    positional = rms_norm_gated(x, weight, gate if gated else None, 1e-6)
    assert torch.equal(positional, output)


@pytest.mark.cuda
def test_cuda_add_constant_as_the_original_readme_calls_it():
    from mllm_kernel.cuda.jit import add_constant

    x = torch.arange(1024, dtype=torch.int32, device="cuda")
    assert torch.equal(add_constant(x, 8), x + 8)
