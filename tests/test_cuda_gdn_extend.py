"""gdn_extend (issue 33): the gated delta net over packed variable-length sequences, a chunk
of 64 tokens at a time, against a float64 token-by-token reference
(tests/gdn_reference.py) and against gdn_decode run token by token: every head dim, GVA
ratio, input and state dtype, chunk tails, empty and one-token sequences, the pool's
padding and untouched rows, precomputed gates, CUDA graphs, torch.compile, and every bad
input named. Every GPU test runs on each path (the fused kernel, the split path of long
sequences, and the split path with its walks cut into segments of 2 chunks; the ``path``
fixture), beside long sequences and the split path's workspace. The CPU part needs no
GPU: the declaration (schema, fake), the refusals decided before any kernel, the
original's module path, the module's build (nvcc), the split path's and the segments'
algebra in float64 and the choice of path and segments."""

from __future__ import annotations

import importlib
import inspect
import math

import pytest
import torch
from gdn_reference import gdn_extend_reference, gdn_reference, softplus, split_chunk
from test_cuda_gdn import UNIT, assert_near, bits

from mllm_kernel.cuda.jit.gdn_decode import gdn_decode
from mllm_kernel.cuda.jit.gdn_extend import _GDN_EXTEND, gdn_extend
from mllm_kernel.jit_utils import cuda_arch_override, env, loader

OPS = torch.ops.mllm_kernel
EXTEND = importlib.import_module("mllm_kernel.cuda.jit.gdn_extend")
PATHS = ("fused", "split", "segments")
HEAD_DIMS = (64, 128, 256)
# Lengths that cross every chunk boundary: empty, one token, a chunk less one, one chunk,
# one more, several chunks with a tail.
LENGTHS = (5, 0, 1, 63, 64, 65, 200)
# The chunked form's error against the float64 recurrence, as a fraction of the largest
# value: fp32 sums in another order over a chunk and products of hi / lo bf16 operands
# (2^-17 each). A product on plain bf16 operands would be off by ~2^-9.
SPREAD = 5e-5


def pytest_generate_tests(metafunc):
    """Every GPU test runs on each of gdn_extend's paths (the ``path`` fixture), but those
    that choose their own (the ``split_path`` and ``chosen_path`` fixtures)."""
    cuda = metafunc.definition.get_closest_marker("cuda") is not None
    if cuda and not {"split_path", "chosen_path"} & set(metafunc.fixturenames):
        metafunc.parametrize("path", PATHS, indirect=True)


@pytest.fixture(autouse=True)
def path(request, monkeypatch):
    """The path every gdn_extend call of the test takes (GPU tests: each of PATHS; others:
    the module's own choice)."""
    chosen = getattr(request, "param", None)
    monkeypatch.setattr(EXTEND, "_force_path", chosen)
    return chosen


@pytest.fixture
def split_path(monkeypatch):
    """Every gdn_extend call of the test takes the split path."""
    monkeypatch.setattr(EXTEND, "_force_path", "split")


@pytest.fixture
def chosen_path(monkeypatch):
    """Every gdn_extend call of the test takes the path use_split_path chooses; the list
    it returns gets the size of each split path workspace allocated."""
    sizes = []
    allocate = EXTEND._workspace

    def recorded(num_bytes, device):
        sizes.append(num_bytes)
        return allocate(num_bytes, device)

    monkeypatch.setattr(EXTEND, "_force_path", None)
    monkeypatch.setattr(EXTEND, "_workspace", recorded)
    return sizes


def make_inputs(
    lengths=LENGTHS,
    heads=2,
    value_heads=4,
    dim_k=128,
    dim_v=128,
    dtype=torch.bfloat16,
    state_dtype=torch.float32,
    pool_size=None,
    index_dtype=torch.int64,
    seqlens_dtype=torch.int32,
    device="cuda",
):
    """gdn_extend's positional arguments as a dict, random: sequences of ``lengths``
    packed in order; distinct pool rows, in random order."""
    total, count = sum(lengths), len(lengths)
    pool_size = 2 * count + 3 if pool_size is None else pool_size

    def randn(*shape, dt=dtype, scale=1.0):
        return (torch.randn(shape, device=device) * scale).to(dt)

    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return {
        "q": randn(total, heads, dim_k),
        "k": randn(total, heads, dim_k),
        "v": randn(total, value_heads, dim_v),
        # decays e^g of about 0.8 to 0.995 a token: a chunk's state still matters 3 later
        "a": randn(total, value_heads, scale=0.5),
        "b": randn(total, value_heads),
        "A_log": torch.empty(value_heads, device=device).uniform_(0.5, 4).log(),
        "dt_bias": randn(value_heads, dt=torch.float32, scale=0.5) - 3,
        "state_pool": randn(pool_size, value_heads, dim_v, dim_k, dt=state_dtype, scale=0.3),
        "cache_indices": torch.randperm(pool_size, device=device)[:count].to(index_dtype),
        "cu_seqlens": torch.tensor(offsets, device=device, dtype=seqlens_dtype),
    }


def reference(args, **options):
    """gdn_extend_reference of a make_inputs dict (plus gdn_extend's keyword options)."""
    args = {**args, **options}
    args.pop("out", None)
    return gdn_extend_reference(
        args.pop("q"), args.pop("k"), args.pop("v"), args.pop("state_pool"),
        args.pop("cache_indices"), args.pop("cu_seqlens"), **args,
    )  # fmt: skip


def run_and_check(args, dtype, state_dtype, **options):
    """Runs gdn_extend on ``args`` (the pool updated in place, the output poisoned) and
    checks the output and the pool against the reference."""
    o_ref, pool_ref = reference(args, **options)
    out = torch.full_like(args["v"], float("nan"))
    o = gdn_extend(**args, **options, out=out)
    assert o is out
    assert_near(o, o_ref, UNIT[dtype], "o", SPREAD)
    assert_near(args["state_pool"], pool_ref, UNIT[state_dtype], "state_pool", SPREAD)
    return o


def extend_module_call(module, args, errors=None):
    """The module's export with make_inputs' ``args`` as the Python kernel passes them."""
    out = torch.empty_like(args["v"])
    return module.gdn_extend(
        out, args["q"], args["k"], args["v"], args["a"], args["b"], args["A_log"],
        args["dt_bias"], None, None, args["state_pool"], args["cache_indices"],
        args["cu_seqlens"], None, True, errors,
    )  # fmt: skip


# --------------------------------------------------------------------------- no GPU
def test_schema_marks_the_pool_written():
    schema = OPS.gdn_extend.default._schema
    written = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
    assert written == ["state_pool"]
    assert [a.name for a in schema.arguments] == [
        "q", "k", "v", "a", "b", "A_log", "dt_bias", "state_pool", "cache_indices",
        "cu_seqlens", "g", "beta", "scale", "use_qk_l2norm",
    ]  # fmt: skip
    keywords = [a.name for a in schema.arguments if a.kwarg_only]
    assert keywords == ["g", "beta", "scale", "use_qk_l2norm"]
    out = OPS.gdn_extend.out._schema
    written = [a.name for a in out.arguments if a.alias_info and a.alias_info.is_write]
    assert written == ["state_pool", "out"]


def test_fake_is_shaped_and_typed_like_v():
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = make_inputs(device="cpu", dtype=torch.float16)
    with FakeTensorMode() as mode:
        fake = {name: mode.from_tensor(value) for name, value in args.items()}
        o = OPS.gdn_extend(**fake)
    assert (o.shape, o.dtype) == (args["v"].shape, torch.float16)


def test_the_originals_module_path_and_positional_arguments():
    from mllm_kernel.cuda.jit.gdn_extend_chunkwise import gdn_extend_chunkwise, precompile

    assert gdn_extend_chunkwise is gdn_extend
    assert callable(precompile)
    positional = [
        name
        for name, p in inspect.signature(gdn_extend_chunkwise).parameters.items()
        if p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    assert positional == [
        "q", "k", "v", "a", "b", "A_log", "dt_bias", "state_pool", "cache_indices", "cu_seqlens",
    ]  # fmt: skip


@pytest.fixture
def no_build(monkeypatch):
    def refuse(spec):
        raise AssertionError(f"{spec.describe()} was built or loaded for a bad input")

    monkeypatch.setattr(loader, "load_spec", refuse)


def test_cpu_tensors_are_refused_before_any_build(no_build):
    with pytest.raises(ValueError, match=r"^argument 'q': expected a tensor on cuda but got one"):
        gdn_extend(**make_inputs(device="cpu"))


def test_a_required_grad_is_refused_and_nothing_is_written(no_build):
    args = make_inputs(device="cpu")
    args["q"] = args["q"].float().requires_grad_()
    pool = args["state_pool"].clone()
    with pytest.raises(RuntimeError, match=r"mllm_kernel.gdn_extend has no backward"):
        gdn_extend(**args)
    assert torch.equal(args["state_pool"], pool)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"k": (1.0, 2.0)}, r"^argument 'k': expected a torch.Tensor"),
        ({"cu_seqlens": [0, 5]}, r"^argument 'cu_seqlens': expected a torch.Tensor"),
        ({"scale": "0.1"}, r"^argument 'scale': expected a number but got str"),
        ({"use_qk_l2norm": 1}, r"^argument 'use_qk_l2norm': expected a bool but got int"),
    ],
    ids=["k", "cu_seqlens", "scale", "use_qk_l2norm"],
)
def test_arguments_of_the_wrong_kind_are_type_errors(change, message, no_build):
    with pytest.raises(TypeError, match=message):
        gdn_extend(**{**make_inputs(device="cpu"), **change})


@pytest.mark.nvcc
def test_module_builds_for_sm80_and_sm90a_and_takes_the_python_arguments():
    """The one build of every variant (input dtype x state dtype x head_k_dim), for both
    archs; its export takes what the Python kernel passes (None for absent tensors and
    scale, a bool): with CPU tensors the C++ checks run up to the device check of q."""
    with cuda_arch_override("9.0a,8.0"):
        module = _GDN_EXTEND.load()
    assert module.implements_function("gdn_extend")
    with pytest.raises(ValueError, match=r"^argument 'q': expected a tensor on cuda"):
        extend_module_call(module, make_inputs(device="cpu"))


def test_the_split_algebra_equals_the_recurrence_in_float64():
    """split_chunk (the algebra kernels A and B implement), chunk after chunk of 64 tokens
    with a tail, gives the token-by-token recurrence's outputs and final state."""
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(shape, dtype=torch.float64, generator=generator)

    tokens, K, V = 150, 32, 16
    q, k, v = randn(1, tokens, 1, K), randn(1, tokens, 1, K), randn(1, tokens, 1, V)
    g = -torch.rand(1, tokens, 1, dtype=torch.float64, generator=generator) * 0.2
    beta = torch.rand(1, tokens, 1, dtype=torch.float64, generator=generator)
    pool = randn(1, 1, V, K)
    o_ref, pool_ref, _ = gdn_reference(q, k, v, pool, torch.tensor([0]), g=g, beta=beta)

    def unit(x):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    q, k = unit(q[0, :, 0]) * K**-0.5, unit(k[0, :, 0])
    state, outputs = pool[0, 0], []
    for c0 in range(0, tokens, 64):
        part = slice(c0, c0 + 64)
        o, state = split_chunk(state, q[part], k[part], v[0, part, 0], g[0, part, 0],
                               beta[0, part, 0])  # fmt: skip
        outputs.append(o)
    torch.testing.assert_close(torch.cat(outputs), o_ref[0, :, 0], rtol=0, atol=1e-12)
    torch.testing.assert_close(state, pool_ref[0, 0], rtol=0, atol=1e-12)


def test_segments_combine_to_the_recurrence_in_float64():
    """The segmented walk's algebra: each segment's end from zeros (H) and its transition
    (the identity's rows walked with v = 0: M) give the state at every segment's end as
    Z_i = Z_{i-1} M_{i-1} + H_{i-1}, and each segment's outputs from that start are the
    whole walk's."""
    generator = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.randn(shape, dtype=torch.float64, generator=generator)

    tokens, K, V, length = 150, 32, 16, 40  # segments of 40 tokens, the last 30
    q, k, v = randn(1, tokens, 1, K), randn(1, tokens, 1, K), randn(1, tokens, 1, V)
    g = -torch.rand(1, tokens, 1, dtype=torch.float64, generator=generator) * 0.2
    beta = torch.rand(1, tokens, 1, dtype=torch.float64, generator=generator)
    pool = randn(1, 1, V, K)
    o_ref, pool_ref, _ = gdn_reference(q, k, v, pool, torch.tensor([0]), g=g, beta=beta)
    start, outputs = pool, []
    for t0 in range(0, tokens, length):
        part = slice(t0, t0 + length)
        inputs = dict(g=g[:, part], beta=beta[:, part])

        def walk(values, state, part=part, inputs=inputs):
            return gdn_reference(q[:, part], k[:, part], values, state, torch.tensor([0]),
                                 **inputs)  # fmt: skip

        o, _, _ = walk(v[:, part], start)
        outputs.append(o)
        _, end_from_zeros, _ = walk(v[:, part], torch.zeros_like(pool))
        zero_values = torch.zeros(1, o.shape[1], 1, K, dtype=torch.float64)
        _, transition, _ = walk(zero_values, torch.eye(K, dtype=torch.float64)[None, None])
        start = start @ transition + end_from_zeros
    torch.testing.assert_close(torch.cat(outputs, 1), o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(start, pool_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("tokens", "sequences", "value_heads", "dim_k", "dim_v", "chunks"),
    [
        # the TP8 slice: 32 walks, 4 segments (128 output walks, 192 end walks: two an SM)
        (65536, 1, 8, 128, 128, 256),
        (65536, 1, 32, 128, 128, 0),  # full heads: 128 walks on 132 SMs
        (65536, 2, 8, 128, 128, 256),  # 64 walks, 2 segments a sequence
        (65536, 3, 8, 128, 128, 0),  # 96 walks: more than half the SMs
        (2048, 1, 8, 128, 64, 8),  # 16 walks; 6 segments wanted, 8 chunks the least: 4
        (65536, 1, 2, 64, 128, 64),  # 8 walks, 16 segments (end walks: 12 each)
        (512, 1, 8, 128, 128, 0),  # 8 chunks: one shortest segment holds them all
        (0, 0, 8, 128, 128, 0),
        (65536, 1, 0, 128, 128, 0),  # no value heads: nothing to walk
    ],
)
def test_segments_are_for_walks_that_leave_most_sms_idle(
    tokens, sequences, value_heads, dim_k, dim_v, chunks
):
    found = EXTEND.segment_chunks(tokens, sequences, value_heads, dim_k, dim_v, 132)
    assert found == chunks


@pytest.mark.parametrize(
    ("tokens", "sequences", "value_heads", "dim_k", "split"),
    [
        (65536, 1, 32, 128, True),  # one long sequence: 128 fused CTAs on 132 SMs
        (65536, 1, 8, 128, True),  # the TP8 slice
        (16384, 4, 32, 128, True),
        (1024, 1, 32, 64, True),  # 16 chunks
        (1000, 1, 32, 128, False),  # 15.6 chunks: short
        (4096, 64, 32, 128, False),  # 64 tokens a sequence
        (1 << 20, 256, 32, 128, False),  # long, but 32768 fused CTAs fill the GPU
        (65536, 1, 32, 256, False),  # head_k_dim 256
        (0, 0, 32, 128, False),
    ],
)
def test_the_split_path_is_for_few_long_sequences(tokens, sequences, value_heads, dim_k, split):
    assert EXTEND.use_split_path(tokens, sequences, value_heads, dim_k, 128, 132) is split


@pytest.mark.nvcc
def test_the_split_paths_workspace_size_and_export():
    """gdn_extend_workspace_bytes: per chunk block (num_sequences + ceil(tokens / 64) of
    them) and value head, T' and P as bf16 hi / lo (4 x their 10 blocks of 16 x 16 on and
    below the diagonal x 2 bytes), 4 x 64 fp32 scales and v's 64 rows; per block and key
    head, q's and k's 64 rows as bf16 (hi and lo for float16 inputs); with segments of n
    chunks, per segment block (num_sequences + ceil(chunks / n)) and value head, a state
    and a transition in fp32. The split export checks its arguments as gdn_extend does."""
    with cuda_arch_override("9.0a,8.0"):
        module = _GDN_EXTEND.load()

    def expected(tokens, sequences, heads, value_heads, dim_k, dim_v, fp16, segment_chunks):
        chunks = -(-tokens // 64)
        blocks = sequences + chunks
        per_value_head = 4 * 10 * 16 * 16 * 2 + 4 * 64 * 4 + 64 * dim_v * 2
        per_key_head = (4 if fp16 else 2) * 64 * dim_k * 2
        bytes = blocks * (value_heads * per_value_head + heads * per_key_head)
        if segment_chunks:
            segment_blocks = sequences + -(-chunks // segment_chunks)
            bytes += segment_blocks * value_heads * (dim_v + dim_k) * dim_k * 4
        return bytes

    cases = [
        (130, 2, 2, 4, 128, 64, False, 0),
        (130, 2, 2, 4, 128, 64, False, 1),
        (1, 1, 1, 1, 64, 256, True, 0),
        (1, 1, 1, 1, 64, 256, True, 3),
        (0, 0, 16, 32, 128, 128, False, 2),
        (65536, 1, 16, 32, 128, 128, False, 0),  # past 2^31 bytes
        (65536, 1, 2, 8, 128, 128, False, 256),
    ]
    for case in cases:
        assert module.gdn_extend_workspace_bytes(*case) == expected(*case), case
    with pytest.raises(ValueError, match=r"^argument 'segment_chunks': expected >= 0, got -1"):
        module.gdn_extend_workspace_bytes(130, 2, 2, 4, 128, 64, False, -1)
    args = make_inputs(device="cpu")
    with pytest.raises(ValueError, match=r"^argument 'q': expected a tensor on cuda"):
        module.gdn_extend_split(
            torch.empty_like(args["v"]), args["q"], args["k"], args["v"], args["a"], args["b"],
            args["A_log"], args["dt_bias"], None, None, args["state_pool"],
            args["cache_indices"], args["cu_seqlens"], None, True, None,
            torch.empty(16, dtype=torch.uint8), 0,
        )  # fmt: skip


# --------------------------------------------------------------------------- on a GPU
@pytest.mark.cuda
@pytest.mark.parametrize("dim_k", HEAD_DIMS)
@pytest.mark.parametrize("dim_v", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_matches_the_float64_reference(dim_k, dim_v, dtype, state_dtype):
    args = make_inputs(dim_k=dim_k, dim_v=dim_v, dtype=dtype, state_dtype=state_dtype)
    run_and_check(args, dtype, state_dtype)


@pytest.mark.cuda
@pytest.mark.parametrize(("heads", "ratio"), [(4, 1), (2, 2), (1, 4), (3, 4)])
def test_value_heads_share_key_heads(heads, ratio):
    args = make_inputs(lengths=(70, 3, 0, 130), heads=heads, value_heads=heads * ratio)
    run_and_check(args, torch.bfloat16, torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_long_sequence_carries_the_state_through_many_chunks(dtype):
    """1000 tokens (16 chunks) beside a short one; heads of slow and of fast decay."""
    args = make_inputs(lengths=(1000, 7), value_heads=4, dtype=dtype)
    args["A_log"] = torch.tensor([-3.0, -1.0, 0.5, 1.5], device="cuda")
    run_and_check(args, dtype, torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_extend_equals_decode_token_by_token(state_dtype):
    """Each sequence through gdn_decode (all its tokens in one call: the state carried in
    fp32 token by token) gives extend's outputs and final states, within fp32 rounding
    of the largest value and the two results' own roundings (each to its dtype: one unit
    of it apart at most)."""
    args = make_inputs(lengths=(64, 1, 0, 130, 65), value_heads=8, state_dtype=state_dtype)
    decoded = {name: value.clone() for name, value in args.items()}
    o = gdn_extend(**args)
    bounds = args["cu_seqlens"].tolist()
    for n in range(len(bounds) - 1):
        start, end = bounds[n], bounds[n + 1]
        if start == end:
            continue
        one = {name: decoded[name][start:end][None] for name in ("q", "k", "v", "a", "b")}
        o_n = gdn_decode(
            **one, A_log=decoded["A_log"], dt_bias=decoded["dt_bias"],
            state_pool=decoded["state_pool"], cache_indices=decoded["cache_indices"][n : n + 1],
        )  # fmt: skip
        assert_near(o[start:end], o_n[0].double(), 2 * UNIT[torch.bfloat16], f"o of {n}", SPREAD)
    index = args["cache_indices"]
    assert_near(
        args["state_pool"][index], decoded["state_pool"][index].double(), 2 * UNIT[state_dtype],
        "final states", SPREAD,
    )  # fmt: skip


@pytest.mark.cuda
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("seqlens_dtype", [torch.int32, torch.int64])
def test_padding_starts_from_zero_and_other_rows_stay_bit_identical(index_dtype, seqlens_dtype):
    args = make_inputs(
        lengths=(9, 70, 1, 0, 64), pool_size=20, index_dtype=index_dtype,
        seqlens_dtype=seqlens_dtype,
    )  # fmt: skip
    args["cache_indices"][[1, 3]] = -1
    before = args["state_pool"].clone()
    o_ref, pool_ref = reference(args)
    zero_pool = {**args, "state_pool": torch.zeros_like(before[:1]),
                 "cache_indices": torch.zeros_like(args["cache_indices"])}  # fmt: skip
    o_zero, _ = reference(zero_pool)
    o = gdn_extend(**args)
    assert_near(o, o_ref, UNIT[torch.bfloat16], "o", SPREAD)
    assert_near(o[9:79], o_zero[9:79], UNIT[torch.bfloat16], "o from zero state", SPREAD)
    used = args["cache_indices"][args["cache_indices"] >= 0].long()
    untouched = torch.ones(20, dtype=torch.bool, device="cuda")
    untouched[used] = False
    assert torch.equal(bits(args["state_pool"][untouched]), bits(before[untouched]))
    assert_near(args["state_pool"], pool_ref, UNIT[torch.float32], "state_pool", SPREAD)


@pytest.mark.cuda
def test_an_empty_sequence_leaves_its_state_bit_identical():
    args = make_inputs(lengths=(3, 0, 2), state_dtype=torch.bfloat16)
    before = args["state_pool"].clone()
    gdn_extend(**args)
    empty, written = args["cache_indices"][1], args["cache_indices"][0]
    assert torch.equal(bits(args["state_pool"][empty]), bits(before[empty]))
    assert not torch.equal(args["state_pool"][written], before[written])


@pytest.mark.cuda
def test_the_same_call_gives_the_same_bits():
    args = make_inputs(lengths=(200, 64, 3), value_heads=8)
    again = {name: value.clone() for name, value in args.items()}
    first, second = gdn_extend(**args), gdn_extend(**again)
    assert torch.equal(bits(first), bits(second))
    assert torch.equal(bits(args["state_pool"]), bits(again["state_pool"]))


@pytest.fixture
def bounds_flag(monkeypatch):
    """Sets MLLM_KERNEL_CHECK_BOUNDS as a new process would read it."""

    def set_flag(value):
        monkeypatch.setenv("MLLM_KERNEL_CHECK_BOUNDS", value)
        env.check_bounds.cache_clear()

    yield set_flag
    monkeypatch.undo()
    env.check_bounds.cache_clear()


@pytest.mark.cuda
def test_an_index_past_the_pool_touches_nothing(bounds_flag):
    args = make_inputs(lengths=(4, 70, 5, 2), pool_size=6)
    args["cache_indices"][1] = 6
    before = args["state_pool"].clone()
    o = gdn_extend(**args)
    assert o[4:74].isnan().all() and not o[:4].isnan().any() and not o[74:].isnan().any()
    others = torch.ones(6, dtype=torch.bool, device="cuda")
    others[args["cache_indices"][[0, 2, 3]]] = False
    assert torch.equal(bits(args["state_pool"][others]), bits(before[others]))
    bounds_flag("1")
    with pytest.raises(IndexError, match=r"1 of argument 'cache_indices' are >= the pool's 6"):
        gdn_extend(**args)


@pytest.mark.cuda
def test_a_sequence_outside_the_tokens_is_skipped_and_counted(bounds_flag):
    args = make_inputs(lengths=(4, 6, 5))
    args["cu_seqlens"][2] = 40  # sequence 1 ends, and 2 starts, past the 15 tokens
    before = args["state_pool"].clone()
    o_ref, _ = reference({**args, "cu_seqlens": args["cu_seqlens"][:2],
                          "cache_indices": args["cache_indices"][:1]})  # fmt: skip
    out = torch.full_like(args["v"], float("nan"))
    gdn_extend(**args, out=out)
    assert_near(out[:4], o_ref[:4], UNIT[torch.bfloat16], "o", SPREAD)
    assert out[4:].isnan().all()  # not written
    skipped = args["cache_indices"][1:]
    assert torch.equal(bits(args["state_pool"][skipped]), bits(before[skipped]))
    bounds_flag("1")
    with pytest.raises(IndexError, match=r"2 sequences of argument 'cu_seqlens' are not within"):
        gdn_extend(**args)


@pytest.mark.cuda
def test_poisoned_out_is_written_everywhere_and_returned():
    args = make_inputs(value_heads=8, dim_v=64)
    run_and_check(args, torch.bfloat16, torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "options",
    [
        {"use_qk_l2norm": False, "scale": 0.05},
        {"scale": -0.3},
        {"precomputed": ("g", "beta")},
        {"precomputed": ("g",)},
        {"precomputed": ("beta",)},
    ],
    ids=["no-l2norm", "scale", "g-beta", "g-with-b", "beta-with-a"],
)
def test_keyword_options(options):
    """The options against the reference given the same values: precomputed g (fp32) and
    beta (bf16) are what the raw gates give, rounded."""
    options = dict(options)
    args = make_inputs(lengths=(70, 1, 20))
    if not options.get("use_qk_l2norm", True):  # raw q, k: keep q.k and |k| moderate
        args["q"] = (args["q"].float() * 0.1).bfloat16()
        args["k"] = (args["k"].float() * 0.1).bfloat16()
    for name in options.pop("precomputed", ()):
        if name == "g":
            a, A_log, dt_bias = (args.pop(n).double() for n in ("a", "A_log", "dt_bias"))
            options["g"] = (-A_log.exp() * softplus(a + dt_bias)).float()
            args.update(a=None, A_log=None, dt_bias=None)
        else:
            options["beta"] = torch.sigmoid(args.pop("b").double()).to(torch.bfloat16)
            args["b"] = None
    run_and_check(args, torch.bfloat16, torch.float32, **options)


@pytest.mark.cuda
def test_gate_extremes_take_softplus_threshold():
    args = make_inputs(lengths=(40, 40, 40, 40), value_heads=4, dtype=torch.float16)
    args["a"][:40] = 30.0  # softplus = a: decay ~ e^-(A * 30), about 0
    args["a"][40:80] = -30.0  # softplus ~ e^-30: decay ~ 1
    args["b"][80:120] = 30.0  # beta = 1
    args["b"][120:] = -30.0  # beta ~ 0: the state only decays
    run_and_check(args, torch.float16, torch.float32)


@pytest.mark.cuda
def test_a_decay_of_zero_resets_the_state():
    """g = -inf (a decay of 0: the state reset at that token) inside a chunk, at a chunk's
    first token and at a sequence's last: the recurrence's outputs and states, not the
    NaN of -inf - -inf in a chunk's running sums."""
    args = make_inputs(lengths=(150, 70))
    a, A_log, dt_bias = (args.pop(n).double() for n in ("a", "A_log", "dt_bias"))
    g = (-A_log.exp() * softplus(a + dt_bias)).float()
    g[[5, 64, 100, 149, 190]] = float("-inf")
    args.update(a=None, A_log=None, dt_bias=None)
    run_and_check(args, torch.bfloat16, torch.float32, g=g)


@pytest.mark.cuda
@pytest.mark.parametrize("misaligned", [False, True])
def test_strided_views_of_a_fused_projection(misaligned):
    """q, k, v as column blocks of one [T, ...] projection (non-contiguous), gates as
    strided columns, the pool a slice of a bigger one; ``misaligned`` starts q and k one
    element off a 16-byte vector (the kernel's scalar path)."""
    lengths, H, HV, K, V = (3, 66, 10), 2, 4, 128, 64
    T = sum(lengths)
    shift = 1 if misaligned else 0
    qkv = torch.randn(T, shift + 2 * H * K + HV * V, device="cuda").bfloat16()
    args = make_inputs(lengths=lengths, heads=H, value_heads=HV, dim_k=K, dim_v=V)
    args["q"] = qkv[:, shift : shift + H * K].unflatten(-1, (H, K))
    args["k"] = qkv[:, shift + H * K : shift + 2 * H * K].unflatten(-1, (H, K))
    args["v"] = qkv[:, shift + 2 * H * K :].unflatten(-1, (HV, V))
    ab = torch.randn(T, 2 * HV, device="cuda")
    args["a"], args["b"] = ab[:, 0::2], ab[:, 1::2]
    big = torch.randn(2, 11, HV, V, K, device="cuda")
    other = big[0].clone()
    args["state_pool"] = big[1]
    args["cache_indices"] = torch.tensor([3, 0, 7], device="cuda")
    run_and_check(args, torch.bfloat16, torch.float32)
    assert torch.equal(big[0], other)


@pytest.mark.cuda
def test_no_sequences_and_no_tokens():
    for args in (make_inputs(lengths=()), make_inputs(lengths=(0, 0, 0))):
        before = args["state_pool"].clone()
        o = gdn_extend(**args)
        assert o.shape == args["v"].shape and o.numel() == 0
        assert torch.equal(args["state_pool"], before)


@pytest.mark.cuda
def test_more_sequences_than_a_grid_dim_holds():
    """70000 sequences of 0 to 2 tokens, one 64 x 64 head: 140000 CTAs, past 65535."""
    lengths = [n % 3 for n in range(70_000)]
    args = make_inputs(
        lengths=lengths, heads=1, value_heads=1, dim_k=64, dim_v=64,
        state_dtype=torch.bfloat16, pool_size=70_000, index_dtype=torch.int32,
    )  # fmt: skip
    run_and_check(args, torch.bfloat16, torch.bfloat16)


@pytest.mark.cuda
def test_cuda_graph_replays_with_new_inputs():
    args = make_inputs(lengths=(100, 1, 30), value_heads=8)
    out = torch.empty_like(args["v"])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (build, load) outside the capture
        gdn_extend(**args, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gdn_extend(**args, out=out)
    fresh = make_inputs(lengths=(100, 1, 30), value_heads=8)
    fresh["cache_indices"] = args["cache_indices"]
    for name in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state_pool"):
        args[name].copy_(fresh[name])
    o_ref, pool_ref = reference(fresh)
    graph.replay()
    assert_near(out, o_ref, UNIT[torch.bfloat16], "o", SPREAD)
    assert_near(args["state_pool"], pool_ref, UNIT[torch.float32], "state_pool", SPREAD)


@pytest.mark.cuda
def test_torch_compile_keeps_the_pool_update():
    args = make_inputs(lengths=(70, 2))
    eager_pool = args["state_pool"].clone()

    def step(q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices, cu_seqlens):
        return gdn_extend(q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices, cu_seqlens) * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    expected = step(**{**args, "state_pool": eager_pool})
    got = compiled(**args)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(args["state_pool"], eager_pool, rtol=0, atol=0)


@pytest.mark.cuda
def test_the_originals_call_and_precompile():
    """The original mllm-kernel's documented call and shapes: bf16 q/k/v/a/b, fp32 A_log,
    dt_bias and pool, int64 indices and cu_seqlens, Qwen3-Next's heads."""
    from mllm_kernel.cuda.jit.gdn_extend_chunkwise import gdn_extend_chunkwise, precompile

    assert precompile() is True
    lengths, H, HV, K, V = (37, 130), 16, 32, 128, 128
    T = sum(lengths)
    x = lambda *shape: torch.randn(shape, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, k, v, a, b = x(T, H, K), x(T, H, K), x(T, HV, V), x(T, HV), x(T, HV)
    A_log = torch.randn(HV, device="cuda")
    dt_bias = torch.randn(HV, device="cuda")
    state_pool = torch.randn(5, HV, V, K, device="cuda") * 0.1
    cache_indices = torch.tensor([4, 1], device="cuda")
    cu_seqlens = torch.tensor([0, 37, T], device="cuda")
    o_ref, pool_ref = gdn_extend_reference(
        q, k, v, state_pool, cache_indices, cu_seqlens, a=a, b=b, A_log=A_log, dt_bias=dt_bias
    )
    output = gdn_extend_chunkwise(
        q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices, cu_seqlens
    )
    assert output.shape == (T, HV, V) and output.dtype == torch.bfloat16
    assert_near(output, o_ref, UNIT[torch.bfloat16], "output", SPREAD)
    assert_near(state_pool, pool_ref, UNIT[torch.float32], "state_pool", SPREAD)


@pytest.mark.cuda
@pytest.mark.parametrize("lengths", [(2500,), (1300, 3, 0, 700, 64, 129, 1)], ids=["one", "mixed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_sequences(lengths, dtype):
    """Tens of chunks: the split path's stages refilled many times over, and its blocks
    placed per sequence beside short and empty ones."""
    args = make_inputs(lengths=lengths, value_heads=4, dtype=dtype)
    run_and_check(args, dtype, torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("forced", ["split", "segments"])
def test_the_split_path_reads_nothing_it_did_not_write(forced, split_path, monkeypatch):
    """The workspace all ones bits (NaN as bf16 and as fp32) before each call: an output
    or state that read a byte the call did not write would be NaN. Two calls, the second
    with fewer chunks, as the allocator would hand out the first's memory again; walks in
    one run and in segments."""
    monkeypatch.setattr(EXTEND, "_force_path", forced)
    sizes = []

    def poisoned(num_bytes, device):
        sizes.append(num_bytes)
        return torch.full((num_bytes,), 0xFF, dtype=torch.uint8, device=device)

    monkeypatch.setattr(EXTEND, "_workspace", poisoned)
    for lengths, dtype, dim_k in [((130, 0, 64, 1, 65), torch.bfloat16, 128),
                                  ((70, 3), torch.float16, 64)]:  # fmt: skip
        args = make_inputs(lengths=lengths, value_heads=4, dtype=dtype, dim_k=dim_k, dim_v=64)
        run_and_check(args, dtype, torch.float32)
    assert len(sizes) == 2 and sizes[1] < sizes[0]


@pytest.mark.cuda
def test_the_choice_sends_few_long_sequences_down_the_split_path(chosen_path):
    """Without a forced path: one long sequence takes the split path (a workspace is
    allocated), a batch of short ones the fused kernel; both right."""
    long_call = make_inputs(lengths=(1100,), value_heads=4)
    run_and_check(long_call, torch.bfloat16, torch.float32)
    assert len(chosen_path) == 1
    run_and_check(make_inputs(lengths=(70, 3, 9)), torch.bfloat16, torch.float32)
    assert len(chosen_path) == 1


@pytest.mark.cuda
def test_the_choice_cuts_walks_that_leave_most_sms_idle_into_segments(chosen_path):
    """Without a forced path: one long sequence of 4 value heads is 16 walks, which
    segment_chunks cuts into segments (the workspace has their blocks); right."""
    module, sms = _GDN_EXTEND.current(), torch.cuda.get_device_properties(0).multi_processor_count
    chunks = EXTEND.segment_chunks(1100, 1, 4, 128, 128, sms)
    assert 0 < chunks < 18
    run_and_check(make_inputs(lengths=(1100,), value_heads=4), torch.bfloat16, torch.float32)
    size = module.gdn_extend_workspace_bytes(1100, 1, 2, 4, 128, 128, False, chunks)
    assert chosen_path == [size]


@pytest.mark.cuda
def test_the_choice_falls_back_to_the_fused_kernel_where_the_walk_does_not_fit(
    chosen_path, monkeypatch
):
    """The split walk fits every build on Hopper's 227 KiB; where a GPU gives a block less
    (float16 at head_k_dim 128 on sm_86 / sm_89: gdn_extend_split_fits says so), a long
    sequence takes the fused kernel instead of being refused: simulated here by a module
    whose query says no."""
    module = _GDN_EXTEND.current()
    index = torch.cuda.current_device()
    assert all(
        module.gdn_extend_split_fits(index, dim_k, fp16)
        for dim_k in (64, 128, 256)
        for fp16 in (False, True)
    )

    class Cramped:
        def __getattr__(self, name):
            return getattr(module, name)

        @staticmethod
        def gdn_extend_split_fits(*_):
            return False

    monkeypatch.setitem(_GDN_EXTEND, index, Cramped())
    long_call = make_inputs(lengths=(1100,), value_heads=4, dtype=torch.float16)
    run_and_check(long_call, torch.float16, torch.float32)
    assert chosen_path == []  # no workspace: the fused kernel ran


@pytest.mark.cuda
def test_a_short_workspace_is_refused(split_path):
    args = make_inputs(lengths=(70, 3))
    module = _GDN_EXTEND.current()
    before = args["state_pool"].clone()

    def call(workspace_bytes, segment_chunks):
        module.gdn_extend_split(
            torch.empty_like(args["v"]), args["q"], args["k"], args["v"], args["a"], args["b"],
            args["A_log"], args["dt_bias"], None, None, args["state_pool"],
            args["cache_indices"], args["cu_seqlens"], None, True, None,
            torch.empty(workspace_bytes, dtype=torch.uint8, device="cuda"), segment_chunks,
        )  # fmt: skip

    for segment_chunks in (0, 1):
        size = module.gdn_extend_workspace_bytes(73, 2, 2, 4, 128, 128, False, segment_chunks)
        expected = rf"^argument 'workspace': expected at least {size} bytes"
        with pytest.raises(ValueError, match=expected):
            call(size - 1, segment_chunks)
    with pytest.raises(ValueError, match=r"^argument 'segment_chunks': expected >= 0, got -2"):
        call(size, -2)
    assert torch.equal(bits(args["state_pool"]), bits(before))


def _bad_cases():
    """(name, change to make_inputs' arguments or a function of them, error, message)."""

    def cuda(*shape, dtype=torch.bfloat16):
        return torch.randn(shape, device="cuda").to(dtype)

    def drop(*names):
        return lambda args: {**args, **dict.fromkeys(names)}

    return [
        ("K=96", {"q": cuda(10, 2, 96), "k": cuda(10, 2, 96)}, ValueError,
         r"^argument 'q': head_k_dim \(the last dim\) must be 64, 128 or 256, got 96"),
        ("V=32", {"v": cuda(10, 4, 32)}, ValueError,
         r"^argument 'v': head_v_dim \(the last dim\) must be 64, 128 or 256, got 32"),
        ("HV%H", {"q": cuda(10, 3, 128), "k": cuda(10, 3, 128)}, ValueError,
         r"^argument 'v': num_v_heads \(4\) must be a multiple of q's num_k_heads \(3\)"),
        ("q-4d", {"q": cuda(1, 10, 2, 128)}, ValueError, r"^argument 'q': expected 3 dims"),
        ("q-2d", {"q": cuda(10, 256)}, ValueError, r"^argument 'q': expected 3 dims"),
        ("v-2d", {"v": cuda(10, 512)}, ValueError, r"^argument 'v': expected 3 dims"),
        ("seqlens-0d", {"cu_seqlens": torch.tensor(0, device="cuda")}, ValueError,
         r"^argument 'cu_seqlens': expected 1 dims"),
        ("q-fp32", {"q": cuda(10, 2, 128, dtype=torch.float32)}, TypeError,
         r"^argument 'q': expected dtype in \{float16, bfloat16\} but got float32"),
        ("k-dtype", {"k": cuda(10, 2, 128, dtype=torch.float16)}, TypeError,
         r"^argument 'k': expected dtype bfloat16 as in 'q'"),
        ("k-tokens", {"k": cuda(11, 2, 128)}, ValueError, r"^argument 'k': expected dim 0"),
        ("q-strided-last", {"q": cuda(10, 2, 256)[..., ::2]}, ValueError,
         r"^argument 'q': expected stride 1 in the last dim"),
        ("a-shape", {"a": cuda(10, 5)}, ValueError, r"^argument 'a': expected dim 1"),
        ("b-int", {"b": torch.ones(10, 4, dtype=torch.int32, device="cuda")}, TypeError,
         r"^argument 'b': expected dtype in \{float32, float16, bfloat16\}"),
        ("A_log-shape", {"A_log": cuda(5, dtype=torch.float32)}, ValueError,
         r"^argument 'A_log': expected dim 0 \(num_v_heads\) to be 4"),
        ("g-and-a", lambda args: {**args, "g": cuda(10, 4)}, ValueError,
         r"^argument 'a': pass either g= or \(a, A_log, dt_bias\), not both"),
        ("no-decay", drop("a", "A_log", "dt_bias"), ValueError,
         r"^argument 'a': required \(a tensor\) unless g= is given"),
        ("no-dt_bias", drop("dt_bias"), ValueError,
         r"^argument 'dt_bias': required \(a tensor\) unless g= is given"),
        ("beta-and-b", lambda args: {**args, "beta": cuda(10, 4)}, ValueError,
         r"^argument 'b': pass either beta= or b, not both"),
        ("no-beta", drop("b"), ValueError, r"^argument 'b': required \(a tensor\) unless beta="),
        ("pool-fp16", {"state_pool": cuda(9, 4, 128, 128, dtype=torch.float16)}, TypeError,
         r"^argument 'state_pool': expected dtype in \{float32, bfloat16\} but got float16"),
        ("pool-heads", {"state_pool": cuda(9, 2, 128, 128, dtype=torch.float32)}, ValueError,
         r"^argument 'state_pool': expected dim 1 \(num_v_heads\) to be 4"),
        ("pool-transposed",
         {"state_pool": cuda(9, 4, 128, 128, dtype=torch.float32).transpose(2, 3)}, ValueError,
         r"^argument 'state_pool': expected stride 2 \(head_k_dim\) to be 128"),
        ("pool-misaligned",
         {"state_pool": cuda(9 * 4 * 128 * 128 + 1, dtype=torch.float32)[1:].view(9, 4, 128, 128)},
         ValueError, r"^argument 'state_pool': each state must start at a 16-byte aligned"),
        ("indices-float", {"cache_indices": cuda(3, dtype=torch.float32)}, TypeError,
         r"^argument 'cache_indices': expected dtype in \{int32, int64\}"),
        ("seqlens-float", {"cu_seqlens": cuda(4, dtype=torch.float32)}, TypeError,
         r"^argument 'cu_seqlens': expected dtype in \{int32, int64\}"),
        ("seqlens-length", {"cu_seqlens": torch.tensor([0, 10], device="cuda")}, ValueError,
         r"^argument 'cu_seqlens': expected num_sequences \+ 1 = 4 offsets"),
        ("seqlens-2d", {"cu_seqlens": torch.zeros(4, 1, dtype=torch.int32, device="cuda")},
         ValueError, r"^argument 'cu_seqlens': expected 1 dims"),
        ("pool-on-cpu", {"state_pool": torch.zeros(9, 4, 128, 128)}, ValueError,
         r"^argument 'state_pool': expected a tensor on cuda"),
        ("seqlens-on-cpu", {"cu_seqlens": torch.tensor([0, 3, 7, 10])}, ValueError,
         r"^argument 'cu_seqlens': expected a tensor on cuda"),
        ("scale-nan", {"scale": math.nan}, ValueError,
         r"^argument 'scale': expected a finite number"),
        ("out-dtype", {"out": cuda(10, 4, 128, dtype=torch.float16)}, TypeError,
         r"^argument 'out': expected dtype bfloat16 as in 'q'"),
        ("out-is-v", lambda args: {**args, "out": args["v"]}, ValueError,
         r"^argument 'out': is the same memory as argument 'v'"),
        ("out-in-pool",
         lambda args: {**args, "out": args["state_pool"].view(torch.bfloat16).flatten()[:5120]
                                      .view(10, 4, 128)},
         ValueError, r"^argument 'out': overlaps argument 'state_pool'"),
    ]  # fmt: skip


BAD_CASES = _bad_cases() if torch.cuda.is_available() else []


@pytest.mark.cuda
@pytest.mark.parametrize(
    ("change", "error", "message"),
    [case[1:] for case in BAD_CASES],
    ids=[case[0] for case in BAD_CASES],
)
def test_bad_inputs_raise_naming_the_argument(change, error, message):
    args = make_inputs(lengths=(3, 4, 3), heads=2, value_heads=4, pool_size=9)
    pool = args["state_pool"]
    before = pool.clone()
    args = change(args) if callable(change) else {**args, **change}
    with pytest.raises(error, match=message):
        gdn_extend(**args)
    assert torch.equal(bits(pool), bits(before))  # refused before the kernel ran
