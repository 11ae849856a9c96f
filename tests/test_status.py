"""The cache's status vocabularies are enums with one mapping between them."""

from __future__ import annotations

import json

from mllm_kernel.jit_utils import cache_admin, precompile
from mllm_kernel.jit_utils.status import BuildOutcome, CacheState, VariantState, variant_state


def test_every_cache_state_has_one_variant_state():
    shown = {state: variant_state(state) for state in CacheState}
    assert shown == {
        CacheState.HIT: VariantState.CACHED,
        CacheState.MISSING: VariantState.NOT_BUILT,
        CacheState.STALE: VariantState.STALE,
        CacheState.CORRUPT: VariantState.CORRUPT,
        CacheState.UNTRUSTED: VariantState.UNTRUSTED,
    }


def test_a_status_prints_and_serialises_as_its_text():
    assert str(VariantState.NOT_BUILT) == "not built"
    assert f"{BuildOutcome.CACHED:<8}|" == "cached  |"
    assert json.dumps({"status": CacheState.HIT}) == '{"status": "hit"}'
    assert CacheState.HIT == "hit"  # the JSON readers compare with the text


def test_show_config_and_precompile_speak_the_enums(fresh_cache):
    report = cache_admin.config_report(device="cpu")
    statuses = [s.status for k in report.kernels if k.builtin for s in k.variants]
    assert statuses and all(s is VariantState.NOT_BUILT for s in statuses)
    done = precompile.precompile(device="cpu", kernels=["add_constant"])
    assert done.results and all(r.status is BuildOutcome.BUILT for r in done.results)
    again = precompile.precompile(device="cpu", kernels=["add_constant"])
    assert all(r.status is BuildOutcome.CACHED for r in again.results)
    assert again.count(BuildOutcome.CACHED) == len(again.results)
    report = cache_admin.config_report(device="cpu")
    (kernel,) = [k for k in report.kernels if k.name == "add_constant"]
    assert all(s.status is VariantState.CACHED for s in kernel.variants)
