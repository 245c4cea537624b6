"""The family edits timed by ``bench_edit.py --families`` besides band modulation: PE transplant and LooseRoPE on
FLUX.2- and Qwen-Image-shaped transformers, on vs off, at ``bench_edit.SIZES``' token counts.

Shapes (heads of 128; few blocks, random weights): FLUX.2 (Klein) axes ``(32, 32, 32, 32)``, theta 2000; Qwen-Image
axes ``(16, 56, 56)``, theta 10000. Token counts of a 1024 px edit: a ``side x side`` output image, one
``side x side`` condition image (Klein inpainting's encoded canvas at ``t = 10``, Klein's edit reference; Qwen's
Edit condition image; Qwen inpainting has none) and ``text`` tokens. Transplant's "off" is the same forward
without the edit session (the stock model); "on" is inside the transplant window (ids / table rows rewritten every
forward by the session). LooseRoPE's "off" is its pipeline with ``enabled=False`` (edit processors installed, falling through);
"on" is step 0 with a paste of 1/4 of the image (5 bins).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch
from timing import timed  # beside this script

NAMES = {"flux2": ("FLUX.2 Klein inpaint", "FLUX.2 Klein edit"), "qwen": ("Qwen-Image inpaint", "Qwen-Image-Edit")}


def _rand(g, dtype, device, *shape):
    return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)


def flux2_inputs(side, text, condition: bool, dtype, device, sigma=1.0, text_dim=256):
    g = torch.Generator().manual_seed(0)
    grid = torch.cartesian_prod(torch.arange(1), torch.arange(side), torch.arange(side), torch.arange(1))
    ids = torch.cat([grid, grid + torch.tensor([10, 0, 0, 0])]) if condition else grid
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(text))
    return dict(
        hidden_states=_rand(g, dtype, device, 1, ids.shape[0], 128),
        encoder_hidden_states=_rand(g, dtype, device, 1, text, text_dim),
        timestep=torch.full((1,), sigma, device=device, dtype=dtype),
        guidance=None,
        img_ids=ids[None].to(device),
        txt_ids=txt_ids[None].to(device),
        return_dict=False,
    )


def qwen_inputs(side, text, condition: bool, dtype, device, sigma=1.0, text_dim=256):
    g = torch.Generator().manual_seed(0)
    shapes = [(1, side, side)] + ([(1, side, side)] if condition else [])
    tokens = sum(f * h * w for f, h, w in shapes)
    return dict(
        hidden_states=_rand(g, dtype, device, 1, tokens, 64),
        encoder_hidden_states=_rand(g, dtype, device, 1, text, text_dim),
        encoder_hidden_states_mask=torch.ones(1, text, device=device, dtype=torch.long),
        timestep=torch.full((1,), sigma, device=device, dtype=dtype),
        img_shapes=[shapes],
        return_dict=False,
    )


@dataclass
class FamilyCase:
    name: str
    transformer: torch.nn.Module
    inputs: dict
    variants: dict  # name -> context manager factory (entered around the timed forwards)
    target: tuple  # (variant, baseline, max ratio)
    method_cost: str = ""


def _transplant_rewrite(side):
    from mmpos.coords.edits import transplant_ids
    from mmpos.pipelines.edits.transplant.positions import TransplantPositions

    source = torch.zeros(side, side, dtype=torch.bool)
    source[: side // 4, : side // 4] = True  # the reference object in a canvas corner
    target = torch.zeros(side, side, dtype=torch.bool)
    target[side // 4 : 3 * side // 4, side // 3 : 2 * side // 3] = True
    return TransplantPositions(transplant_ids((side, side), source, target), (side, side), tau=0.85)


INPUTS = {"flux2": flux2_inputs, "qwen": qwen_inputs}


def transplant_case(family, model, size, dtype, device) -> FamilyCase:
    """Klein inpainting: the canvas (t = 0) and its encoded copy (t = 10); Qwen-Image inpainting: the canvas."""
    side, text, _, _, _, text_dim = size
    inputs = INPUTS[family](side, text, family == "flux2", dtype, device, text_dim=text_dim)
    rewrite = _transplant_rewrite(side)
    tokens = "canvas + its t=10 copy" if family == "flux2" else "canvas"
    return FamilyCase(
        f"pe transplant ({NAMES[family][0]}, {tokens})",
        model,
        inputs,
        {"off": lambda: _Nothing(), "on": lambda: _Session(model, {}, True, (rewrite,))},
        ("on", "off", 1.05),
        "ids (FLUX.2) / table rows (Qwen) of the moved tokens rewritten per forward",
    )


class _Session:
    """An edit session for the timed forwards: ``rules`` by layer, ``rewriters`` (``enabled=False``: installed,
    falling through)."""

    def __init__(self, model, rules: dict, enabled: bool, rewriters: tuple = ()):
        from diffusers import FlowMatchEulerDiscreteScheduler

        from mmpos.pipelines import EditContext

        self.model = model
        self.scheduler = FlowMatchEulerDiscreteScheduler()
        self.scheduler.set_timesteps(28)
        self.context = EditContext(rules=rules, rewriters=list(rewriters), enabled=enabled)
        self._session = None

    def __enter__(self):
        from mmpos.pipelines import EditSession

        self._session = EditSession(self.model, self.context, self.scheduler)
        self._session.__enter__()
        return self.context

    def __exit__(self, *exc):
        self._session.__exit__(*exc)


def loose_case(family, model, size, dtype, device) -> FamilyCase:
    """The output image and the collage (``side x side`` each), a paste of 1/4 of the image, step 0."""
    from mmpos.pipelines import LooseConfig
    from mmpos.pipelines.edits.loose.rule import LooseRoPERule

    side, text, _, _, _, text_dim = size
    pixels = side * 16
    crop = torch.zeros(pixels, pixels, dtype=torch.bool)
    crop[pixels // 4 : 3 * pixels // 4, pixels // 4 : 3 * pixels // 4] = True
    saliency = torch.linspace(0, 1, pixels * pixels).reshape(pixels, pixels)
    inputs = INPUTS[family](side, text, True, dtype, device, text_dim=text_dim)
    rule = LooseRoPERule(LooseConfig(saliency_blur=0), saliency, crop)
    layers = len(model.transformer_blocks) + len(getattr(model, "single_transformer_blocks", ()))
    every_layer = dict.fromkeys(range(layers), rule)
    case = FamilyCase(
        f"looserope ({NAMES[family][1]}, paste = 1/4 of the image)",
        model,
        inputs,
        {
            "off": lambda: _Session(model, every_layer, False),
            "on": lambda: _Session(model, every_layer, True),
        },
        ("on", "off", 1.50),
        "per saliency bin, logits from the paste's queries at twice the q/k width",
    )
    case.implied = _loose_implied
    return case


def _loose_implied(context, tokens: int) -> float:
    """Query-key pairs times (q/k + v width) over the stock's ``tokens^2 x 2``: the stock attention of the
    unbinned queries, plus per bin the paste's queries x all keys at q/k width 2 and v width 1."""
    binned = sum(len(entry[1]) for entry in context.cache["loose"])
    return ((tokens - binned) * tokens * 2 + binned * tokens * 3) / (tokens * tokens * 2)


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def time_family_case(case: FamilyCase, repeats: int, device, timed: Callable) -> dict:
    """Interleaved medians (ms) per variant; "off" equals the stock forward bit for bit; "on" changes it."""
    model, inputs = case.transformer, case.inputs
    step = lambda: model(**inputs)[0]  # noqa: E731
    outputs, samples, implied = {}, {name: [] for name in case.variants}, 1.0
    with torch.no_grad():
        stock = step()
        for name, make in case.variants.items():
            with make() as context:
                outputs[name] = step()
                if name == "on" and getattr(case, "implied", None) is not None:
                    tokens = inputs["hidden_states"].shape[1] + inputs["encoder_hidden_states"].shape[1]
                    implied = case.implied(context, tokens)
        for _ in range(repeats):
            for name, make in case.variants.items():
                with make():
                    seconds, _ = timed(step, device)
                samples[name].append(seconds)
    ms = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    fastest = {name: min(values) * 1e3 for name, values in samples.items()}  # robust to a loaded machine
    return dict(
        ms=ms,
        min_ms=fastest,
        implied=implied,
        off_equals_stock=bool(torch.equal(outputs["off"], stock)),
        max_change=float((outputs["on"].float() - stock.float()).abs().max()),
    )


def family_rows(family: str, size: tuple, dtype, device, repeats: int, timed=timed) -> list[dict]:
    """Rows of ``bench_edit``'s table for ``family``'s transplant and LooseRoPE cases; ``size`` is a
    ``bench_edit.SIZES`` entry (image side in tokens, text length, double blocks, single blocks, heads, text
    width)."""
    _, _, num_double, num_single, heads, text_dim = size
    model = build_family_transformer(family, num_double, num_single, heads, text_dim, dtype, device)
    rows = []
    for case in (transplant_case(family, model, size, dtype, device), loose_case(family, model, size, dtype, device)):
        result = time_family_case(case, repeats, device, timed)
        checked = verdict(case, result)
        text = case.inputs["encoder_hidden_states"].shape[1]
        rows.append(
            dict(
                case=case.name,
                tokens=case.inputs["hidden_states"].shape[1] + text,
                batch=1,
                ms={k: round(v, 2) for k, v in result["ms"].items()},
                peak_mib={},
                min_ms={k: round(v, 2) for k, v in result["min_ms"].items()},
                min_on_vs_off=round(result["min_ms"]["on"] / result["min_ms"]["off"], 3),
                on_vs_off=checked["ratio"],
                **checked,
            )
        )
    return rows


def verdict(case, result: dict) -> dict:
    """The target columns of a ``bench_edit`` row: the measured ``result`` against ``case.target`` (variant /
    baseline <= limit), the method's own cost and whether the edit switched off equals the stock model."""
    variant, baseline, limit = case.target
    ratio = result["ms"][variant] / result["ms"][baseline]
    return dict(
        target=f"{variant} / {baseline} <= {limit}",
        ratio=round(ratio, 3),
        met=ratio <= limit,
        implied_attention_work=round(result["implied"], 3),
        method_cost=case.method_cost,
        off_equals_stock=result["off_equals_stock"],
        max_change=result["max_change"],
    )


def build_family_transformer(family: str, num_double: int, num_single: int, heads: int, text_dim: int, dtype, device):
    """A FLUX.2-shaped (``Flux2Transformer2DModel``: double + parallel single blocks, axes (32, 32, 32, 32)) or
    Qwen-Image-shaped (``QwenImageTransformer2DModel``: ``num_double + num_single`` double-stream blocks, axes
    (16, 56, 56), complex tables) transformer, heads of 128, random weights."""
    from diffusers import Flux2Transformer2DModel, QwenImageTransformer2DModel

    torch.manual_seed(0)
    if family == "flux2":
        model = Flux2Transformer2DModel(
            patch_size=1,
            in_channels=128,
            num_layers=num_double,
            num_single_layers=num_single,
            attention_head_dim=128,
            num_attention_heads=heads,
            joint_attention_dim=text_dim,
            timestep_guidance_channels=256,
            axes_dims_rope=(32, 32, 32, 32),
            guidance_embeds=False,
        )
    else:
        model = QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=64,
            out_channels=16,
            num_layers=num_double + num_single,
            attention_head_dim=128,
            num_attention_heads=heads,
            joint_attention_dim=text_dim,
            axes_dims_rope=(16, 56, 56),
        )
    return model.to(device=device, dtype=dtype).eval()
