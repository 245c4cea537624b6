"""Multimodal RoPE benchmark: mmpos' MRoPE / MRoPE-I / MHRoPE / VRoPE against plain RoPE and transformers' Qwen-VL.

Three measurements, each a ratio against a baseline timed in the same run (median over repeats):

- ``table``: building cos/sin (or the complex table) from position ids, once per forward;
- ``rotate``: rotating q and k (every layer), in the activation dtype;
- ``ids``: position ids of a batch of multimodal prompts: mmpos' vectorised builder against transformers'
  ``get_rope_index`` (a Python loop over samples and blocks).

Language-model shape: q ``[1, 16, L, 128]``, k with 4 KV heads for MHRoPE (rotate-half, theta 5e6). Video
DiT shape: ``[1, 12, T*H*W, 128]`` on a (t, row, col) grid (interleaved pairs) against ``rope_axial``.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path
from types import SimpleNamespace

import torch
from timing import median_seconds, write_results

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def lm_prompt(num_images: int = 6, frames: int = 8, device="cpu"):
    """Token types of a Qwen3-VL-style prompt: text, images (16x16 tokens), a video (frames of 12x20 tokens,
    each behind timestamp text), text; with its grids in vision patches (merge 2)."""
    from mmpos.coords.multimodal import IMAGE, TEXT, VIDEO

    parts = [torch.full((20,), TEXT)]
    for _ in range(num_images):
        parts += [torch.full((256,), IMAGE), torch.full((12,), TEXT)]
    for _ in range(frames):
        parts += [torch.full((5,), TEXT), torch.full((240,), VIDEO)]
    parts.append(torch.full((40,), TEXT))
    types = torch.cat(parts).to(device)
    images = torch.tensor([[1, 32, 32]] * num_images, device=device)
    video = torch.tensor([[frames, 24, 40]], device=device)
    return types, images, video


def lm_methods(types, images, video, dtype, device):
    """name -> (build table, rotate q and k given the table) for the language-model shape."""
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb as hf_apply
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    import mmpos
    from mmpos.coords.multimodal import multimodal_position_ids

    ids, _ = multimodal_position_ids(types[None], images, video, spatial_merge_size=2, split_video_frames=True)
    vrope_ids, _ = multimodal_position_ids(
        types[None], images, video, spatial_merge_size=2, split_video_frames=True, design="vrope"
    )
    coords, vrope_coords = ids[:, 0].T.float(), vrope_ids[:, 0].T.float()
    length = coords.shape[0]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, length, 128, generator=gen).to(device, dtype)
    k = torch.randn(1, 16, length, 128, generator=gen).to(device, dtype)
    k_kv = k[:, :4].contiguous()
    rope = dict(rope_type="default", rope_theta=5e6)
    common = dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=4, head_dim=128)
    hf2 = Qwen2VLRotaryEmbedding(Qwen2VLTextConfig(**common, rope_parameters=dict(rope, mrope_section=[16, 24, 24])))
    hf3 = Qwen3VLTextRotaryEmbedding(
        Qwen3VLTextConfig(**common, rope_parameters=dict(rope, mrope_section=[24, 20, 20], mrope_interleaved=True))
    ).to(device)
    hf2 = hf2.to(device)
    pe = {
        "rope_1d (baseline)": (mmpos.create_pe("rope_1d", head_dim=128, theta=5e6), coords[:, :1], k),
        "mrope": (mmpos.create_pe("mrope", head_dim=128, mrope_section=(16, 24, 24), theta=5e6), coords, k),
        "mrope_interleave": (
            mmpos.create_pe("mrope_interleave", head_dim=128, mrope_section=(24, 20, 20), theta=5e6),
            coords,
            k,
        ),
        "mhrope (16 q / 4 kv heads)": (
            mmpos.create_pe("mhrope", head_dim=128, num_heads=16, num_kv_heads=4, head_section=(2, 1, 1), theta=5e6),
            coords,
            k_kv,
        ),
        "vrope": (mmpos.create_pe("vrope", head_dim=128, theta=5e6), vrope_coords, k),
    }
    methods = {}
    for name, (enc, c, kk) in pe.items():
        c = c.to(device)
        build = lambda enc=enc, c=c: _uncached_table(enc, c, dtype, device)
        methods[name] = (build, lambda table, enc=enc, kk=kk: (enc.rotate(q, table), enc.rotate(kk, table)))
    ids_dev = ids.to(device)
    for name, rotary in (("transformers Qwen2-VL (chunked)", hf2), ("transformers Qwen3-VL (interleaved)", hf3)):
        methods[name] = (lambda rotary=rotary: rotary(q, ids_dev), lambda cs: hf_apply(q, k, *cs))
    return methods, length


def dit_methods(dtype, device, frames=8, height=30, width=52):
    import mmpos
    from mmpos.coords import video_grid
    from mmpos.coords.vrope import video_grid_ids

    length = frames * height * width
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 12, length, 128, generator=gen).to(device, dtype)
    k = torch.randn(1, 12, length, 128, generator=gen).to(device, dtype)
    grid, vgrid = video_grid(frames, height, width, device=device), video_grid_ids(frames, height, width, device)
    encs = {
        "rope_axial chunked (baseline, Wan)": (mmpos.create_pe("rope_axial", head_dim=128, num_axes=3), grid),
        "mrope_interleave (Wan-I)": (
            mmpos.create_pe("mrope_interleave", head_dim=128, mrope_section=(22, 21, 21), layout="interleaved"),
            grid,
        ),
        "vrope": (mmpos.create_pe("vrope", head_dim=128, layout="interleaved"), vgrid),
    }
    return {
        name: (
            (lambda enc=enc, c=c: _uncached_table(enc, c, dtype, device)),
            (lambda table, enc=enc: (enc.rotate(q, table), enc.rotate(k, table))),
        )
        for name, (enc, c) in encs.items()
    }, length


def _uncached_table(enc, coords, dtype, device):
    enc.cache.clear()
    return enc.table(coords, dtype, device)


def bench_tables_and_rotation(kind: str, dtype_name: str, device: str, repeats: int, log=print) -> list[dict]:
    dtype = DTYPES[dtype_name]
    if kind == "lm":
        methods, length = lm_methods(*lm_prompt(device="cpu"), dtype, device)
        baseline = "rope_1d (baseline)"
    else:
        methods, length = dit_methods(dtype, device)
        baseline = "rope_axial chunked (baseline, Wan)"
    rows = []
    for name, (build, rotate) in methods.items():
        table = build()
        rows.append(
            dict(
                shape=kind,
                tokens=length,
                dtype=dtype_name,
                device=device,
                method=name,
                table_ms=median_seconds(build, device, repeats) * 1e3,
                rotate_ms=median_seconds(lambda: rotate(table), device, repeats) * 1e3,
            )
        )
    base = next(r for r in rows if r["method"] == baseline)
    for r in rows:
        r["table_vs_baseline"] = r["table_ms"] / base["table_ms"]
        r["rotate_vs_baseline"] = r["rotate_ms"] / base["rotate_ms"]
        log(
            f"  {kind:3s} {dtype_name:5s} {r['method']:38s} table {r['table_ms']:8.2f} ms "
            f"({r['table_vs_baseline']:5.2f}x)  rotate q+k {r['rotate_ms']:8.2f} ms ({r['rotate_vs_baseline']:5.2f}x)"
        )
    return rows


def bench_position_ids(device: str, repeats: int, batch: int = 8, log=print) -> dict:
    """mmpos' vectorised ids vs transformers' Qwen3-VL ``get_rope_index`` on a batch of prompts."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

    from mmpos.coords.multimodal import multimodal_position_ids

    types, images, video = lm_prompt(device=device)
    types = types[None].expand(batch, -1).contiguous()
    images, video = images.repeat(batch, 1), video.repeat(batch, 1)
    host = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=2)))
    host.get_vision_position_ids = lambda *a, **kw: Qwen3VLModel.get_vision_position_ids(host, *a, **kw)
    theirs = lambda: Qwen3VLModel.get_rope_index(host, types, types, images, video)
    ours = lambda: multimodal_position_ids(
        types, images, video, spatial_merge_size=2, split_video_frames=True, vision_advance="spatial"
    )
    same = torch.equal(theirs()[0], ours()[0])
    t_theirs, t_ours = median_seconds(theirs, device, repeats), median_seconds(ours, device, repeats)
    row = dict(
        batch=batch,
        tokens=types.shape[1],
        device=device,
        transformers_ms=t_theirs * 1e3,
        mmpos_ms=t_ours * 1e3,
        speedup=t_theirs / t_ours,
        identical=same,
    )
    log(
        f"  ids batch {batch} x {types.shape[1]} tokens: transformers {t_theirs * 1e3:.1f} ms, mmpos "
        f"{t_ours * 1e3:.2f} ms (speed-up {t_theirs / t_ours:.1f}x), identical ids: {same}"
    )
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--shapes", nargs="+", default=["lm", "dit"], choices=["lm", "dit"])
    parser.add_argument("--dtypes", nargs="+", default=["bf16"], choices=list(DTYPES))
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON file (default outputs/bench_multimodal_rope_<device>.json)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} CPU threads, "
        f"{platform.processor() or platform.machine()}"
    )
    rows = [
        row
        for kind in args.shapes
        for dtype in args.dtypes
        for row in bench_tables_and_rotation(kind, dtype, args.device, args.repeats)
    ]
    ids_row = bench_position_ids(args.device, args.repeats)
    out = args.out or Path(f"outputs/bench_multimodal_rope_{args.device}.json")
    meta = dict(
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        device=args.device,
        command="python benchmarks/bench_multimodal_rope.py " + " ".join(argv or []),
    )
    write_results(out, meta, tables_and_rotation=rows, position_ids=ids_row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
