"""Device check of the editing pipelines: identity paths bit-exact on the device, edited attention in bf16 against
fp64 CPU math (with the stock processor's bf16 error as the yardstick). The per-forward cost is
``benchmarks/bench_edit.py`` (run after the checks by scripts/gpu_checks.sh).

    pytest -m cuda tests/cuda/test_edit_cuda.py -s            # ~1 min on one GPU
    python -m tests.cuda.test_edit_cuda --device cpu --json outputs/edit_precision.json   # CPU, JSON
"""

from __future__ import annotations

import argparse
import math
from types import SimpleNamespace

import pytest
import torch
from diffusers import FluxFillPipeline, FluxKontextPipeline, FluxPipeline
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_flux import FluxAttention, FluxAttnProcessor, FluxPosEmbed

from mmpos.coords import flux_ids
from mmpos.coords.edits import shrink_ids
from mmpos.pipelines import (
    BandConfig,
    BandModulationFluxPipeline,
    LooseConfig,
    LooseRoPEKontextPipeline,
    PosBridgeFillPipeline,
)
from mmpos.pipelines.edits.band.rule import SharedBandAttention
from mmpos.pipelines.edits.context import EditContext, segments_from_ids
from mmpos.pipelines.edits.families import edit_attention
from mmpos.pipelines.edits.families.flux import flux_layer_call
from mmpos.pipelines.edits.loose.rule import LooseRoPERule
from tests.fixtures.tiny_models import components, embeddings, explicit_qkv, image

pytestmark = pytest.mark.cuda
AXES = (16, 56, 56)


def _to(parts: dict, device, dtype) -> dict:
    return {
        k: (v.to(device=device, dtype=dtype) if v is not None and hasattr(v, "to") else v) for k, v in parts.items()
    }


@torch.no_grad()
def identity_checks(device, dtype) -> list[tuple[str, bool]]:
    e = {k: v.to(device, dtype) for k, v in embeddings(3).items()}
    e1 = {k: v[:1] for k, v in e.items()}
    gen = lambda: torch.Generator("cpu").manual_seed(0)  # noqa: E731
    results = []
    c = _to(components("flux"), device, dtype)
    kwargs = dict(height=64, width=64, num_inference_steps=3, output_type="latent", **e)
    stock = FluxPipeline(**c)(generator=gen(), **kwargs).images
    edit = BandModulationFluxPipeline(**c)(generator=gen(), band={"enabled": False}, **kwargs).images
    results.append(("band disabled == FluxPipeline", torch.equal(stock, edit)))
    c = _to(components("kontext"), device, dtype)
    mask = torch.zeros(64, 64, dtype=torch.bool)
    mask[16:48, 16:48] = True
    kwargs = dict(
        image=image(64, 64),
        height=64,
        width=64,
        max_area=64 * 64,
        _auto_resize=False,
        num_inference_steps=3,
        output_type="latent",
        **e1,
    )
    stock = FluxKontextPipeline(**c)(generator=gen(), **kwargs).images
    edit = LooseRoPEKontextPipeline(**c)(crop_mask=mask, loose={"strength": 0.0}, generator=gen(), **kwargs).images
    results.append(("looserope strength 0 == FluxKontextPipeline", torch.equal(stock, edit)))
    c = _to(components("fill"), device, dtype)
    pipe = PosBridgeFillPipeline(**c)
    out = pipe(
        image=image(64, 64),
        target_box=(16, 16, 48, 48),
        references=image(32, 32, seed=3),
        transplant={"tau": 1.01, "tile_fraction": 0.25},
        num_inference_steps=3,
        generator=gen(),
        output_type="pt",
        **e1,
    )
    canvas = out.canvas
    stock = FluxFillPipeline(**c)(
        image=canvas.image,
        mask_image=canvas.inpaint_mask[None, None].float(),
        height=canvas.image.shape[-2],
        width=canvas.image.shape[-1],
        num_inference_steps=3,
        generator=gen(),
        output_type="pt",
        **e1,
    ).images
    results.append(("transplant empty window == FluxFillPipeline", torch.equal(stock, out.canvas_images)))
    return results


def _attention_module(double: bool):
    torch.manual_seed(0)
    return FluxAttention(
        query_dim=256,
        heads=2,
        dim_head=128,
        added_kv_proj_dim=256 if double else None,
        bias=True,
        out_dim=None if double else 256,
        pre_only=not double,
        eps=1e-6,
    ).double()


def _relative_error(value, reference) -> float:
    value = value[0] if isinstance(value, tuple) else value
    reference = reference[0] if isinstance(reference, tuple) else reference
    return float((value.double().cpu() - reference).abs().max() / reference.abs().max())


@torch.no_grad()
def precision_checks(device) -> list[tuple[str, float, float]]:
    """(case, bf16 edit error, bf16 stock-processor error), errors relative to the fp64 output's max."""
    rows = []
    text_len, side = 8, 8
    pos_embed = FluxPosEmbed(10000, list(AXES))
    # band: shared attention, batch [reference, target, target]
    attn = _attention_module(double=False)
    ids = flux_ids(side, side, text_length=text_len, dtype=torch.float64)
    context = EditContext(step=1, num_steps=3)
    context.segments = segments_from_ids(text_len, ids[text_len:])
    hidden = torch.randn(3, text_len + side * side, 256, dtype=torch.float64)
    rule = SharedBandAttention(BandConfig(), AXES)
    rotary64 = tuple(t.double() for t in pos_embed(ids))
    reference = rule.attend_call(flux_layer_call(attn, hidden, None, rotary64, context.segments), context)
    attn_dev = _attention_module(double=False).to(device, torch.bfloat16)
    rotary_dev = tuple(t.to(device) for t in pos_embed(ids.float().to(device)))
    edited = rule.attend_call(
        flux_layer_call(attn_dev, hidden.to(device, torch.bfloat16), None, rotary_dev, context.segments), context
    )
    stock_ref = FluxAttnProcessor()(attn, hidden, None, None, rotary64)
    stock_dev = FluxAttnProcessor()(attn_dev, hidden.to(device, torch.bfloat16), None, None, rotary_dev)
    rows.append(
        (
            "band shared attention (single block)",
            _relative_error(edited, reference),
            _relative_error(stock_dev, stock_ref),
        )
    )
    # looserope: explicit fp64 logits vs the concatenated-q/k SDPA in bf16
    attn = _attention_module(double=True)
    img_ids = torch.cat([flux_ids(side, side), flux_ids(side, side, index=1.0)])
    full_ids = torch.cat([torch.zeros(text_len, 3), img_ids])
    mask = torch.zeros(side * 16, side * 16, dtype=torch.bool)
    mask[32:96, 32:96] = True
    saliency = torch.linspace(0, 1, (side * 16) ** 2).reshape(side * 16, side * 16)
    config = LooseConfig(saliency_blur=0)
    hidden = torch.randn(1, 2 * side * side, 256, dtype=torch.float64)
    text = torch.randn(1, text_len, 256, dtype=torch.float64)
    q, k, v = explicit_qkv(attn, hidden, text)
    rot = lambda x, table: apply_rotary_emb(x, table, sequence_dim=1)  # noqa: E731
    rotary64 = tuple(t.double() for t in pos_embed(full_ids))
    logits = torch.einsum("bqhd,bkhd->bhqk", rot(q, rotary64), rot(k, rotary64))
    rule = LooseRoPERule(config, saliency, mask)
    context = EditContext(step=0, num_steps=28)
    context.segments, context.img_ids = segments_from_ids(text_len, img_ids), img_ids
    context.inputs = {"img_ids": img_ids, "txt_ids": torch.zeros(text_len, 3)}
    context.adapter = edit_attention("flux")
    assert rule.is_active(context)
    maps = rule.maps
    shrink, factor = config.factors(0)
    ctx = slice(text_len + side * side, None)
    pasted = maps.context_region.flatten()
    for token in (maps.bins.flatten() >= 0).nonzero().flatten().tolist():
        b = int(maps.bins.flatten()[token])
        loose = tuple(
            t.double()
            for t in pos_embed(
                torch.cat([torch.zeros(text_len, 3), shrink_ids(img_ids, float(shrink[b]), ((side - 1) / 2,) * 2)])
            )
        )
        row = torch.einsum("bhd,bkhd->bhk", rot(q, loose)[:, text_len + token], rot(k, loose)[:, ctx])
        logits[:, :, text_len + token, ctx] = row * torch.where(pasted, factor[b], 1.0)
    expected = torch.einsum("bhqk,bkhd->bqhd", (logits / math.sqrt(128)).softmax(-1), v).flatten(2)
    reference = attn.to_out[0](expected[:, text_len:])
    attn_dev = _attention_module(double=True).to(device, torch.bfloat16)
    rule_dev = LooseRoPERule(config, saliency, mask)
    context_dev = EditContext(step=0, num_steps=28)
    context_dev.segments, context_dev.img_ids = context.segments, img_ids.to(device)
    context_dev.inputs = {"img_ids": img_ids.to(device), "txt_ids": torch.zeros(text_len, 3, device=device)}
    context_dev.adapter = edit_attention("flux")
    rule_dev.prepare(context_dev, SimpleNamespace(pos_embed=pos_embed))
    rotary_dev = tuple(t.to(device) for t in pos_embed(full_ids.to(device)))
    call = flux_layer_call(
        attn_dev, hidden.to(device, torch.bfloat16), text.to(device, torch.bfloat16), rotary_dev, context_dev.segments
    )
    edited = rule_dev.attend_call(call, context_dev)
    stock_ref = FluxAttnProcessor()(attn, hidden, text, None, rotary64)
    stock_dev = FluxAttnProcessor()(
        attn_dev, hidden.to(device, torch.bfloat16), text.to(device, torch.bfloat16), None, rotary_dev
    )
    rows_pasted = (maps.bins.flatten() >= 0).nonzero().flatten().to(device)  # the rows the edit changes
    pick = lambda out: (out[0] if isinstance(out, tuple) else out)[:, rows_pasted.to(out[0].device)]  # noqa: E731
    rows.append(
        (
            "looserope logit mix (double block, pasted rows)",
            _relative_error(pick(edited), pick(reference)),
            _relative_error(pick(stock_dev), pick(stock_ref)),
        )
    )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="also write the precision rows as JSON to this file (docs/editing.md's numbers)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    failed = 0
    print(f"== identity paths on {device} (bf16 tiny pipelines): bit-exact vs stock diffusers")
    for name, ok in identity_checks(device, torch.bfloat16):
        failed += not ok
        print(f"  {'OK ' if ok else 'FAIL'} {name}")
    print(f"== edited attention on {device} bf16 vs fp64 CPU math (relative max error; stock processor alongside)")
    print(f"  {'case':48s} {'edit bf16':>10s} {'stock bf16':>10s} {'ratio':>6s}")
    rows = precision_checks(device)
    for name, edit_err, stock_err in rows:
        ratio = edit_err / stock_err
        failed += ratio > 4
        print(f"  {name:48s} {edit_err:10.2e} {stock_err:10.2e} {ratio:6.2f}")
    if args.json:
        write_precision_json(rows, args.json, str(device))
    print("PASS" if not failed else f"{failed} check(s) FAILED")
    return int(bool(failed))


def write_precision_json(rows, path, device: str) -> None:
    """``{"device", "rows": [{"case", "edit_bf16_rel_max_error", "stock_bf16_rel_max_error"}]}``, written atomically."""
    import json

    from mmpos._atomic import written_atomically

    records = [{"case": c, "edit_bf16_rel_max_error": e, "stock_bf16_rel_max_error": s} for c, e, s in rows]
    with written_atomically(path) as temporary:
        temporary.write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": records}, indent=1))


def test_editing_pipelines_on_cuda(check_device):
    """Identity paths bit-exact; each edit's bf16 error at most 4x the stock processor's."""
    assert main(["--device", check_device]) == 0


if __name__ == "__main__":  # python -m tests.cuda.test_edit_cuda --device cpu --json FILE
    raise SystemExit(main())
