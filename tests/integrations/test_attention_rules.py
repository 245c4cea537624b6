"""UltraViCo on a tiny Wan (``set_attention_rule``): stock bit for bit up to the training length, the rule on every
self-attention layer past it (never on cross-attention), gone again with ``clear_attention_rule``. The rule's math
against the authors' kernel: ``tests/encodings/test_window_decay.py``."""

import pytest
import torch

from mmpos.integrations.diffusers import clear_attention_rule, set_attention_rule, set_pe
from mmpos.integrations.diffusers.installer import CAMERA, ProcessorInstaller
from mmpos.ops.frame_reencoding import FrameReencoding
from mmpos.ops.window_decay import WindowDecay
from tests.fixtures.tiny_models import tiny_flux, tiny_wan, tiny_wan_inputs


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def run(model, frames):
    with torch.no_grad():
        return model(**tiny_wan_inputs(frames=frames), return_dict=False)[0]


def test_stock_bit_for_bit_up_to_the_training_length():
    stock = tiny_wan()
    model = set_attention_rule(set_pe(tiny_wan(), "native"), {"type": "ultravico", "train_frames": 3, "alpha": 0.5})
    for frames in (1, 3):
        assert torch.equal(run(model, frames), run(stock, frames))


def test_past_the_training_length_every_self_attention_takes_the_rule(monkeypatch):
    stock = tiny_wan()
    neutral = set_attention_rule(
        set_pe(tiny_wan(), "native"), WindowDecay(train_frames=2, alpha=1.0, isolate_first_frame=False)
    )
    calls = []
    attend = WindowDecay.attend
    monkeypatch.setattr(WindowDecay, "attend", lambda self, *a, **k: calls.append(a[3]) or attend(self, *a, **k))
    # alpha 1 without the mask: softmax attention again (centred keys shift each row by a constant)
    assert (run(neutral, 5) - run(stock, 5)).abs().max() < 1e-5
    assert calls == [12, 12]  # two layers' self-attention, 4 x 3 tokens a frame; cross-attention never
    decayed = set_attention_rule(set_pe(tiny_wan(), "native"), {"type": "ultravico", "train_frames": 2, "alpha": 0.5})
    change = (run(decayed, 5) - run(stock, 5)).abs().max() / run(stock, 5).abs().max()
    assert change > 1e-3


def test_clear_gives_the_set_pe_model_back():
    model = set_pe(tiny_wan(), "native")
    before = run(model, 4)
    set_attention_rule(model, {"type": "ultravico", "train_frames": 2, "alpha": 0.5})
    assert not torch.equal(run(model, 4), before)
    clear_attention_rule(model)
    assert torch.equal(run(model, 4), before)


def test_one_video_grid_serves_the_rules_and_the_camera_adapters():
    """``Family.latent_grid`` is the video token grid both read: every camera family has one; the rules run where the
    processors take them too (tier 2, or a ``rule_processor``), and a tier-1 camera family is refused by name."""
    from dataclasses import replace

    from mmpos.integrations.diffusers.families import FAMILIES, builtin_families, register_family
    from mmpos.integrations.diffusers.families.tiny import CASES

    builtin_families()
    rules = sorted(name for name, family in FAMILIES.items() if family.takes_attention_rules)
    assert rules == ["hunyuan_video", "hunyuan_video15", "ltx", "wan", "wan_animate", "wan_vace"]  # as before the merge
    cameras = [family for family in FAMILIES.values() if family.camera is not None]
    assert cameras and all(family.latent_grid is not None for family in cameras)
    cosmos = set_pe(CASES["cosmos"].model(), "native")  # a camera site and its grid, stock processors: no rule
    with pytest.raises(ValueError, match="cosmos family is not supported; supported: .*ltx"):
        set_attention_rule(cosmos, {"type": "ultravico", "train_frames": 2})
    with pytest.raises(ValueError, match="'nope': camera adapters need the family's latent_grid"):
        register_family(replace(FAMILIES["cosmos"], name="nope", latent_grid=None))
    assert "nope" not in FAMILIES


def test_refusals_name_what_is_wrong():
    with pytest.raises(ValueError, match="set_pe first"):
        set_attention_rule(tiny_wan(), {"type": "ultravico", "train_frames": 2})
    with pytest.raises(ValueError, match="flux family is not supported"):
        set_attention_rule(set_pe(tiny_flux(), "native"), {"type": "ultravico", "train_frames": 2})
    with pytest.raises(ValueError, match="train_frames"):
        set_attention_rule(set_pe(tiny_wan(), "native"), {"type": "ultravico"})
    with pytest.raises(ValueError, match="unknown options"):
        set_attention_rule(set_pe(tiny_wan(), "native"), {"type": "ultravico", "train_frames": 2, "beta": 1})


class Passthrough:
    """A camera-level processor that only delegates to the encoding level (as the camera adapters' do)."""

    def __init__(self, slot):
        self.slot = slot

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        beneath = self.slot.below(CAMERA)
        return beneath(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)


def test_found_beneath_a_camera_level():
    model = set_pe(tiny_wan(), "native")
    before = run(model, 4)
    installer = ProcessorInstaller.of(model)
    installer.fill(CAMERA, {i: Passthrough(slot) for i, slot in enumerate(installer.slots)})
    assert torch.equal(run(model, 4), before)
    set_attention_rule(model, {"type": "ultravico", "train_frames": 2, "alpha": 0.5})
    assert (run(model, 4) - before).abs().max() > 1e-3


# FreeLOC (the rule's math against the authors' code: tests/encodings/test_frame_reencoding.py)


def test_freeloc_stock_bit_for_bit_up_to_the_training_length():
    stock = tiny_wan()
    model = set_attention_rule(set_pe(tiny_wan(), "native"), {"type": "freeloc", "train_frames": 3})
    for frames in (1, 3):
        assert torch.equal(run(model, frames), run(stock, frames))


def test_freeloc_changes_the_layers_named_past_the_training_length(monkeypatch):
    stock = tiny_wan()
    calls = []
    attend = FrameReencoding.attend
    monkeypatch.setattr(FrameReencoding, "attend", lambda self, *a, **k: calls.append(a[3]) or attend(self, *a, **k))
    whole = {"type": "freeloc", "train_frames": 2, "near_frames": 6, "far_frames": 7}  # every pair near: stock
    assert (run(set_attention_rule(set_pe(tiny_wan(), "native"), whole), 6) - run(stock, 6)).abs().max() < 1e-5
    calls.clear()
    rule = {"type": "freeloc", "train_frames": 2, "near_frames": 2, "far_frames": 3, "layers": [1]}
    change = (run(set_attention_rule(set_pe(tiny_wan(), "native"), rule), 6) - run(stock, 6)).abs().max()
    assert calls == [12] and change > 1e-3  # layer 1 only, 4 x 3 tokens a frame


@pytest.mark.parametrize("riflex", [False, True])
def test_freeloc_moves_time_as_the_model_rotates(riflex):
    """The rule's time shift of rotated q equals the model's own rotation at the moved frames (native Wan tables,
    or RIFLEx's on time: the shift follows the schedule resolved at this forward's grid)."""
    from mmpos.integrations.diffusers import model_extrapolation
    from mmpos.integrations.diffusers.attention_rules import time_shift
    from mmpos.integrations.diffusers.families import family_for
    from mmpos.integrations.diffusers.families.wan import _wan_rotate

    model = tiny_wan()
    policies = model_extrapolation(model, "none", (4, 3), time={"type": "riflex", "k": 2, "target_length": 9})
    set_pe(model, "native", extrapolation=policies if riflex else None)
    frames, moved, rows, cols = 5, 3, 4, 3
    shift = time_shift(model, family_for(model))
    grid = (frames + moved, rows, cols)
    latents = torch.zeros(1, 4, *grid[:1], 2 * rows, 2 * cols)
    cos, sin = model.rope(latents)
    x = torch.randn(1, frames * rows * cols, 2, cos.shape[-1], generator=torch.Generator().manual_seed(0))
    first, later = slice(0, frames * rows * cols), slice(moved * rows * cols, (frames + moved) * rows * cols)
    at_first = _wan_rotate(x, cos[:, first], sin[:, first])
    at_later = _wan_rotate(x, cos[:, later], sin[:, later])
    shifted = shift(at_first, torch.full((frames * rows * cols,), float(moved)), grid)
    assert (shifted - at_later).abs().max() < 1e-5
    assert (at_first - at_later).abs().max() > 0.1  # the move is visible


def test_freeloc_refusals_name_what_is_wrong():
    with pytest.raises(ValueError, match="freeloc: unknown options"):
        set_attention_rule(set_pe(tiny_wan(), "native"), {"type": "freeloc", "train_frames": 2, "alpha": 1})
    with pytest.raises(ValueError, match="layers"):
        set_attention_rule(set_pe(tiny_wan(), "native"), {"type": "freeloc", "train_frames": 2, "layers": 1})
    with pytest.raises(ValueError, match="freeloc: the flux family"):
        set_attention_rule(set_pe(tiny_flux(), "native"), {"type": "freeloc", "train_frames": 2})


# UltraViCo on a family with stock processors (LTX): rule processors installed by set_attention_rule


def run_ltx(model, frames):
    from mmpos.integrations.diffusers.families.tiny import CASES

    with torch.no_grad():
        return model(**CASES["ltx"].inputs(3, 4, frames=frames), return_dict=False)[0]


def tiny_ltx():
    from mmpos.integrations.diffusers.families.tiny import CASES

    return CASES["ltx"].model()


@pytest.mark.parametrize("with_set_pe", [False, True])
def test_ultravico_on_ltx_stock_within_the_training_length_and_the_rule_past_it(with_set_pe, monkeypatch):
    stock = tiny_ltx()
    model = tiny_ltx()
    if with_set_pe:
        set_pe(model, "native")
    stock_processor = model.transformer_blocks[0].attn1.processor
    set_attention_rule(model, {"type": "ultravico", "train_frames": 2, "alpha": 0.5})
    assert type(model.transformer_blocks[0].attn1.processor).__name__ == "LTXRuleAttnProcessor"
    assert type(model.transformer_blocks[0].attn2.processor) is type(stock_processor)  # cross-attention stays
    for frames in (1, 2):
        assert torch.equal(run_ltx(model, frames), run_ltx(stock, frames))
    calls = []
    attend = WindowDecay.attend
    monkeypatch.setattr(WindowDecay, "attend", lambda self, *a, **k: calls.append(a[3]) or attend(self, *a, **k))
    assert (run_ltx(model, 5) - run_ltx(stock, 5)).abs().max() > 1e-3
    assert calls == [12]  # one layer's self-attention, 3 x 4 tokens a frame
    clear_attention_rule(model)
    assert model.transformer_blocks[0].attn1.processor is stock_processor
    assert torch.equal(run_ltx(model, 5), run_ltx(stock, 5))


def test_freeloc_on_ltx_is_refused_by_name():
    with pytest.raises(ValueError, match="freeloc: the ltx family is not supported; supported: wan"):
        set_attention_rule(tiny_ltx(), {"type": "freeloc", "train_frames": 2})


def test_ultravico_on_hunyuan_video15_joint_attention(monkeypatch):
    """Video tokens first, then text: stock within the training length; past it the rule runs on the joint sequence
    with the padding mask, and the text keeps its stock attention when nothing is decayed (alpha 1, no mask)."""
    from mmpos.integrations.diffusers.families.tiny import CASES

    case = CASES["hunyuan_video15"]

    def inputs(frames):
        out = case.inputs(3, 4)
        out["hidden_states"] = torch.randn(1, 4, frames, 3, 4, generator=torch.Generator().manual_seed(5))
        return out

    def forward(model, frames):
        with torch.no_grad():
            return model(**inputs(frames), return_dict=False)[0]

    stock, model = case.model(), case.model()
    set_attention_rule(model, {"type": "ultravico", "train_frames": 2, "alpha": 0.5})
    for frames in (1, 2):
        assert torch.equal(forward(model, frames), forward(stock, frames))
    assert (forward(model, 6) - forward(stock, 6)).abs().max() > 1e-3
    neutral = {"type": "ultravico", "train_frames": 2, "alpha": 1.0, "isolate_first_frame": False}
    set_attention_rule(model, neutral)
    calls = []
    attend = WindowDecay.attend
    monkeypatch.setattr(
        WindowDecay, "attend", lambda self, *a, **k: calls.append(k["video_tokens"]) or attend(self, *a, **k)
    )
    assert (forward(model, 6) - forward(stock, 6)).abs().max() < 1e-4
    assert calls == [72] * len(model.transformer_blocks)  # 6 frames of 3 x 4 tokens, then the text
    clear_attention_rule(model)
    assert type(model.transformer_blocks[0].attn.processor).__name__ == "HunyuanVideo15AttnProcessor2_0"
