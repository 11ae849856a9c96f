"""gdn_decode (issue 33): the gated delta net's decode step against a float64 token-by-token
reference (tests/gdn_reference.py), at every head dim, GVA ratio, input and state dtype;
the pool's padding and untouched rows, T > 1 tokens as T single steps, CUDA graphs,
torch.compile, and every bad input named. The CPU part needs no GPU: the declaration
(schema, fake), the refusals decided before any kernel, and the module's build (nvcc)."""

from __future__ import annotations

import math

import pytest
import torch
from gdn_reference import gdn_reference, softplus

from mllm_kernel.cuda.jit.gdn_decode import _GDN_DECODE, gdn_decode
from mllm_kernel.jit_utils import cuda_arch_override, env, loader

OPS = torch.ops.mllm_kernel
HEAD_DIMS = (64, 128, 256)
# The rounding unit of each dtype: a stored value is within it (relative) of the exact one
# (float32: with the arithmetic of a few tokens).
UNIT = {torch.float32: 2e-6, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def make_inputs(
    batch=3,
    tokens=None,
    heads=2,
    value_heads=4,
    dim_k=128,
    dim_v=128,
    dtype=torch.bfloat16,
    state_dtype=torch.float32,
    pool_size=None,
    index_dtype=torch.int64,
    device="cuda",
):
    """gdn_decode's positional arguments as a dict, random: ``tokens`` None gives the
    original's one-token layout ``[B, H, K]``; distinct pool rows, in random order."""
    lead = (batch,) if tokens is None else (batch, tokens)
    pool_size = 2 * batch + 3 if pool_size is None else pool_size

    def randn(*shape, dt=dtype, scale=1.0):
        return (torch.randn(shape, device=device) * scale).to(dt)

    return {
        "q": randn(*lead, heads, dim_k),
        "k": randn(*lead, heads, dim_k),
        "v": randn(*lead, value_heads, dim_v),
        # decays e^g of about 0.4 to 0.995: the state carried over matters
        "a": randn(*lead, value_heads, scale=0.5),
        "b": randn(*lead, value_heads),
        "A_log": torch.empty(value_heads, device=device).uniform_(0.5, 4).log(),
        "dt_bias": randn(value_heads, dt=torch.float32, scale=0.5) - 3,
        "state_pool": randn(pool_size, value_heads, dim_v, dim_k, dt=state_dtype, scale=0.3),
        "cache_indices": torch.randperm(pool_size, device=device)[:batch].to(index_dtype),
    }


def reference(args, **options):
    """gdn_reference of a make_inputs dict (plus gdn_decode's keyword options)."""
    args = {**args, **options}
    for unused in ("out", "intermediate_states"):
        args.pop(unused, None)
    return gdn_reference(
        args.pop("q"), args.pop("k"), args.pop("v"), args.pop("state_pool"),
        args.pop("cache_indices"), **args,
    )  # fmt: skip


def assert_near(got, expected, unit, what, spread=2e-5):
    """Every element of ``got`` within ``unit`` (relative: its rounding) of the float64
    ``expected``, plus ``spread`` of the largest magnitude (fp32 arithmetic: errors of
    the sums an element is made of); NaN fails."""
    assert got.shape == expected.shape, (what, got.shape, expected.shape)
    got = got.double()
    err = (got - expected).abs()
    bound = unit * expected.abs() + spread * expected.abs().max().clamp(min=1e-30)
    bad = ~(err <= bound)
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.numel()} elements off, worst error "
        f"{err.nan_to_num(float('inf')).max().item():.3g} (bound {bound.max().item():.3g})"
    )


def run_and_check(args, dtype, state_dtype, **options):
    """Runs gdn_decode on ``args`` (the pool updated in place) and checks the output, the
    pool and, when asked for, the intermediate states against the reference."""
    o_ref, pool_ref, states_ref = reference(args, **options)
    o = gdn_decode(**args, **options)
    assert o.dtype == args["v"].dtype and o.shape == args["v"].shape
    assert_near(o, o_ref, UNIT[dtype], "o")
    assert_near(args["state_pool"], pool_ref, UNIT[state_dtype], "state_pool")
    if options.get("intermediate_states") is not None:
        assert_near(options["intermediate_states"], states_ref, UNIT[state_dtype], "states")
    return o


def bits(t):
    return t.contiguous().view(torch.uint8)


# The kernel's launch configurations (kLayouts in gdn_decode.cu), and those that stream
# the state through shared memory (one token per sequence).
CONFIGS = range(3)
STREAMED = (2,)


def decode_with_config(args, config, errors=None):
    """gdn_decode's kernel on make_inputs' ``args`` (raw gates, the defaults) with launch
    configuration ``config`` instead of its own choice; the output poisoned first."""
    out = torch.full_like(args["v"], float("nan"))
    _GDN_DECODE[args["q"].get_device()].gdn_decode(
        out, args["q"], args["k"], args["v"], args["a"], args["b"], args["A_log"],
        args["dt_bias"], None, None, args["state_pool"], args["cache_indices"], None, None, True,
        errors, 132, config,
    )  # fmt: skip
    return out


# --------------------------------------------------------------------------- no GPU
def test_schema_marks_the_pool_and_the_intermediate_states_written():
    schema = OPS.gdn_decode.default._schema
    written = [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write]
    assert written == ["state_pool", "intermediate_states"]
    assert [a.name for a in schema.arguments] == [
        "q", "k", "v", "a", "b", "A_log", "dt_bias", "state_pool", "cache_indices",
        "g", "beta", "scale", "use_qk_l2norm", "intermediate_states",
    ]  # fmt: skip
    keywords = [a.name for a in schema.arguments if a.kwarg_only]
    assert keywords == ["g", "beta", "scale", "use_qk_l2norm", "intermediate_states"]
    out = OPS.gdn_decode.out._schema
    written = [a.name for a in out.arguments if a.alias_info and a.alias_info.is_write]
    assert written == ["state_pool", "intermediate_states", "out"]


@pytest.mark.parametrize("tokens", [None, 3])
def test_fake_is_shaped_and_typed_like_v(tokens):
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = make_inputs(tokens=tokens, device="cpu", dtype=torch.float16)
    with FakeTensorMode() as mode:
        fake = {name: mode.from_tensor(value) for name, value in args.items()}
        o = OPS.gdn_decode(**fake)
    assert (o.shape, o.dtype) == (args["v"].shape, torch.float16)


@pytest.fixture
def no_build(monkeypatch):
    def refuse(spec):
        raise AssertionError(f"{spec.describe()} was built or loaded for a bad input")

    monkeypatch.setattr(loader, "load_spec", refuse)


def test_cpu_tensors_are_refused_before_any_build(no_build):
    with pytest.raises(ValueError, match=r"^argument 'q': expected a tensor on cuda but got one"):
        gdn_decode(**make_inputs(device="cpu"))


def test_a_required_grad_is_refused_and_nothing_is_written(no_build):
    args = make_inputs(device="cpu")
    args["v"] = args["v"].float().requires_grad_()
    pool = args["state_pool"].clone()
    with pytest.raises(RuntimeError, match=r"mllm_kernel.gdn_decode has no backward"):
        gdn_decode(**args)
    assert torch.equal(args["state_pool"], pool)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"q": [1.0, 2.0]}, r"^argument 'q': expected a torch.Tensor"),
        ({"state_pool": "pool"}, r"^argument 'state_pool': expected a torch.Tensor"),
        ({"scale": "0.1"}, r"^argument 'scale': expected a number but got str"),
        ({"use_qk_l2norm": 1}, r"^argument 'use_qk_l2norm': expected a bool but got int"),
    ],
    ids=["q", "state_pool", "scale", "use_qk_l2norm"],
)
def test_arguments_of_the_wrong_kind_are_type_errors(change, message, no_build):
    with pytest.raises(TypeError, match=message):
        gdn_decode(**{**make_inputs(device="cpu"), **change})


@pytest.mark.nvcc
def test_module_builds_for_sm80_and_sm90a_and_takes_the_python_arguments():
    """The one build of every variant (input dtype x state dtype x head_k_dim), for both
    archs; its export takes what the Python kernel passes (None for absent tensors and
    scale, a bool): with CPU tensors the C++ checks run up to the device check of q."""
    with cuda_arch_override("9.0a,8.0"):
        module = _GDN_DECODE.load()
    assert module.implements_function("gdn_decode")
    args = make_inputs(device="cpu")
    out = torch.empty_like(args["v"])
    with pytest.raises(ValueError, match=r"^argument 'q': expected a tensor on cuda"):
        module.gdn_decode(
            out, args["q"], args["k"], args["v"], args["a"], args["b"], args["A_log"],
            args["dt_bias"], None, None, args["state_pool"], args["cache_indices"], None, None,
            True, None, 132, -1,
        )  # fmt: skip


# --------------------------------------------------------------------------- on a GPU
@pytest.mark.cuda
@pytest.mark.parametrize("dim_k", HEAD_DIMS)
@pytest.mark.parametrize("dim_v", HEAD_DIMS)
@pytest.mark.parametrize("ratio", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_matches_the_float64_reference(dim_k, dim_v, ratio, dtype, state_dtype):
    args = make_inputs(
        batch=5, heads=2, value_heads=2 * ratio, dim_k=dim_k, dim_v=dim_v, dtype=dtype,
        state_dtype=state_dtype,
    )  # fmt: skip
    run_and_check(args, dtype, state_dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 67])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim_v", HEAD_DIMS)
@pytest.mark.parametrize("dim_k", HEAD_DIMS)
@pytest.mark.parametrize("config", CONFIGS)
def test_every_launch_configuration_matches_the_reference(config, dim_k, dim_v, state_dtype, batch):
    """Each configuration, whichever batch the kernel would choose it for: one sequence,
    and 67 with a padding index; two tokens where it takes several. Rows not addressed
    stay bit-identical."""
    tokens = None if config in STREAMED else 2
    args = make_inputs(
        batch=batch, tokens=tokens, heads=2, value_heads=4, dim_k=dim_k, dim_v=dim_v,
        state_dtype=state_dtype, pool_size=batch + 4,
    )  # fmt: skip
    if batch > 1:
        args["cache_indices"][batch // 2] = -1
    before = args["state_pool"].clone()
    o_ref, pool_ref, _ = reference(args)
    o = decode_with_config(args, config)
    assert_near(o, o_ref, UNIT[torch.bfloat16], "o")
    assert_near(args["state_pool"], pool_ref, UNIT[state_dtype], "state_pool")
    untouched = torch.ones(batch + 4, dtype=torch.bool, device="cuda")
    untouched[args["cache_indices"][args["cache_indices"] >= 0]] = False
    assert torch.equal(bits(args["state_pool"][untouched]), bits(before[untouched]))


@pytest.mark.cuda
@pytest.mark.parametrize("config", CONFIGS)
def test_every_launch_configuration_counts_an_index_past_the_pool(config):
    args = make_inputs(batch=4, pool_size=6, state_dtype=torch.bfloat16)
    args["cache_indices"][1] = 9
    before = args["state_pool"].clone()
    errors = torch.zeros(1, dtype=torch.int32, device="cuda")
    o = decode_with_config(args, config, errors)
    assert o[1].isnan().all() and not o[[0, 2, 3]].isnan().any()
    assert errors.item() == 1
    others = torch.ones(6, dtype=torch.bool, device="cuda")
    others[args["cache_indices"][[0, 2, 3]]] = False
    assert torch.equal(bits(args["state_pool"][others]), bits(before[others]))


@pytest.mark.cuda
def test_a_streamed_configuration_refuses_several_tokens():
    args = make_inputs(batch=2, tokens=2)
    with pytest.raises(ValueError, match=rf"^argument 'config': configuration {STREAMED[0]} "):
        decode_with_config(args, STREAMED[0])
    with pytest.raises(ValueError, match=r"^argument 'config': expected -1 \(chosen per call\)"):
        decode_with_config(args, len(CONFIGS))


@pytest.mark.cuda
@pytest.mark.parametrize("dim_k", HEAD_DIMS)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_several_tokens_with_intermediate_states(dim_k, state_dtype):
    args = make_inputs(
        batch=4, tokens=5, heads=2, value_heads=4, dim_k=dim_k, dim_v=64, state_dtype=state_dtype
    )
    states = torch.full((4, 5, 4, 64, dim_k), float("nan"), device="cuda", dtype=state_dtype)
    run_and_check(args, torch.bfloat16, state_dtype, intermediate_states=states)
    # the pool holds the last token's state, as stored
    assert torch.equal(args["state_pool"][args["cache_indices"]], states[:, -1])


@pytest.mark.cuda
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_several_tokens_equal_single_steps(state_dtype):
    """T tokens in one call equal T calls of one token (the state carried in fp32 in
    between instead of rounded to the pool's dtype: equal to that rounding, which the
    outputs carry too, as an error of its size against the largest)."""
    args = make_inputs(batch=6, tokens=4, value_heads=8, state_dtype=state_dtype)
    steps = {name: value.clone() for name, value in args.items()}
    states = torch.empty(6, 4, 8, 128, 128, device="cuda", dtype=state_dtype)
    o = gdn_decode(**args, intermediate_states=states)
    index = steps["cache_indices"]
    # bf16: one rounding per step against one at the end, a few units of the largest apart
    unit, spread = (
        (1e-6, 2e-5)
        if state_dtype == torch.float32
        else (4 * UNIT[state_dtype], 2 * UNIT[state_dtype])
    )
    for t in range(4):
        one = {n: steps[n][:, t] for n in ("q", "k", "v", "a", "b")}
        o_t = gdn_decode(**{**steps, **one})
        assert_near(o_t, o[:, t].double(), UNIT[torch.bfloat16], f"o[{t}]", spread)
        assert_near(steps["state_pool"][index], states[:, t].double(), unit, f"state[{t}]", spread)


@pytest.mark.cuda
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_padding_starts_from_zero_and_other_rows_stay_bit_identical(index_dtype):
    args = make_inputs(batch=7, tokens=2, pool_size=20, index_dtype=index_dtype)
    args["cache_indices"][[1, 4]] = -1
    before = args["state_pool"].clone()
    o_ref, pool_ref, _ = reference(args)
    zero_pool = {**args, "state_pool": torch.zeros_like(before[:1]),
                 "cache_indices": torch.zeros_like(args["cache_indices"])}  # fmt: skip
    o_zero, _, _ = reference(zero_pool)
    o = gdn_decode(**args)
    assert_near(o, o_ref, UNIT[torch.bfloat16], "o")
    assert_near(o[[1, 4]], o_zero[[1, 4]], UNIT[torch.bfloat16], "o from zero state")
    used = args["cache_indices"][args["cache_indices"] >= 0].long()
    untouched = torch.ones(20, dtype=torch.bool, device="cuda")
    untouched[used] = False
    assert torch.equal(bits(args["state_pool"][untouched]), bits(before[untouched]))
    assert_near(args["state_pool"], pool_ref, UNIT[torch.float32], "state_pool")


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
    args = make_inputs(batch=4, pool_size=6)
    args["cache_indices"][2] = 6
    before = args["state_pool"].clone()
    o = gdn_decode(**args)
    assert o[2].isnan().all() and not o[[0, 1, 3]].isnan().any()
    others = torch.ones(6, dtype=torch.bool, device="cuda")
    others[args["cache_indices"][[0, 1, 3]]] = False
    assert torch.equal(bits(args["state_pool"][others]), bits(before[others]))
    bounds_flag("1")
    with pytest.raises(IndexError, match=r"1 of argument 'cache_indices' are >= the pool's 6"):
        gdn_decode(**args)


@pytest.mark.cuda
def test_poisoned_out_is_written_everywhere_and_returned():
    args = make_inputs(batch=9, tokens=3, value_heads=8)
    o_ref, _, _ = reference(args)
    out = torch.full_like(args["v"], float("nan"))
    assert gdn_decode(**args, out=out) is out
    assert_near(out, o_ref, UNIT[torch.bfloat16], "out")


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
    args = make_inputs(batch=4, tokens=2, value_heads=4)
    for name in options.pop("precomputed", ()):
        if name == "g":
            a, A_log, dt_bias = (args.pop(n).double() for n in ("a", "A_log", "dt_bias"))
            options["g"] = (-A_log.exp() * softplus(a + dt_bias)).float()
            args.update(a=None, A_log=None, dt_bias=None)
        else:
            options["beta"] = torch.sigmoid(args.pop("b").double()).to(torch.bfloat16)
            args["b"] = None
    o_ref, pool_ref, _ = reference(args, **options)
    o = gdn_decode(**args, **options)
    assert_near(o, o_ref, UNIT[torch.bfloat16], "o")
    assert_near(args["state_pool"], pool_ref, UNIT[torch.float32], "state_pool")


@pytest.mark.cuda
def test_gate_extremes_take_softplus_threshold():
    args = make_inputs(batch=4, value_heads=4, dtype=torch.float16)
    args["a"][0] = 30.0  # softplus = a: decay ~ e^-(A * 30), about 0
    args["a"][1] = -30.0  # softplus ~ e^-30: decay ~ 1
    args["b"][2] = 30.0  # beta = 1
    args["b"][3] = -30.0  # beta ~ 0: the state only decays
    run_and_check(args, torch.float16, torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("misaligned", [False, True])
def test_strided_views_of_a_fused_projection(misaligned):
    """q, k, v as column blocks of one [B, T, ...] projection (non-contiguous), gates as
    strided columns, the pool a slice of a bigger one; ``misaligned`` starts q and k one
    element off a vector (the kernel's scalar path)."""
    B, T, H, HV, K, V = 5, 2, 2, 4, 128, 64
    shift = 1 if misaligned else 0
    qkv = torch.randn(B, T, shift + 2 * H * K + HV * V, device="cuda").bfloat16()
    args = make_inputs(batch=B, tokens=T, heads=H, value_heads=HV, dim_k=K, dim_v=V)
    args["q"] = qkv[..., shift : shift + H * K].unflatten(-1, (H, K))
    args["k"] = qkv[..., shift + H * K : shift + 2 * H * K].unflatten(-1, (H, K))
    args["v"] = qkv[..., shift + 2 * H * K :].unflatten(-1, (HV, V))
    ab = torch.randn(B, T, 2 * HV, device="cuda")
    args["a"], args["b"] = ab[..., 0::2], ab[..., 1::2]
    big = torch.randn(2, 11, HV, V, K, device="cuda")
    other = big[0].clone()
    args["state_pool"] = big[1]
    args["cache_indices"] = torch.tensor([3, 0, 7, 10, 5], device="cuda")
    run_and_check(args, torch.bfloat16, torch.float32)
    assert torch.equal(big[0], other)


@pytest.mark.cuda
def test_empty_batch_and_zero_tokens():
    for args in (make_inputs(batch=0), make_inputs(batch=3, tokens=0)):
        before = args["state_pool"].clone()
        o = gdn_decode(**args)
        assert o.shape == args["v"].shape and o.numel() == 0
        assert torch.equal(args["state_pool"], before)


@pytest.mark.cuda
def test_more_sequences_than_a_grid_dim_holds():
    """70000 sequences of one 64 x 64 head: 70000 CTAs, past 65535."""
    n = 70_000
    args = make_inputs(
        batch=n, heads=1, value_heads=1, dim_k=64, dim_v=64, state_dtype=torch.bfloat16,
        pool_size=n, index_dtype=torch.int32,
    )  # fmt: skip
    run_and_check(args, torch.bfloat16, torch.bfloat16)


@pytest.mark.cuda
def test_cuda_graph_replays_with_new_inputs():
    args = make_inputs(batch=8, tokens=2, value_heads=8)
    out = torch.empty_like(args["v"])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (build, load) outside the capture
        gdn_decode(**args, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gdn_decode(**args, out=out)
    fresh = make_inputs(batch=8, tokens=2, value_heads=8)
    fresh["cache_indices"] = args["cache_indices"]
    for name in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state_pool"):
        args[name].copy_(fresh[name])
    o_ref, pool_ref, _ = reference(fresh)
    graph.replay()
    assert_near(out, o_ref, UNIT[torch.bfloat16], "o")
    assert_near(args["state_pool"], pool_ref, UNIT[torch.float32], "state_pool")


@pytest.mark.cuda
def test_torch_compile_keeps_the_pool_update():
    args = make_inputs(batch=4, value_heads=4)
    eager_pool = args["state_pool"].clone()

    def step(q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices):
        return gdn_decode(q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices) * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    expected = step(**{**args, "state_pool": eager_pool})
    got = compiled(**args)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(args["state_pool"], eager_pool, rtol=0, atol=0)


@pytest.mark.cuda
def test_the_originals_docstring_call():
    """The original mllm-kernel's documented call and shapes: bf16, fp32 pool, int64
    indices, Qwen3-Next's heads."""
    from mllm_kernel.cuda.jit.gdn_decode import gdn_decode as original_path

    bs, num_k_heads, num_v_heads, head_k_dim, head_v_dim = 4, 16, 32, 128, 128
    q = torch.randn(bs, num_k_heads, head_k_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(bs, num_k_heads, head_k_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(bs, num_v_heads, head_v_dim, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(bs, num_v_heads, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(bs, num_v_heads, device="cuda", dtype=torch.bfloat16)
    A_log = torch.randn(num_v_heads, device="cuda", dtype=torch.float32)
    dt_bias = torch.randn(num_v_heads, device="cuda", dtype=torch.float32)
    state_pool = torch.randn(10, num_v_heads, head_v_dim, head_k_dim, device="cuda") * 0.1
    cache_indices = torch.tensor([7, 2, 0, 9], device="cuda", dtype=torch.int64)
    o_ref, pool_ref, _ = gdn_reference(
        q, k, v, state_pool, cache_indices, a=a, b=b, A_log=A_log, dt_bias=dt_bias
    )
    output = original_path(q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices)
    assert output.shape == (bs, num_v_heads, head_v_dim) and output.dtype == torch.bfloat16
    assert_near(output, o_ref, UNIT[torch.bfloat16], "output")
    assert_near(state_pool, pool_ref, UNIT[torch.float32], "state_pool")


def _bad_cases():
    """(name, change to make_inputs' arguments or a function of them, error, message)."""

    def cuda(*shape, dtype=torch.bfloat16):
        return torch.randn(shape, device="cuda").to(dtype)

    def drop(*names):
        return lambda args: {**args, **dict.fromkeys(names)}

    return [
        ("K=96", {"q": cuda(3, 2, 96), "k": cuda(3, 2, 96)}, ValueError,
         r"^argument 'q': head_k_dim \(the last dim\) must be 64, 128 or 256, got 96"),
        ("V=32", {"v": cuda(3, 4, 32)}, ValueError,
         r"^argument 'v': head_v_dim \(the last dim\) must be 64, 128 or 256, got 32"),
        ("HV%H", {"q": cuda(3, 3, 128), "k": cuda(3, 3, 128)}, ValueError,
         r"^argument 'v': num_v_heads \(4\) must be a multiple of q's num_k_heads \(3\)"),
        ("HV=0", lambda args: {**args, "v": cuda(3, 0, 128), "a": cuda(3, 0), "b": cuda(3, 0),
                               "A_log": cuda(0, dtype=torch.float32),
                               "dt_bias": cuda(0, dtype=torch.float32),
                               "state_pool": cuda(9, 0, 128, 128, dtype=torch.float32)},
         ValueError, r"^argument 'v': expected at least one head \(num_v_heads\), got 0"),
        ("q-2d", {"q": cuda(3, 128)}, ValueError, r"^argument 'q': expected \[batch, num_k_h"),
        ("q-fp32", {"q": cuda(3, 2, 128, dtype=torch.float32)}, TypeError,
         r"^argument 'q': expected dtype in \{float16, bfloat16\} but got float32"),
        ("k-dtype", {"k": cuda(3, 2, 128, dtype=torch.float16)}, TypeError,
         r"^argument 'k': expected dtype bfloat16 as in 'q'"),
        ("k-shape", {"k": cuda(3, 1, 128)}, ValueError, r"^argument 'k': expected dim 1"),
        ("q-strided-last", {"q": cuda(3, 2, 256)[..., ::2]}, ValueError,
         r"^argument 'q': expected stride 1 in the last dim"),
        ("v-tokens", {"v": cuda(3, 1, 4, 128)}, ValueError, r"^argument 'v': expected 3 dims"),
        ("a-shape", {"a": cuda(3, 5)}, ValueError, r"^argument 'a': expected dim 1"),
        ("b-int", {"b": torch.ones(3, 4, dtype=torch.int32, device="cuda")}, TypeError,
         r"^argument 'b': expected dtype in \{float32, float16, bfloat16\}"),
        ("A_log-shape", {"A_log": cuda(5, dtype=torch.float32)}, ValueError,
         r"^argument 'A_log': expected dim 0 \(num_v_heads\) to be 4"),
        ("g-and-a", lambda args: {**args, "g": cuda(3, 4)}, ValueError,
         r"^argument 'a': pass either g= or \(a, A_log, dt_bias\), not both"),
        ("no-decay", drop("a", "A_log", "dt_bias"), ValueError,
         r"^argument 'a': required \(a tensor\) unless g= is given"),
        ("no-dt_bias", drop("dt_bias"), ValueError,
         r"^argument 'dt_bias': required \(a tensor\) unless g= is given"),
        ("beta-and-b", lambda args: {**args, "beta": cuda(3, 4)}, ValueError,
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
        ("indices-length", {"cache_indices": torch.arange(4, device="cuda")}, ValueError,
         r"^argument 'cache_indices': expected dim 0 \(batch\) to be 3"),
        ("pool-on-cpu", {"state_pool": torch.zeros(9, 4, 128, 128)}, ValueError,
         r"^argument 'state_pool': expected a tensor on cuda"),
        ("scale-nan", {"scale": math.nan}, ValueError,
         r"^argument 'scale': expected a finite number"),
        ("states-shape", {"intermediate_states": cuda(3, 2, 4, 128, 128, dtype=torch.float32)},
         ValueError, r"^argument 'intermediate_states': expected dim 1 \(tokens\) to be 1"),
        ("states-dtype", {"intermediate_states": cuda(3, 1, 4, 128, 128)}, TypeError,
         r"^argument 'intermediate_states': expected dtype float32 as in 'state_pool'"),
        ("out-dtype", {"out": cuda(3, 4, 128, dtype=torch.float16)}, TypeError,
         r"^argument 'out': expected dtype bfloat16 as in 'q'"),
        ("out-is-v", lambda args: {**args, "out": args["v"]}, ValueError,
         r"^argument 'out': is the same memory as argument 'v'"),
        ("out-in-pool",
         lambda args: {**args, "out": args["state_pool"].view(torch.bfloat16)[0, :3, :4, :128]},
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
    args = make_inputs(batch=3, heads=2, value_heads=4, pool_size=9)
    pool = args["state_pool"]
    before = pool.clone()
    args = change(args) if callable(change) else {**args, **change}
    with pytest.raises(error, match=message):
        gdn_decode(**args)
    assert torch.equal(bits(pool), bits(before))  # refused before the kernel ran
