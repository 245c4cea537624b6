"""The one EMA (mmpos.models.ema): the DiT's constant decay and the world trainer's warm-up, state round trips."""

import pytest
import torch
from torch import nn

from mmpos.models import EMA


def _step(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def test_warmup_decay_follows_its_formula_in_fp64():
    model = nn.Linear(3, 2).double()
    _step(model, 0.0)
    ema = EMA(model, decay=0.999, warmup=True)
    expected = torch.zeros((), dtype=torch.float64)
    for n in range(1, 6):
        _step(model, float(n))
        decay = min(0.999, (1 + n) / (10 + n))
        assert ema.current_decay() == decay
        ema.update(model)
        expected = decay * expected + (1 - decay) * n
        for p in ema.model.parameters():
            torch.testing.assert_close(p, torch.full_like(p, expected.item()), rtol=1e-15, atol=0)
    assert int(ema.num_updates) == 5


def test_constant_decay_copies_buffers_and_state_round_trips():
    model = nn.BatchNorm1d(4)
    ema = EMA(model, decay=0.5)
    model.running_mean.fill_(3.0)
    _step(model, 2.0)
    ema.update(model)
    assert torch.equal(ema.model.running_mean, model.running_mean)
    assert torch.equal(ema.model.weight, torch.full((4,), 1.5))  # 0.5 * 1 + 0.5 * 2
    state = ema.state_dict()
    assert set(state) >= {"model.weight", "num_updates"}
    legacy = {k: v for k, v in state.items() if k != "num_updates"}  # states saved before the update count
    restored = EMA(nn.BatchNorm1d(4), decay=0.5)
    restored.load_state_dict(legacy)
    assert torch.equal(restored.model.weight, ema.model.weight) and int(restored.num_updates) == 0
    target = restored.copy_to(nn.BatchNorm1d(4))
    assert torch.equal(target.running_mean, model.running_mean)


def test_decay_out_of_range_is_rejected():
    with pytest.raises(ValueError, match=r"decay must be in \[0, 1\), got 1.0"):
        EMA(nn.Linear(2, 2), decay=1.0)
