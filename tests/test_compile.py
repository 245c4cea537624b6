"""torch.compile traces the rotary operator (real-arithmetic path) on attention-style views."""
import torch

import mmpos
from mmpos.coords import image_grid


def test_compiled_rotation_matches_eager_on_views_with_prefix_and_backward():
    pe = mmpos.create_pe("rope_axial", head_dim=16, axes_dims=(6, 6), num_prefix_tokens=1)
    grid = image_grid(4, 4)
    qkv = torch.randn(1, 17, 3, 2, 16).permute(2, 0, 3, 1, 4)  # [3, B, H, L, D] views, as inside attention
    q = qkv[0].clone().requires_grad_(True)  # same strides pattern as the view, but a leaf for the gradient
    compiled = torch.compile(lambda t: pe(t, t, grid)[0])
    out = compiled(qkv[0])
    torch.testing.assert_close(out, pe(qkv[0], qkv[0], grid)[0], rtol=0, atol=1e-6)
    assert torch.equal(out[:, :, 0], qkv[0][:, :, 0])  # the prefix token is untouched
    (compiled(q) * torch.arange(16.0)).sum().backward()
    eager = q.detach().clone().requires_grad_(True)
    (pe(eager, eager, grid)[0] * torch.arange(16.0)).sum().backward()
    torch.testing.assert_close(q.grad, eager.grad, rtol=0, atol=1e-6)
