"""Every name under a cache root is made and read back by one module (cache_names)."""

from __future__ import annotations

import os

import pytest

from mllm_kernel.jit_utils import cache_names
from mllm_kernel.jit_utils.spec import DEVICES, BuildSpec, Wrapper

HASH = "0123456789abcdef" * 4


def _spec(*template_args: str, device: str = "cpu") -> BuildSpec:
    return BuildSpec(
        name="scale",
        device=device,
        template_args=template_args,
        cpp_wrappers=(Wrapper("f", "ns::f"),),
    )


def test_entry_dirname_is_name_device_args_and_hash_prefix():
    assert cache_names.entry_dirname(_spec("1.5", "fp16_t"), HASH) == (
        "scale_cpu_1.5_fp16_t_0123456789abcdef"
    )
    assert cache_names.entry_dirname(_spec(), HASH) == "scale_cpu_0123456789abcdef"
    # Characters a file name should not hold become "-"; long arguments are cut.
    assert cache_names.entry_dirname(_spec("ns::T<4>"), HASH) == "scale_cpu_ns-T-4_0123456789abcdef"
    long_name = cache_names.entry_dirname(_spec("x" * 200), HASH)
    assert long_name == f"scale_cpu_{'x' * 64}_0123456789abcdef"


@pytest.mark.parametrize(
    "make",
    [
        cache_names.staging_dirname,
        cache_names.replaced_dirname,
        cache_names.lock_name,
        cache_names.owner_name,
        cache_names.log_name,
    ],
)
def test_every_name_made_for_an_entry_reads_back_to_it(make):
    entry = cache_names.entry_dirname(_spec("1.5", "2.25"), HASH)  # dots in the entry itself
    made = make(entry)
    assert made != entry and cache_names.entry_of(made) == entry


def test_staging_names_are_fresh_and_say_who_builds():
    entry = "scale_cpu_0123456789abcdef"
    first, second = cache_names.staging_dirname(entry), cache_names.staging_dirname(entry)
    assert first != second and first.startswith(f"{entry}.{os.getpid()}.")
    assert cache_names.replaced_dirname(entry).startswith(f"{entry}.old.")


def test_belongs_to_matches_the_kernel_on_each_device_only():
    for device in DEVICES:
        entry = cache_names.entry_dirname(_spec("4", device=device), HASH)
        assert cache_names.belongs_to(entry, ["scale"])
        assert not cache_names.belongs_to(entry, ["scal", "scale_x"])
    assert not cache_names.belongs_to("scale_x_cpu_4_0123456789abcdef", ["scale"])


def test_a_spec_for_an_unknown_device_is_refused():
    with pytest.raises(ValueError, match=r"device must be one of \('cpu', 'cuda'\), got 'gpu'"):
        _spec(device="gpu")


def test_binary_dirname_names_a_runtime_binary_like_an_entry():
    name = cache_names.binary_dirname("cubin", "my kernel/v2", "sm_90a", HASH)
    assert name == "cuda_cubin_my-kernel-v2_sm_90a_0123456789abcdef"
    assert cache_names.entry_of(cache_names.staging_dirname(name)) == name
    long_label = cache_names.binary_dirname("ptx", "k" * 100, "compute_90", HASH)
    assert long_label == f"cuda_ptx_{'k' * 48}_compute_90_0123456789abcdef"
