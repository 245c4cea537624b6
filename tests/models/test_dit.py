"""Reference DiT: presets, encodings, save/load, training steps, sampling with diffusers schedulers."""

import importlib.util
from pathlib import Path

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, FlowMatchEulerDiscreteScheduler

from mmpos.encodings import list_pes, pe_class
from mmpos.integrations.timm.models import image_pes
from mmpos.models import DIT_PRESETS, EMA, DiT, ProceduralShapes, diffusion_loss, make_noise_scheduler, sample_dit
from tests.fixtures.asserts import assert_grads_match

TINY = dict(sample_size=8, patch_size=2, in_channels=3, hidden_size=32, depth=2, num_heads=2, num_classes=4)


def tiny_dit(**kw):
    return DiT(**{**TINY, **kw})


def public(config):
    return {k: v for k, v in config.items() if not k.startswith("_")}


def test_presets_match_the_paper():
    assert set(DIT_PRESETS) >= {f"DiT-{s}/{p}" for s in ("S", "B", "L", "XL") for p in (2, 4)}
    xl = DIT_PRESETS["DiT-XL/2"]
    assert (xl["depth"], xl["hidden_size"], xl["num_heads"], xl["patch_size"]) == (28, 1152, 16, 2)
    s4 = DiT.from_preset("DiT-S/4", sample_size=8, in_channels=4, num_classes=3, depth=1)
    assert (s4.config.hidden_size, s4.config.num_heads, s4.config.patch_size) == (384, 6, 4)


@pytest.mark.parametrize("pe", image_pes())
def test_every_image_encoding_runs_and_starts_as_identity_blocks(pe):
    model = tiny_dit(pe=pe)
    x = torch.randn(2, 3, 8, 8)
    out = model(x, torch.tensor([3, 900]), torch.tensor([0, 4])).sample
    assert out.shape == x.shape and torch.count_nonzero(out) == 0  # adaLN-Zero: output layer starts at zero
    big = model(torch.randn(2, 3, 12, 16), 10, torch.tensor([1, 2])).sample
    assert big.shape == (2, 3, 12, 16)


def test_per_block_encodings_for_learned_ones_and_no_weight_decay():
    mixed = tiny_dit(pe="rope_mixed", depth=3)
    assert len(mixed.rotary_pes) == 3 and mixed.no_weight_decay() == {f"rotary_pes.{i}.freqs" for i in range(3)}
    assert len(tiny_dit(pe="rope_axial", depth=3).rotary_pes) == 1
    assert len(tiny_dit(pe="rope_mixed", depth=3, share_pe=True).rotary_pes) == 1
    assert tiny_dit(pe="ape_learned").no_weight_decay() == {"abs_pe.weight"}


@pytest.mark.parametrize("pe", ["rope_mixed", "ape_learned", "rope_axial"])
def test_save_and_load_round_trip(tmp_path, pe):
    model = tiny_dit(pe=pe, pe_options={"theta": 100.0} if pe.startswith("rope") else {})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # make zero-initialised layers matter
    model.save_pretrained(tmp_path)
    loaded = DiT.from_pretrained(tmp_path)
    assert public(loaded.config) == public(model.config)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    x, t, y = torch.randn(2, 3, 8, 8), torch.tensor([5, 700]), torch.tensor([1, 3])
    model.eval(), loaded.eval()
    assert torch.equal(model(x, t, y).sample, loaded(x, t, y).sample)


@pytest.mark.parametrize("objective", ["epsilon", "flow"])
def test_training_steps_lower_the_loss(objective):
    torch.manual_seed(0)
    model = tiny_dit(pe="rope_mixed", class_dropout_prob=0.0)
    data = torch.stack([ProceduralShapes(8, 3, 4, 16)[i][0] for i in range(8)])
    labels = torch.arange(8) % 4
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(data.shape, generator=g)
    t = torch.randint(0, 1000, (8,), generator=g) if objective != "flow" else torch.rand(8, generator=g)
    scheduler = make_noise_scheduler(objective)

    def held_out_loss():
        with torch.no_grad():
            return diffusion_loss(model, data, labels, objective, scheduler, noise=noise, t=t).item()

    before = held_out_loss()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(25):
        diffusion_loss(model, data, labels, objective, scheduler).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert held_out_loss() < 0.8 * before


@pytest.mark.parametrize(
    "scheduler",
    [
        DDPMScheduler(num_train_timesteps=1000),
        DDIMScheduler(num_train_timesteps=1000),
        FlowMatchEulerDiscreteScheduler(),
    ],
    ids=["ddpm", "ddim", "flow"],
)
def test_sampling_returns_images_of_the_right_shape(scheduler):
    model = tiny_dit(pe="rope_axial")
    with torch.no_grad():
        model.final_layer.linear.weight.normal_(std=0.1)
    g = torch.Generator().manual_seed(0)
    out = sample_dit(model, scheduler, [0, 1, 3], num_inference_steps=4, guidance_scale=3.0, generator=g)
    assert out.shape == (3, 3, 8, 8) and torch.isfinite(out).all()
    wide = sample_dit(model, scheduler, [2], num_inference_steps=2, height=8, width=12, generator=g)
    assert wide.shape == (1, 3, 8, 12)
    again = sample_dit(
        model,
        scheduler,
        [0, 1, 3],
        num_inference_steps=4,
        guidance_scale=3.0,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(out, again)  # seeded sampling is reproducible


def test_frozen_backbone_trains_only_the_encoding():
    from mmpos.integrations.pe_parameters import freeze_all_but_pe

    model = tiny_dit(pe="rope_mixed")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    names = freeze_all_but_pe(model)
    assert names == ["rotary_pes.0.freqs", "rotary_pes.1.freqs"]
    diffusion_loss(model, torch.randn(2, 3, 8, 8), torch.tensor([0, 1]), "flow").backward()
    for name, param in model.named_parameters():
        assert (param.grad is not None) == (name in names), name
    assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in names)


def test_ema_moves_towards_the_model():
    model = tiny_dit()
    ema = EMA(model, decay=0.75)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
    start = {n: p.clone() for n, p in ema.model.named_parameters()}
    ema.update(model)
    for name, p in ema.model.named_parameters():
        torch.testing.assert_close(p, 0.75 * start[name] + 0.25)


def test_train_script_runs_and_resumes(tmp_path):
    spec = importlib.util.spec_from_file_location("train_dit", Path(__file__).parents[2] / "scripts/train_dit.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    common = [
        "--tiny",
        "--data",
        "random",
        "--resolution",
        "8",
        "--batch-size",
        "4",
        "--num-classes",
        "4",
        "--pe",
        "rope_mixed",
        "--checkpoint-every",
        "2",
        "--output-dir",
        str(tmp_path),
    ]
    assert script.main(common + ["--steps", "2", "--sample-steps", "0"]) == 0
    assert (tmp_path / "checkpoint-2").is_dir()
    first = DiT.from_pretrained(tmp_path / "model")
    assert script.main(common + ["--steps", "3", "--sample-steps", "2", "--resume", "latest"]) == 0
    assert (tmp_path / "checkpoint-3").is_dir() and (tmp_path / "samples.png").is_file()
    resumed = DiT.from_pretrained(tmp_path / "model")
    ema = DiT.from_pretrained(tmp_path / "model_ema")
    assert resumed.config.pe == "rope_mixed" and public(ema.config) == public(resumed.config)
    assert not torch.equal(first.rotary_pes[0].freqs, resumed.rotary_pes[0].freqs)  # the third step trained


# ---------------------------------------------------------------- errors
def test_bad_configurations_and_inputs():
    with pytest.raises(ValueError, match=r"encoding 'rope_mixed' does not fit DiT \(head_dim=6.*multiple of 4"):
        tiny_dit(hidden_size=12, pe="rope_mixed")
    with pytest.raises(ValueError, match="reads 3 coordinate axes but DiT"):
        tiny_dit(pe="rope_axial", pe_options={"num_axes": 3})
    with pytest.raises(ValueError, match="unknown encoding 'rope_magic'"):
        tiny_dit(pe="rope_magic")
    with pytest.raises(ValueError, match="perturbation / offset_std jitter the encoding's own grid"):
        tiny_dit(pe="comrope_ap", pe_options={"block_size": 2, "perturbation": 0.5, "grid_size": (4, 4)})
    with pytest.raises(ValueError, match="preset='DiT-M/2'"):
        DiT.from_preset("DiT-M/2")
    with pytest.raises(ValueError, match="hidden_size=30 must be divisible by num_heads=4"):
        tiny_dit(hidden_size=30, num_heads=4)
    model = tiny_dit()
    with pytest.raises(ValueError, match="not divisible by patch_size=2"):
        model(torch.randn(1, 3, 8, 7), 1, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"expected \[B, 3, H, W\]"):
        model(torch.randn(1, 4, 8, 8), 1, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"class_labels must be in \[0, 4\]"):
        model(torch.randn(1, 3, 8, 8), 1, torch.tensor([5]))
    with pytest.raises(ValueError, match=r"timestep has shape \(3,\)"):
        model(torch.randn(2, 3, 8, 8), torch.tensor([1, 2, 3]), torch.tensor([0, 1]))


def test_every_registered_rotary_encoding_is_offered():
    rotary = [pe for pe in list_pes("rotary") if pe in image_pes()]
    assert {"rope_axial", "rope_mixed"} <= set(rotary)
    for pe in rotary:
        assert pe_class(pe).kind == "rotary"
        assert len(tiny_dit(pe=pe).rotary_pes) >= 1


def test_gradient_checkpointing_gives_the_same_gradients():
    model = tiny_dit(pe="rope_mixed").double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x, t, y = torch.randn(2, 3, 8, 8, dtype=torch.float64), torch.tensor([3.0, 600.0]), torch.tensor([0, 2])
    model.eval()
    model(x, t, y).sample.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.enable_gradient_checkpointing()
    model(x, t, y).sample.square().sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, grads[name], rtol=1e-9, atol=1e-12, msg=name)


def test_learned_ape_refuses_non_index_grids():
    """A learned table is indexed by patch index: normalised coordinates would read only its first cell."""
    import timm

    import mmpos.integrations.timm as mt

    with pytest.raises(ValueError, match="grid_mode"):
        DiT(
            sample_size=8,
            patch_size=2,
            in_channels=4,
            hidden_size=32,
            depth=1,
            num_heads=2,
            pe="ape_learned",
            grid_mode="normalized",
        )
    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=1, num_classes=2)
    with pytest.raises(ValueError, match="grid_mode"):
        mt.convert(vit, pe="ape_learned", grid_mode="centered")


# ---------------------------------------------------------------- tables once per forward
def _count_calls(monkeypatch, owner, name):
    calls, original = [], getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **kw: calls.append(1) or original(*a, **kw))
    return calls


@pytest.mark.parametrize(
    "pe,share,distinct",
    [("rope_axial", None, 1), ("rope_mixed", None, 4), ("rope_mixed", True, 1), ("harope", None, 4)],
)
def test_coordinates_checked_and_tables_built_once_per_forward(monkeypatch, pe, share, distinct):
    """One finiteness check per forward and one table per distinct encoding, with checkpointing on or off."""
    import mmpos.ops.tables as tables

    model = tiny_dit(pe=pe, share_pe=share, depth=4)
    assert len(model.rotary_pes) == distinct
    checks = _count_calls(monkeypatch, tables, "check_finite")
    built = [_count_calls(monkeypatch, pe_, "table") for pe_ in model.rotary_pes]
    x, t, y = torch.randn(2, 3, 8, 8), torch.tensor([3.0, 600.0]), torch.tensor([0, 2])
    for checkpointing in (False, True):
        if checkpointing:
            model.enable_gradient_checkpointing()
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                out = model(x, t, y).sample
            if grad:
                out.sum().backward()  # recomputed blocks apply the forward's tables, they do not rebuild them
            assert len(checks) == 1 and [len(b) for b in built] == [1] * distinct
            checks.clear()
            for b in built:
                b.clear()


def _per_layer_attention(self, x, pe, tables):
    """The attention path before tables were built once per forward: ``pe(q, k, coords)`` in every block."""
    B, L, C = x.shape
    q, k, v = self.qkv(x).reshape(B, L, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    if pe is not None:
        q, k = pe(q, k, tables.coords)
    x = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    return self.proj(x.transpose(1, 2).reshape(B, L, C))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "pe,share", [("rope_axial", None), ("rope_mixed", None), ("comrope_ap", None), ("harope", None), ("liere", True)]
)
def test_tables_once_per_forward_match_the_per_layer_path_bit_for_bit(monkeypatch, pe, share, dtype):
    """Outputs equal the per-layer ``pe(q, k, coords)`` path exactly; gradients too, except the order in which a
    shared learned table sums its blocks' gradients."""
    from mmpos.encodings.harope import HARoPE
    from mmpos.models.dit import DiTAttention

    torch.manual_seed(0)
    model = tiny_dit(pe=pe, share_pe=share, depth=3).to(dtype)
    for module in model.modules():
        if isinstance(module, HARoPE):
            module.fold_qkv = False  # the per-token map here; folded into qkv: tests/encodings/test_harope.py
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # make zero-initialised layers matter

    def run(x):
        model.zero_grad()
        torch.manual_seed(1)  # the same labels dropped
        out = model(x, torch.tensor([3.0, 600.0]), torch.tensor([0, 2])).sample
        out.square().sum().backward()
        return out.detach(), [p.grad for p in model.parameters()]

    for size in (8, 12):
        x = torch.randn(2, 3, size, size, dtype=dtype)
        out, grads = run(x)
        with monkeypatch.context() as patch:
            patch.setattr(DiTAttention, "forward", _per_layer_attention)
            expected, expected_grads = run(x)
        assert torch.equal(out, expected)
        assert_grads_match(grads, expected_grads, share, dtype)
