"""The environment variables with a fallback variable: the first one set wins, blanks
count as unset, and the answer names the variable it came from."""

from __future__ import annotations

import pytest

from mllm_kernel.jit_utils import env

PAIRS = [
    (env.cuda_arch_list, "MLLM_KERNEL_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"),
    (env.cuda_home, "CUDA_HOME", "CUDA_PATH"),
]


@pytest.mark.parametrize(("read", "first", "second"), PAIRS)
def test_the_first_variable_set_wins_and_is_named(monkeypatch, read, first, second):
    monkeypatch.setenv(first, " one ")
    monkeypatch.setenv(second, "two")
    assert read() == ("one", first)
    monkeypatch.setenv(first, "  ")  # blank: as if unset
    assert read() == ("two", second)
    monkeypatch.delenv(second)
    assert read() is None
