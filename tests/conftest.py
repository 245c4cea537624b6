import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def bf16_ulp(reference: torch.Tensor) -> torch.Tensor:
    """Spacing of bf16 numbers at |reference| (fp64): 2**(exponent - 7)."""
    exponent = torch.floor(torch.log2(reference.abs().clamp_min(2.0**-126)))
    return 2.0 ** (exponent - 7)


def logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``[..., Lq, Lk]`` dot products."""
    return q @ k.transpose(-1, -2)
