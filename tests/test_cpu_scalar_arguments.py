"""Issue 18, point 3: a scalar argument that is not a number is a TypeError naming the
argument and what came, from the op itself (one helper, op_inputs.number, behind it)."""

from __future__ import annotations

import pytest
import torch

from mllm_kernel.cpu import jit as cpu

BAD_EPS = {
    "str": ("a", "str"),
    "none": (None, "None"),
    "tensor": (torch.tensor(1e-6), "Tensor"),
}


@pytest.mark.parametrize(("eps", "got"), BAD_EPS.values(), ids=list(BAD_EPS))
def test_rmsnorm_eps_that_is_not_a_number_is_a_type_error_naming_it(eps, got):
    x, weight = torch.randn(2, 8), torch.ones(8)
    with pytest.raises(TypeError, match=rf"^argument 'eps': expected a number but got {got}$"):
        cpu.rmsnorm(x, weight, eps=eps)
    residual = torch.randn(2, 8)
    before = (x.clone(), residual.clone())
    with pytest.raises(TypeError, match=rf"^argument 'eps': expected a number but got {got}$"):
        cpu.fused_add_rmsnorm(x, residual, weight, eps)
    assert torch.equal(x, before[0]) and torch.equal(residual, before[1])  # refused, not run
