"""taylor_matrix_exp: equals torch.linalg.matrix_exp (values and gradients) in fp64 across norms, is exactly the
identity at zero, stays accurate in fp32, and uses few products."""

import pytest
import torch

from mmpos.ops.taylor_exp import taylor_matrix_exp, taylor_plan


def _skew(*shape, scale, dtype=torch.float64, seed=0):
    a = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale
    return a - a.transpose(-1, -2)


@pytest.mark.parametrize("size", [2, 4, 16, 64])
@pytest.mark.parametrize("scale", [1e-7, 1e-3, 0.1, 1.0, 20.0])
def test_equals_matrix_exp_in_fp64(size, scale):
    s = _skew(3, size, size, scale=scale)
    expected = torch.linalg.matrix_exp(s)
    torch.testing.assert_close(taylor_matrix_exp(s), expected, rtol=0, atol=1e-13 * max(1.0, scale))


def test_general_matrices_and_batch_shapes():
    a = torch.randn(2, 3, 8, 8, dtype=torch.float64) * 0.5  # not skew: exp grows, still the same function
    torch.testing.assert_close(taylor_matrix_exp(a), torch.linalg.matrix_exp(a), rtol=1e-13, atol=1e-13)


def test_zero_gives_the_identity_exactly():
    eye = torch.eye(5).expand(2, 5, 5)
    assert torch.equal(taylor_matrix_exp(torch.zeros(2, 5, 5)), eye)


def test_fp32_is_as_accurate_as_matrix_exp():
    s = _skew(8, 128, 128, scale=0.02)
    exact = torch.linalg.matrix_exp(s)
    ours = (taylor_matrix_exp(s.float()).double() - exact).abs().max()
    theirs = (torch.linalg.matrix_exp(s.float()).double() - exact).abs().max()
    assert ours < 2 * theirs + 1e-6


@pytest.mark.parametrize("scale", [0.05, 2.0])
def test_gradients_match_matrix_exp_and_finite_differences(scale):
    s = _skew(2, 6, 6, scale=scale).requires_grad_(True)
    weights = torch.randn(2, 6, 6, dtype=torch.float64)
    (torch.linalg.matrix_exp(s) * weights).sum().backward()
    expected, s.grad = s.grad, None
    (taylor_matrix_exp(s) * weights).sum().backward()
    torch.testing.assert_close(s.grad, expected, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(taylor_matrix_exp, (s.detach().requires_grad_(True),), fast_mode=True)


def test_plans_use_few_products():
    degree, block, squarings = taylor_plan(3.7, torch.float32)  # HARoPE's 128 x 128 factors near init
    assert (block - 1) + (degree // block - 1) + squarings <= 7
    assert taylor_plan(0.0, torch.float64) == (1, 1, 0)


def test_bad_inputs():
    with pytest.raises(ValueError, match="square"):
        taylor_matrix_exp(torch.zeros(3, 4))
    with pytest.raises(TypeError, match="float32 or float64"):
        taylor_matrix_exp(torch.zeros(3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="non-finite"):
        taylor_matrix_exp(torch.full((3, 3), float("nan")))


def test_each_matrix_is_independent_of_the_rest_of_the_batch():
    small, large = _skew(1, 8, 8, scale=1e-3), _skew(1, 8, 8, scale=5.0, seed=1)
    alone = taylor_matrix_exp(small)
    together = taylor_matrix_exp(torch.cat([large, small, large]))
    assert torch.equal(together[1:2], alone) and torch.equal(together[0], together[2])


def test_gradients_with_mixed_plans_in_one_batch():
    s = torch.cat([_skew(1, 5, 5, scale=1e-4), _skew(1, 5, 5, scale=3.0, seed=1)]).requires_grad_(True)
    weights = torch.randn(2, 5, 5, dtype=torch.float64)
    (taylor_matrix_exp(s) * weights).sum().backward()
    ours, s.grad = s.grad, None
    (torch.linalg.matrix_exp(s) * weights).sum().backward()
    torch.testing.assert_close(ours, s.grad, rtol=0, atol=1e-12)
