"""The raw runtime on a GPU: launches from torch, CuPy and NumPy, 100 KB of dynamic shared
memory, side streams, launch configurations, NVRTC, CUBIN/PTX files, ``Kernel()``,
device_info, a second GPU, and every bad argument."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from mllm_kernel.cuda import (
    Kernel,
    compile_kernel,
    compile_to_cubin,
    compile_to_ptx,
    device_info,
    load_cubin,
    load_ptx,
)

pytestmark = pytest.mark.cuda

SOURCE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>

extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) c[i] = a[i] + b[i];
}

// Each block stages `chunk` elements in dynamic shared memory and writes them reversed.
extern "C" __global__ void reverse_chunks(const float* in, float* out, int n, int chunk) {
  extern __shared__ float tile[];
  const int base = blockIdx.x * chunk;
  const int len = min(chunk, n - base);
  for (int i = threadIdx.x; i < len; i += blockDim.x) tile[i] = in[base + i];
  __syncthreads();
  for (int i = threadIdx.x; i < len; i += blockDim.x) out[base + i] = tile[len - 1 - i];
}

extern "C" __global__ void count_threads(int* hits) { atomicAdd(hits, 1); }

// Spins until the host opens the gate, an int in pinned host memory (at most ~10 s,
// so that a broken test cannot hang the GPU).
extern "C" __global__ void wait_for_gate(unsigned long long gate_address) {
  const volatile int* gate = reinterpret_cast<const volatile int*>(gate_address);
  const long long start = clock64();
  while (*gate == 0 && clock64() - start < 20000000000LL) {
  }
}

extern "C" __global__ void scalars(double* out, long long* u64_bits, bool b, signed char i8,
                                   short i16, int i32, long long i64, unsigned char u8,
                                   unsigned short u16, unsigned int u32, unsigned long long u64,
                                   __half h, __nv_bfloat16 bf, float f, double d) {
  out[0] = b;
  out[1] = i8;
  out[2] = i16;
  out[3] = i32;
  out[4] = static_cast<double>(i64);
  out[5] = u8;
  out[6] = u16;
  out[7] = u32;
  out[8] = __half2float(h);
  out[9] = __bfloat162float(bf);
  out[10] = f;
  out[11] = d;
  u64_bits[0] = static_cast<long long>(u64);
}
"""
ADD_SIGNATURE = "const float*, const float*, float*, int"
BLOCK = 256


def _grid(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


@pytest.fixture(scope="module")
def add():
    return compile_kernel(SOURCE, "vector_add", block=BLOCK)


@pytest.fixture(scope="module")
def reverse():
    return compile_kernel(SOURCE, "reverse_chunks", block=BLOCK)


@pytest.fixture(scope="module")
def count():
    return compile_kernel(SOURCE, "count_threads", grid=1, block=32)


def _inputs(n: int, device: str = "cuda"):
    a = torch.randn(n, device=device)
    b = torch.randn(n, device=device)
    c = torch.full((n,), float("nan"), device=device)  # poisoned
    return a, b, c


def _expected(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() + b.double()).float()


@pytest.mark.parametrize("n", [1, 255, 256, 257, 100_003])
def test_vector_add_from_torch(add, n):
    a, b, c = _inputs(n)
    add(a, b, c, n, grid=_grid(n))
    torch.testing.assert_close(c, _expected(a, b), rtol=0, atol=0)


BRANCHED = r"""
#ifdef HALF_KERNEL
extern "C" __global__ void twice(const __half* x, __half* y, int n);
#else
extern "C" __global__ void twice(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
#endif
"""


def test_signature_where_the_preprocessor_picks_the_declaration():
    """Declarations in #ifdef branches are not told apart by reading the source (it is
    refused as an overload, naming the way out): signature= gives the types instead."""
    with pytest.raises(ValueError, match=r"pass signature='\.\.\.' to compile_kernel"):
        compile_kernel(BRANCHED, "twice")
    twice = compile_kernel(BRANCHED, "twice", signature="const float*, float*, int", block=128)
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    twice(x, y, x.numel(), grid=8)
    torch.testing.assert_close(y, 2 * x, rtol=0, atol=0)


def test_views_pass_their_offset(add):
    base = torch.randn(3, 1000, device="cuda")
    out = torch.full((1000,), float("nan"), device="cuda")
    add(base[1], base[2], out, 1000, grid=_grid(1000))  # rows 1 and 2 start past the base
    torch.testing.assert_close(out, _expected(base[1], base[2]), rtol=0, atol=0)


def test_vector_add_from_cupy(add):
    cp = pytest.importorskip("cupy")
    n = 4099
    a = cp.random.rand(n, dtype=cp.float32)
    b = cp.random.rand(n, dtype=cp.float32)
    c = cp.full(n, cp.nan, dtype=cp.float32)
    add(a, b, c, n, grid=_grid(n))
    cp.cuda.runtime.deviceSynchronize()
    expected = cp.asnumpy(a).astype(np.float64) + cp.asnumpy(b)
    np.testing.assert_array_equal(cp.asnumpy(c), expected.astype(np.float32))
    stream = cp.cuda.Stream(non_blocking=True)
    c[...] = cp.nan
    cp.cuda.runtime.deviceSynchronize()  # the side stream does not wait for the fill
    add(a, b, c, n, grid=_grid(n), stream=stream)
    stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(c), expected.astype(np.float32))


def test_numpy_inputs_on_a_side_stream_outlive_the_kernel(add):
    """NumPy arrays for const pointers are copied to the GPU and the copies freed as the
    call returns: on a stream other than torch's current one the call first waits for
    the kernel, so that the allocator cannot hand the copies out while it reads them."""
    n = 1 << 24
    a = np.random.rand(n).astype(np.float32)
    b = np.random.rand(n).astype(np.float32)
    c = torch.full((n,), float("nan"), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # the fill first
    add(a, b, c, n, grid=_grid(n), stream=side)
    assert side.query(), "the call returned while its kernel could still read the copies"
    expected = torch.from_numpy(a.astype(np.float64) + b).float().cuda()
    torch.testing.assert_close(c, expected, rtol=0, atol=0)


def test_numpy_arrays_round_trip(add):
    n = 1000
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    a_before = a.copy()
    c = np.full(n, np.nan, np.float32)
    add(a, b, c, n, grid=_grid(n))  # copied in, c copied back; the call synchronised
    np.testing.assert_array_equal(c, (a.astype(np.float64) + b).astype(np.float32))
    np.testing.assert_array_equal(a, a_before)
    # Mixed with a CUDA tensor: the arrays go to the tensor's GPU.
    b_gpu = torch.from_numpy(b).cuda()
    c2 = np.full(n, np.nan, np.float32)
    add(a, b_gpu, c2, np.int32(n), grid=_grid(n))
    np.testing.assert_array_equal(c2, c)
    # A strided array is copied contiguous and written back through its view.
    wide = np.full((n, 2), np.nan, np.float32)
    add(a, b, wide[:, 0], n, grid=_grid(n))
    np.testing.assert_array_equal(wide[:, 0], c)
    assert np.isnan(wide[:, 1]).all()


def test_100kb_of_dynamic_shared_memory(reverse):
    chunk = 100 * 1024 // 4  # 100 KB of floats per block: above the 48 KB default
    n = 3 * chunk + 77
    x = torch.randn(n, device="cuda")
    out = torch.full_like(x, float("nan"))
    reverse(x, out, n, chunk, grid=(n + chunk - 1) // chunk, shared_mem=chunk * 4)
    expected = torch.cat([piece.flip(0) for piece in x.split(chunk)])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_shared_memory_above_the_opt_in_limit(reverse):
    limit = device_info(torch.cuda.current_device())["shared_memory_per_block_optin"]
    x = torch.randn(16, device="cuda")
    with pytest.raises(
        RuntimeError,
        match=rf"cudaErrorInvalidValue: {limit + 4} bytes of dynamic shared memory requested, "
        rf"the device allows this kernel at most {limit}.*shared_mem={limit + 4}",
    ):
        reverse(x, x, 16, 16, grid=1, shared_mem=limit + 4)


def test_side_stream(add):
    wait_for_gate = compile_kernel(SOURCE, "wait_for_gate", grid=1, block=1)
    # The side stream stays busy until the host opens the gate, however slow a loaded
    # host (pytest -n 14 on the GPU machine) is; the default stream is not busy.
    gate = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    n = 5000
    a, b, c = _inputs(n)
    # Loaded before the gate closes: CUDA loads a kernel at its first launch (lazy
    # loading), and that load waits for the spinning gate kernel to time out.
    add(a, b, c, n, grid=_grid(n))
    torch.cuda.synchronize()
    c.fill_(float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    wait_for_gate(gate.data_ptr(), stream=side)
    add(a, b, c, n, grid=_grid(n), stream=side)
    assert not side.query()
    gate[0] = 1
    add.synchronize(side)
    assert side.query()
    torch.testing.assert_close(c, _expected(a, b), rtol=0, atol=0)
    c.fill_(float("nan"))
    gate[0] = 0
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # stream=None: torch's current stream
        wait_for_gate(gate.data_ptr())
        add(a, b, c, n, grid=_grid(n))
        assert not side.query()
    gate[0] = 1
    add.synchronize(side.cuda_stream)  # a raw cudaStream_t
    torch.testing.assert_close(c, _expected(a, b), rtol=0, atol=0)


def test_fixed_and_per_call_configurations(count):
    hits = torch.zeros(1, dtype=torch.int32, device="cuda")
    count(hits)  # the compile-time grid=1, block=32
    assert hits.item() == 32
    hits.zero_()
    count(hits, grid=(2, 3), block=(4, 2, 2))  # per call: 6 blocks of 16
    assert hits.item() == 96
    hits.zero_()
    count(hits, block=[8])  # grid from compile time, block from the call
    assert hits.item() == 8
    bare = compile_kernel(SOURCE, "count_threads")
    with pytest.raises(ValueError, match=r"kernel 'count_threads': no grid size: pass grid="):
        bare(hits)
    with pytest.raises(ValueError, match="no block size"):
        bare(hits, grid=1)


def test_nvrtc_backend():
    pytest.importorskip("cuda.bindings.nvrtc")
    add = compile_kernel(SOURCE, "vector_add", backend="nvrtc", block=BLOCK)
    a, b, c = _inputs(3000)
    add(a, b, c, 3000, grid=_grid(3000))
    torch.testing.assert_close(c, _expected(a, b), rtol=0, atol=0)


def test_load_cubin_written_by_compile_to_cubin(tmp_path):
    path = tmp_path / "add.cubin"
    path.write_bytes(compile_to_cubin(SOURCE))
    module = load_cubin(path)
    add = module.get_function("vector_add", signature=ADD_SIGNATURE, block=BLOCK)
    a, b, c = _inputs(777)
    add(a, b, c, 777, grid=_grid(777))
    torch.testing.assert_close(c, _expected(a, b), rtol=0, atol=0)
    with pytest.raises(ValueError, match="a CUBIN has no source to read the parameter types"):
        module.get_function("vector_add")
    with pytest.raises(ValueError, match=r"no kernel named 'nope' in this module"):
        module.get_function("nope", signature="int")


def test_load_ptx_from_compile_to_ptx():
    module = load_ptx(compile_to_ptx(SOURCE))
    signature = "const float* a, const float* b, float* c, int n"
    add = module.get_function("vector_add", signature=signature)
    a, b, c = _inputs(1000)
    add(a, b, c, 1000, grid=_grid(1000), block=BLOCK)
    torch.testing.assert_close(c, _expected(a, b), rtol=0, atol=0)


def test_kernel_object_flow(tmp_path):
    path = tmp_path / "add.cubin"
    path.write_bytes(compile_to_cubin(SOURCE))
    kernel = Kernel()
    kernel.load_cubin(path)
    kernel.set_kernel("vector_add", signature=ADD_SIGNATURE)
    a, b, c = _inputs(4096)
    kernel.launch((a, b, c, 4096), grid=_grid(4096), block=BLOCK)
    kernel.synchronize()
    torch.testing.assert_close(c, _expected(a, b), rtol=0, atol=0)
    kernel.load_ptx(compile_to_ptx(SOURCE))
    with pytest.raises(RuntimeError, match="no kernel selected"):
        kernel.launch((a, b, c, 4096), grid=_grid(4096), block=BLOCK)


def test_every_scalar_type_by_value():
    kernel = compile_kernel(SOURCE, "scalars", grid=1, block=1)
    out = torch.full((12,), float("nan"), dtype=torch.float64, device="cuda")
    bits = torch.zeros(1, dtype=torch.int64, device="cuda")
    values = [True, -128, -32768, -(2**31), -(2**63), 255, 65535, 2**32 - 1]
    kernel(out, bits, *values, 2**64 - 1, 0.333, -1.5 * 2.0**100, 0.1, 1 / 3)
    expected = [
        *map(float, values),
        float(np.float16(0.333)),  # rounded to nearest, as __double2half does
        -1.5 * 2.0**100,  # exact in bfloat16
        float(np.float32(0.1)),
        1 / 3,
    ]
    assert out.cpu().tolist() == expected
    assert bits.item() == -1  # 2**64 - 1 as unsigned long long
    kernel(out, bits, np.bool_(False), np.int8(1), np.int16(2), np.int32(3), np.int64(4),
           np.uint8(5), np.uint16(6), np.uint32(7), np.uint64(8), np.float16(9),
           np.float32(10), np.float32(11), np.float64(12))  # fmt: skip
    assert out.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 9.0, 10.0, 11.0, 12.0]
    assert bits.item() == 8


def test_device_info_against_torch():
    for index in range(torch.cuda.device_count()):
        info = device_info(index)
        props = torch.cuda.get_device_properties(index)
        assert info["index"] == index and info["name"] == props.name
        assert info["compute_capability"] == f"{props.major}.{props.minor}"
        assert info["sm_count"] == props.multi_processor_count
        assert info["total_memory_bytes"] == props.total_memory
        pairs = {
            "warp_size": "warp_size",
            "max_threads_per_sm": "max_threads_per_multi_processor",
            "l2_cache_bytes": "L2_cache_size",
            "shared_memory_per_block": "shared_memory_per_block",
            "shared_memory_per_block_optin": "shared_memory_per_block_optin",
            "shared_memory_per_sm": "shared_memory_per_multiprocessor",
            "registers_per_sm": "regs_per_multiprocessor",
            "memory_bus_width_bits": "memory_bus_width",
            "memory_clock_khz": "memory_clock_rate",
        }
        for ours, theirs in pairs.items():
            if hasattr(props, theirs):
                assert info[ours] == getattr(props, theirs), ours
        assert info["max_threads_per_block"] == 1024
        assert info["shared_memory_per_block_optin"] >= info["shared_memory_per_block"]
        expected_gbps = 2 * info["memory_clock_khz"] * 1e3 * info["memory_bus_width_bits"] / 8e9
        assert info["memory_bandwidth_gbps"] == pytest.approx(expected_gbps, abs=0.1)
        if props.major >= 9:
            assert info["cluster_launch"] is True
            assert info["memory_bandwidth_gbps"] > 1000  # HBM
        from mllm_kernel.jit_utils.cuda_arch import resolve_cuda_archs

        assert info["jit_arch"] == ";".join(f"sm_{a.number}" for a in resolve_cuda_archs(index))
    with pytest.raises(ValueError, match=r"device 99 does not exist"):
        device_info(99)
    with pytest.raises(TypeError, match="device must be a GPU index"):
        device_info("cuda:0")


def test_show_env_lists_every_gpu():
    from mllm_kernel.cli import env_info, output

    info = env_info.collect()
    rows = {(s, f): v for s, f, v in output.env_rows(info)}
    for index in range(torch.cuda.device_count()):
        details = info["torch"]["gpus"][index]["details"]
        assert details == device_info(index)
        assert f"{details['sm_count']} SMs" in rows[("PyTorch", f"GPU {index} compute")]
        assert "GB/s" in rows[("PyTorch", f"GPU {index} memory")]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tensors_on_the_second_gpu(add, reverse):
    torch.cuda.set_device(0)
    a, b, c = _inputs(3000, "cuda:1")
    add(a, b, c, 3000, grid=_grid(3000))
    torch.testing.assert_close(c, _expected(a, b), rtol=0, atol=0)
    chunk = 100 * 1024 // 4  # the shared-memory opt-in is per device: cuda:1's own
    x = torch.randn(chunk, device="cuda:1")
    out = torch.empty_like(x)
    reverse(x, out, chunk, chunk, grid=1, shared_mem=chunk * 4)
    torch.testing.assert_close(out, x.flip(0), rtol=0, atol=0)
    host = np.full(3000, np.nan, np.float32)
    add(a, b, host, 3000, grid=_grid(3000))  # copied to and from cuda:1
    np.testing.assert_array_equal(host, c.cpu().numpy())
    with pytest.raises(
        ValueError,
        match=r"argument 'b' \(const float\*\): is on cuda:0 but argument 'a' \(const float\*\) "
        r"is on cuda:1",
    ):
        add(a, b.to("cuda:0"), c, 3000, grid=_grid(3000))
    assert torch.cuda.current_device() == 0


def test_every_bad_argument(add, count):
    a, b, c = _inputs(100)
    grid = _grid(100)
    cases = [
        (
            (a, b, c),
            TypeError,
            r"kernel 'vector_add' takes 4 arguments \(argument 'a' \(const "
            r"float\*\), argument 'b' \(const float\*\), argument 'c' "
            r"\(float\*\), argument 'n' \(int\)\), got 3",
        ),
        ((a, b, c, 100, 1), TypeError, "takes 4 arguments"),
        ((a, b, c, 100.0), TypeError, r"argument 'n' \(int\): expected an int, got float"),
        ((a, b, c, "100"), TypeError, r"argument 'n' \(int\): expected an int, got str"),
        ((a, b, c, 2**31), OverflowError, r"argument 'n' \(int\): 2147483648 does not fit"),
        (
            (a.cpu(), b, c, 100),
            ValueError,
            r"argument 'a' \(const float\*\): expected a CUDA "
            r"tensor, got one on cpu",
        ),
        (
            (a.double(), b, c, 100),
            TypeError,
            r"argument 'a' \(const float\*\): expected a "
            r"float32 tensor, got a float64 one",
        ),
        (
            (a, b, c.data_ptr(), 100),
            TypeError,
            r"argument 'c' \(float\*\): expected a CUDA "
            r"tensor .* got int",
        ),
        ((a, b, [1.0], 100), TypeError, r"argument 'c' \(float\*\): expected a CUDA tensor"),
    ]
    for args, error, message in cases:
        c.fill_(float("nan"))
        with pytest.raises(error, match=message):
            add(*args, grid=grid)
        assert torch.isnan(c).all()  # nothing launched
    hits = torch.zeros(1, dtype=torch.int32, device="cuda")
    configs = [
        ({"grid": 0}, ValueError, r"grid sizes must be between 1 and 2\^32-1, got 0"),
        ({"grid": (1, 1, 1, 1)}, ValueError, r"grid must have 1 to 3 sizes \(x, y, z\), got 4"),
        ({"grid": ()}, ValueError, r"grid must have 1 to 3 sizes \(x, y, z\), got 0"),
        ({"grid": (2, 1.5)}, TypeError, r"grid must be an int or a tuple of 1 to 3 ints"),
        ({"block": "x"}, TypeError, r"block must be an int or a tuple of 1 to 3 ints, got str"),
        ({"shared_mem": -1}, ValueError, r"shared_mem must be between 0 and 2\^31-1 bytes"),
        ({"shared_mem": 1.5}, TypeError, r"shared_mem must be an int \(bytes\), got float"),
        ({"stream": "default"}, TypeError, r"stream must be a torch\.cuda\.Stream"),
        (
            {"block": 2048},
            RuntimeError,
            r"launching kernel 'count_threads' on cuda:\d+ failed: cudaErrorInvalid\w+ .* with "
            r"grid=\(1, 1, 1\), block=\(2048, 1, 1\), shared_mem=0; the block has 2048 threads, "
            r"the device allows 1024",
        ),
        (
            {"block": (32, 32, 2)},
            RuntimeError,
            r"block=\(32, 32, 2\).*the block has 2048 threads",
        ),
    ]
    for config, error, message in configs:
        with pytest.raises(error, match=message):
            count(hits, **config)
    torch.cuda.synchronize()  # the failed launches left no sticky error
    assert hits.item() == 0
    count(hits)
    assert hits.item() == 32
    # A Python bool and a NumPy int are ints; struct-packed bytes are not.
    with pytest.raises(TypeError, match=r"argument 'n' \(int\): expected an int, got bytes"):
        add(a, b, c, struct.pack("<i", 100), grid=grid)
