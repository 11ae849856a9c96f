"""KernelModule (issue 16 first bullet, issue 17 point 2): one declaration per jit module
that gives its spec without building, registers itself, and loads each (device index, variant)
once through one memo; the device index is an explicit input of a CUDA build."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from mllm_kernel.jit_utils import cache, kernel_module, loader, registry
from mllm_kernel.jit_utils.cache_key import module_key
from mllm_kernel.jit_utils.kernel_module import KernelModule, ModuleMemo

SOURCE = """
#include <cstdint>
namespace mllm_kernel::cpu {
template <int K>
int64_t scale(int64_t x) { return x * K; }
}  // namespace mllm_kernel::cpu
"""


@pytest.fixture
def probe(tmp_path):
    """A KernelModule over a tiny C++ source, forgotten by the registry afterwards."""
    source = tmp_path / "km_probe.cpp"
    source.write_text(SOURCE)
    made = []

    def make(**kwargs):
        module = KernelModule(
            "km_probe",
            device="cpu",
            sources=[str(source)],
            exports=["scale"],
            variants=[(2,), (3,)],
            builtin=False,
            **kwargs,
        )
        made.append(module)
        return module

    yield make
    registry.unregister("km_probe", "cpu")


@pytest.fixture
def count_loads(monkeypatch):
    loads = []
    real = loader.load_spec

    def counting(spec, build_directory=None):
        loads.append(spec.template_args)
        return real(spec, build_directory)

    monkeypatch.setattr(loader, "load_spec", counting)
    return loads


def test_spec_is_a_plain_function_that_builds_nothing(fresh_cache, probe):
    module = probe()
    spec = module.spec(3)
    assert spec.template_args == ("3",)
    assert [(w.export_name, w.expression) for w in spec.cpp_wrappers] == [
        ("scale", "mllm_kernel::cpu::scale<3>")
    ]
    assert "-fopenmp" in spec.cxx_flags and "-fopenmp" in spec.ldflags  # the loader's defaults
    assert cache.lookup(module_key(spec)).status == "missing"
    assert not list(fresh_cache.glob("km_probe*"))


def test_it_registers_itself_with_its_spec_as_the_spec_function(fresh_cache, probe):
    module = probe()
    entry = registry.find("km_probe", "cpu")
    assert entry is not None and entry.variants == [(2,), (3,)]
    assert entry.spec((2,)) == module.spec(2)
    (status,) = [registry.variant_status(entry, (2,)).status]
    assert status == "not built"
    assert not list(fresh_cache.glob("km_probe*"))


def test_each_variant_loads_once_and_is_then_a_dict_hit(fresh_cache, probe, count_loads):
    module = probe()
    assert module[2].scale(5) == 10
    assert module[3].scale(5) == 15
    assert module[2] is module[2] and module[3] is module[3]
    assert count_loads == [("2",), ("3",)]
    assert registry.variant_status(registry.find("km_probe", "cpu"), (3,)).status == "cached"


def test_concurrent_first_lookups_load_once():
    calls = []

    def slow_load(index, *variant):
        calls.append((index, variant))
        time.sleep(0.05)
        return object()

    memo = ModuleMemo("cpu", slow_load)
    results = []
    threads = [threading.Thread(target=lambda: results.append(memo[7])) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == [(None, (7,))]
    assert len({id(r) for r in results}) == 1


def test_a_closed_variant_set_refuses_others_before_building(fresh_cache, probe, count_loads):
    def check(k):
        raise ValueError(f"km_probe: k must be 2 or 3, got {k}")

    module = probe(check_variant=check)
    with pytest.raises(ValueError, match="k must be 2 or 3, got 4"):
        module[4]
    assert count_loads == [] and 4 not in module


def test_cuda_memo_keys_on_the_device_index_and_passes_it_to_the_build():
    loads = []
    memo = ModuleMemo("cuda", lambda index, *variant: loads.append((index, variant)) or object())
    first = memo[0]
    assert memo[0] is first and memo[1] is not first
    memo[0, 8]
    memo[0, 8]
    assert loads == [(0, ()), (1, ()), (0, (8,))]


@pytest.mark.parametrize("key", [-1, (-1, 8)])
def test_cuda_memo_refuses_a_tensor_not_on_a_gpu_before_any_arch_or_build(key):
    def never(*args):
        raise AssertionError("nothing may be built for a tensor that is not on a GPU")

    memo = ModuleMemo("cuda", never)
    with pytest.raises(ValueError, match=r"expected a tensor on cuda but got one that is not"):
        memo[key]


def test_cuda_spec_resolves_the_arch_of_the_given_device(monkeypatch):
    asked = []

    def archs_of(device_index=None):
        asked.append(device_index)
        from mllm_kernel.jit_utils.cuda_arch import parse_arch_list

        return parse_arch_list("8.0" if device_index == 1 else "9.0a")

    monkeypatch.setattr(kernel_module, "resolve_cuda_archs", archs_of)
    module = KernelModule(
        "km_probe_cuda",
        device="cuda",
        sources=[str(Path(__file__))],  # any existing file: the spec only names it
        exports=[("run", "ns::run<{args}>")],
        variants=[(4,)],
        builtin=False,
    )
    try:
        assert [str(a) for a in module.spec(4, device_index=1).cuda_archs] == ["8.0"]
        assert [str(a) for a in module.spec(4, device_index=0).cuda_archs] == ["9.0a"]
        assert module.spec(4).cuda_wrappers[0].expression == "ns::run<4>"
        assert asked == [1, 0, None]
    finally:
        registry.unregister("km_probe_cuda", "cuda")


def test_a_hand_written_builder_gives_its_spec_without_building(fresh_cache, tmp_path):
    source = tmp_path / "km_hand.cpp"
    source.write_text(SOURCE)

    def builder(k):
        module = loader.load_cpu_jit(
            "km_hand",
            k,
            cpp_files=[str(source)],
            cpp_wrappers=[("scale", f"mllm_kernel::cpu::scale<{k}>")],
        )
        return module.scale  # uses what the loader returned: builder_spec must still answer

    spec = registry.builder_spec(builder, 5)
    assert spec.name == "km_hand" and spec.template_args == ("5",)
    assert cache.lookup(module_key(spec)).status == "missing"
    assert builder(5)(2) == 10  # outside builder_spec the same builder loads
