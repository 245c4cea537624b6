"""GPU check of the multimodal RoPE family (MRoPE, MRoPE-I, MHRoPE, VRoPE), about a minute on one GPU.

1. bf16 rotation on the device against the fp64 CPU rotation, in bf16 ulps (at the value and at the norm of
   the channel's rotation pair), on a Qwen3-VL-style prompt of ~3.6k tokens (images + an 8-frame video);
2. position ids built on the device equal the CPU ones (MRoPE with/without spatial reset, VRoPE);
3. a tiny Qwen3-VL / Qwen2-VL built on the device: text-only logits bit-identical after switching its RoPE,
   and a multimodal forward that runs;
The benchmark (``benchmarks/bench_multimodal_rope.py --device cuda``) runs after the checks in
scripts/gpu_checks.sh.

    pytest -m cuda tests/cuda/test_multimodal_rope_cuda.py -s
"""

import argparse
import json
import os
from pathlib import Path

import pytest
import torch
from bench_multimodal_rope import lm_prompt  # benchmarks/ (on the test path)
from bench_rotary import ulp

import mmpos
from mmpos.coords.multimodal import multimodal_position_ids

pytestmark = pytest.mark.cuda


def half_pair_norm(x):
    """Per channel, the norm of its rotate-half pair ``(i, i + D/2)``."""
    a, b = x.chunk(2, dim=-1)
    norm = torch.sqrt(a * a + b * b)
    return torch.cat([norm, norm], -1)


def check_rotation(device):
    types, images, video = lm_prompt()
    ids, _ = multimodal_position_ids(
        types[None], images, video, spatial_merge_size=2, split_video_frames=True, spatial_reset=True
    )
    vids, _ = multimodal_position_ids(
        types[None], images, video, spatial_merge_size=2, split_video_frames=True, design="vrope"
    )
    coords, vcoords = ids[:, 0].T.double(), vids[:, 0].T.double()
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, coords.shape[0], 128, generator=gen).bfloat16()
    encodings = {
        "mrope": (mmpos.create_pe("mrope", head_dim=128, mrope_section=(16, 24, 24), theta=5e6), coords),
        "mrope_interleave": (
            mmpos.create_pe("mrope_interleave", head_dim=128, mrope_section=(24, 20, 20), theta=5e6),
            coords,
        ),
        "mhrope": (mmpos.create_pe("mhrope", head_dim=128, num_heads=16, num_kv_heads=4, theta=5e6), coords),
        "vrope": (mmpos.create_pe("vrope", head_dim=128, theta=5e6), vcoords),
    }
    print("| encoding | tokens | max err (bf16 ulp) | max err (ulp of pair norm) |\n|---|---|---|---|")
    worst = 0.0
    for name, (pe, c) in encodings.items():
        exact = pe.rotate(q.double(), pe.table(c, torch.float64))
        got = pe.rotate(q.to(device), pe.table(c.float().to(device), torch.bfloat16, device)).double().cpu()
        err = (got - exact).abs()
        in_ulp = (err / ulp(exact, torch.bfloat16)).max().item()
        in_norm_ulp = (err / ulp(half_pair_norm(q.double()), torch.bfloat16)).max().item()
        worst = max(worst, in_norm_ulp)
        print(f"| {name} | {c.shape[0]} | {in_ulp:.3g} | {in_norm_ulp:.3g} |")
    return worst


def check_ids(device):
    types, images, video = lm_prompt()
    same = True
    for options in (dict(), dict(spatial_reset=True), dict(design="vrope")):
        cpu = multimodal_position_ids(
            types[None], images, video, spatial_merge_size=2, split_video_frames=True, **options
        )
        dev = multimodal_position_ids(
            types[None].to(device),
            images.to(device),
            video.to(device),
            spatial_merge_size=2,
            split_video_frames=True,
            **options,
        )
        same &= all(torch.equal(a, b.cpu()) for a, b in zip(cpu, dev))
    print(f"position ids on {device} equal the CPU ones: {same}")
    return same


def check_models(device):
    from mmpos.integrations.transformers_vlm import ENCODINGS, use_multimodal_rope
    from tests.fixtures import tiny_qwen_vl

    text = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9]], device=device)
    ok = True
    for kind in ("qwen2_vl", "qwen3_vl"):
        model = tiny_qwen_vl.build(kind).to(device)
        inputs = {k: v.to(device) for k, v in tiny_qwen_vl.mixed_inputs(kind).items()}
        with torch.no_grad():
            host = model(input_ids=text).logits
            for encoding in ENCODINGS:
                section = (4, 2, 2) if encoding == "mrope_interleave" and kind == "qwen2_vl" else None
                with use_multimodal_rope(model, encoding, mrope_section=section):
                    identical = torch.equal(model(input_ids=text).logits, host)
                    finite = bool(torch.isfinite(model(**inputs).logits).all())
                ok &= identical and finite
                print(
                    f"{kind:9s} {encoding:17s} text logits bit-identical: {identical}, multimodal forward finite: "
                    f"{finite}"
                )
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out-dir", type=Path, default=Path("outputs"), help="where the JSON files go")
    args = parser.parse_args(argv)
    worst = check_rotation(args.device)
    ids_ok = check_ids(args.device)
    models_ok = check_models(args.device)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    passed = worst <= 1.0 and ids_ok and models_ok
    summary = dict(
        device=args.device,
        worst_bf16_err_ulp_of_pair_norm=worst,
        ids_identical=ids_ok,
        models_text_bit_identical_and_finite=models_ok,
        passed=passed,
    )
    (args.out_dir / f"check_multimodal_rope_{args.device}.json").write_text(json.dumps(summary, indent=1))
    print(f"GPU check {'PASSED' if passed else 'FAILED'} (worst bf16 error {worst:.3g} ulp of pair norm; target <= 1)")
    return 0 if passed else 1


def test_multimodal_rope_on_cuda(tmp_path, check_device):
    """bf16 within 1 ulp of the pair norm; ids equal the CPU ones; tiny Qwen-VL text logits bit-identical."""
    out_dir = Path(os.environ.get("MMPOS_CUDA_OUT", tmp_path))  # set by scripts/gpu_checks.sh
    assert main(["--device", check_device, "--out-dir", str(out_dir)]) == 0
