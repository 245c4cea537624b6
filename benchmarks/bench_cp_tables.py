"""Rotary-table memory per rank under diffusers' context parallelism: 1 process against N processes (torchrun, gloo).

Per case (Wan with Wan2.1-1.3B's attention: 12 heads x 128; Flux with FLUX.1's head_dim 128 and axes (16, 56, 56), 2
heads: only ``rope_mixed``'s tables grow with the heads; Qwen-Image with its head_dim 128 and axes (16, 56, 56), 2
heads, no text mask; LTX-Video with its attention, 32 heads x 64, no text mask and one timestep: what diffusers'
plan can shard), one forward of a one-block model with ``set_pe``, in one process and on every rank of
``--processes`` processes under ``enable_parallelism`` (Ulysses). Measured on the position module's first call (its
table builds), counting every tensor storage an op creates there
(``torch.utils._python_dispatch.TorchDispatchMode``; a storage counts until it is freed):

- ``cached``: bytes still alive after the forward, its outputs dropped (the tables and coordinates the seam and
  its encodings keep for the next step);
- ``peak``: the most bytes alive at once during the call.

Then the same for Wan 720p / 81 frames (21 x 45 x 80 = 75600 tokens; 1.3B: 12 heads, 14B: 40), FLUX.1 at 4096 px
(256 x 256 + 512 text = 66048 tokens, 24 heads), Qwen-Image at 1328 px (83 x 83 + 512 text = 7401 tokens) and
LTX-Video at 768 x 512, 121 frames (16 x 16 x 24 = 6144 latent tokens, 32 heads), computed from the shapes (``formula``:
the tables, coordinates and copies each cache keeps; checked against the measured ``cached`` bytes at the run's
size) and, for the peak, the measured peak bytes per token scaled to the token count.

    OMP_NUM_THREADS=1 python benchmarks/bench_cp_tables.py                 # 1 vs 2 CPU processes
    OMP_NUM_THREADS=1 python benchmarks/bench_cp_tables.py --processes 4 --out cp_tables.json
    OMP_NUM_THREADS=1 python benchmarks/bench_cp_tables.py --cases qwen ltx/native    # only these cases

The diffusers CPU limitation patched on the ranks (and only it): ``torch.accelerator.device_count()`` is 0
without an accelerator and diffusers takes ``rank % 0`` (made 1), as in ``tests/workers/cp_patches.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import subprocess
import sys
import tempfile
import weakref
from functools import partial
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

WAN_CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=12,
    attention_head_dim=128,
    in_channels=4,
    out_channels=4,
    text_dim=32,
    freq_dim=256,
    ffn_dim=64,
    num_layers=1,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=1024,
)
FLUX_CONFIG = dict(
    patch_size=1,
    in_channels=4,
    num_layers=1,
    num_single_layers=0,
    attention_head_dim=128,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    axes_dims_rope=[16, 56, 56],
)
QWEN_CONFIG = dict(  # Qwen-Image's head_dim 128 and axes (16, 56, 56), 2 heads
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=1,
    attention_head_dim=128,
    num_attention_heads=2,
    joint_attention_dim=32,
    axes_dims_rope=(16, 56, 56),
)
LTX_CONFIG = dict(  # LTX-Video's attention: 32 heads x 64 (its rope's tables are [L, 2048])
    in_channels=4,
    out_channels=4,
    patch_size=1,
    patch_size_t=1,
    num_attention_heads=32,
    attention_head_dim=64,
    cross_attention_dim=2048,
    num_layers=1,
    caption_channels=32,
)
CONFIGS = {"wan": WAN_CONFIG, "flux": FLUX_CONFIG, "qwen": QWEN_CONFIG, "ltx": LTX_CONFIG}
CASES = [(family, pe) for family in ("wan", "flux") for pe in ("native", "rope_axial", "rope_mixed")]
CASES += [("qwen", "native"), ("qwen", "rope_axial"), ("ltx", "native")]
WAN_LATENTS = (4, 32, 32)  # frames, height, width: grid 4 x 16 x 16 = 1024 tokens
FLUX_GRID = (32, 32, 64)  # image rows, cols, text: 1088 tokens
QWEN_GRID = (32, 32, 64)  # image rows, cols, text: 1088 tokens
LTX_LATENTS = (4, 16, 16, 8)  # frames, rows, cols (1024 tokens), text (no rotary embedding)
LARGE = {  # name: (family, tokens, heads)
    "Wan 1.3B 720p/81f": ("wan", 21 * 45 * 80, 12),
    "Wan 14B 720p/81f": ("wan", 21 * 45 * 80, 40),
    "FLUX.1 4096px": ("flux", 256 * 256 + 512, 24),
    "Qwen-Image 1328px": ("qwen", 83 * 83 + 512, 24),  # 1328 / 16 = 83, 512 text (max_sequence_length)
    "LTX-Video 768x512/121f": ("ltx", 16 * 16 * 24, 32),  # frames (121 - 1) / 8 + 1, 512 / 32, 768 / 32
}


def head_dim(family: str) -> int:
    return CONFIGS[family]["attention_head_dim"]


def heads(family: str) -> int:
    """The measured model's heads."""
    return CONFIGS[family]["num_attention_heads"]


def grows_with_heads(family: str, pe: str) -> bool:
    """The tables have a row per head (``rope_mixed``) or span the inner dimension (LTX's ``(cos, sin)``)."""
    return pe == "rope_mixed" or family == "ltx"


class StorageBytes(TorchDispatchMode):
    """Bytes of the tensor storages ops create while the mode is on (views and in-place results of an input's
    storage are not new), each counted until it is freed: ``now`` and ``peak``."""

    def __init__(self):
        super().__init__()
        self.now = self.peak = 0
        self._alive: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key in inputs or key in self._alive:
                continue
            size = storage.nbytes()
            self._alive[key] = weakref.ref(storage, partial(self._freed, key, size))
            self.now += size
            self.peak = max(self.peak, self.now)
        return out

    def _freed(self, key, size, _):
        self._alive.pop(key, None)
        self.now -= size


def formula_bytes(family: str, pe: str, tokens: int, heads: int) -> int:
    """What the seam and its encodings cache for ``tokens`` rows (fp32 activations), from the shapes: ``rope_*``
    keep a complex64 table ``[groups, L, head_dim / 2]`` and the coordinates' copy ``[L, 3]`` fp32 in the table
    cache (Wan also its grid coordinates; ``rope_mixed`` also the copy of its frequencies ``[heads, 3, head_dim /
    2]`` fp32 in the cache key: the one constant); ``native`` keeps the fp64 table (complex128) and the stock fp32
    ``cos`` and ``sin`` ``[L, head_dim]``, except Qwen-Image (its complex64 table and the stock-arithmetic copy,
    ``[L, head_dim / 2]`` each) and LTX-Video (the stock ``(cos, sin)`` ``[L, heads * head_dim]`` fp32, the seam's
    last output)."""
    dim = head_dim(family)
    pairs, coords = dim // 2, 3 * 4
    if family == "ltx":
        return tokens * 2 * heads * dim * 4
    if family == "qwen":
        return tokens * (coords + pairs * 8 * (2 if pe == "native" else 1))
    if pe == "native":
        return tokens * (coords + pairs * 16 + 2 * dim * 4)
    groups = heads if pe == "rope_mixed" else 1
    grid = coords if family == "wan" else 0
    frequencies = heads * 3 * pairs * 4 if pe == "rope_mixed" else 0
    return tokens * (coords + grid + groups * pairs * 8) + frequencies


def wan_inputs():
    from diffusers import WanTransformer3DModel

    frames, height, width = WAN_LATENTS
    inputs = dict(
        hidden_states=torch.randn(1, 4, frames, height, width),
        encoder_hidden_states=torch.randn(1, 8, WAN_CONFIG["text_dim"]),
        timestep=torch.tensor([500]),
    )
    return WanTransformer3DModel, inputs, frames * height * width // 4


def flux_inputs():
    from diffusers import FluxTransformer2DModel

    from mmpos.coords.grids import flux_ids

    rows, cols, text = FLUX_GRID
    ids = flux_ids(rows, cols, text_length=text)
    inputs = dict(
        hidden_states=torch.randn(1, rows * cols, 4),
        encoder_hidden_states=torch.randn(1, text, 32),
        pooled_projections=torch.randn(1, 32),
        timestep=torch.tensor([0.5]),
        img_ids=ids[text:],
        txt_ids=ids[:text],
    )
    return FluxTransformer2DModel, inputs, rows * cols + text


def qwen_inputs():
    """An unpadded prompt: no text mask, as QwenImagePipeline passes it."""
    from diffusers import QwenImageTransformer2DModel

    rows, cols, text = QWEN_GRID
    inputs = dict(
        hidden_states=torch.randn(1, rows * cols, QWEN_CONFIG["in_channels"]),
        encoder_hidden_states=torch.randn(1, text, QWEN_CONFIG["joint_attention_dim"]),
        encoder_hidden_states_mask=None,
        timestep=torch.tensor([0.5]),
        img_shapes=[[(1, rows, cols)]],
    )
    return QwenImageTransformer2DModel, inputs, rows * cols + text


def ltx_inputs():
    """No text mask and one timestep (what diffusers' LTX plan can shard), LTXPipeline's interpolation scale."""
    from diffusers import LTXVideoTransformer3DModel

    frames, rows, cols, text = LTX_LATENTS
    inputs = dict(
        hidden_states=torch.randn(1, frames * rows * cols, LTX_CONFIG["in_channels"]),
        encoder_hidden_states=torch.randn(1, text, LTX_CONFIG["caption_channels"]),
        timestep=torch.tensor([500.0]),
        encoder_attention_mask=None,
        num_frames=frames,
        height=rows,
        width=cols,
        rope_interpolation_scale=(8 / 25, 32, 32),
    )
    return LTXVideoTransformer3DModel, inputs, frames * rows * cols


INPUTS = {"wan": wan_inputs, "flux": flux_inputs, "qwen": qwen_inputs, "ltx": ltx_inputs}


def model_and_inputs(family: str, pe: str):
    """A one-block model with ``set_pe``, its forward's inputs and its token count (those the tables cover)."""
    from mmpos.integrations.diffusers import set_pe

    torch.manual_seed(0)
    model_class, inputs, tokens = INPUTS[family]()
    model = model_class(**CONFIGS[family]).eval()
    set_pe(model, pe)
    return model, inputs, tokens


def measure(family: str, pe: str, parallel) -> dict:
    """``cached`` and ``peak`` bytes of the seam's first call (see the module docstring)."""
    from mmpos.integrations.diffusers import position_module

    model, inputs, tokens = model_and_inputs(family, pe)
    if parallel is not None:
        model.enable_parallelism(config=parallel)
    seam, counter = position_module(model), StorageBytes()
    forward = seam.forward  # diffusers' hooks (Wan: the plan's split of the outputs) wrap it

    def counted(*args, **kwargs):
        with counter:
            return forward(*args, **kwargs)

    seam.forward = counted
    with torch.no_grad():
        model(**inputs, return_dict=False)
    seam.forward = forward
    return dict(tokens=tokens, cached=counter.now, peak=counter.peak)


def selected(names: list[str] | None) -> list[tuple[str, str]]:
    """The cases named ``family`` or ``family/pe`` (all of them for ``None``), in :data:`CASES`' order."""
    if not names:
        return list(CASES)
    known = {f"{family}/{pe}" for family, pe in CASES} | {family for family, _ in CASES}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"--cases {' '.join(unknown)}: expected families or family/pe of {sorted(known)}")
    return [(family, pe) for family, pe in CASES if family in names or f"{family}/{pe}" in names]


def worker(out: Path, cases: list[tuple[str, str]]) -> None:
    """One rank: ``cases`` under Ulysses (degree = the processes); writes ``rank{R}.json``."""
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    torch.set_num_threads(1)
    dist.init_process_group("cpu:gloo")
    torch.accelerator.device_count = lambda: 1  # the diffusers CPU limitation (module docstring)
    degree = dist.get_world_size()
    results = {f"{f}/{pe}": measure(f, pe, ContextParallelConfig(ulysses_degree=degree)) for f, pe in cases}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def run_ranks(processes: int, cases: list[tuple[str, str]]) -> list[dict]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
        command += ["--master_port", str(port), __file__, "--worker", folder, "--cases"]
        command += [f"{family}/{pe}" for family, pe in cases]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"the {processes} ranks failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return [json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in range(processes)]


def mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def report(alone: dict, ranks: list[dict], processes: int) -> list[str]:
    lines = [
        f"| case | tokens | 1 process: cached / peak (MiB) | {processes} processes, largest rank: cached / peak "
        "(MiB) | ratio cached / peak | formula (1 process) |",
        "|---|---|---|---|---|---|",
    ]
    for name, one in alone.items():
        family, pe = name.split("/")
        cached, peak = (max(rank[name][key] for rank in ranks) for key in ("cached", "peak"))
        formula = formula_bytes(family, pe, one["tokens"], heads(family))
        lines.append(
            f"| {name} | {one['tokens']} | {mib(one['cached'])} / {mib(one['peak'])} | {mib(cached)} / {mib(peak)} "
            f"| {cached / one['cached']:.3f} / {peak / one['peak']:.3f} | {mib(formula)} "
            f"({'= measured' if formula == one['cached'] else 'differs'}) |"
        )
    lines += [
        "",
        f"| model, size | tokens | full table, cached (MiB) | per rank of {processes}, cached (MiB) | per rank, "
        "peak (MiB, measured bytes per token scaled) |",
        "|---|---|---|---|---|",
    ]
    for name, (family, tokens, model_heads) in LARGE.items():
        for pe in (pe for case_family, pe in CASES if case_family == family and f"{family}/{pe}" in alone):
            measured, share = alone[f"{family}/{pe}"], math.ceil(tokens / processes)
            per_token = max(rank[f"{family}/{pe}"]["peak"] for rank in ranks) / math.ceil(
                measured["tokens"] / processes
            )
            peak = mib(per_token * share * (model_heads / heads(family) if grows_with_heads(family, pe) else 1))
            lines.append(
                f"| {name}, {pe} | {tokens} | {mib(formula_bytes(family, pe, tokens, model_heads))} | "
                f"{mib(formula_bytes(family, pe, share, model_heads))} | {peak} |"
            )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2, help="context-parallel degree (torchrun processes)")
    parser.add_argument("--cases", nargs="+", metavar="CASE", help="only these: families or family/pe (e.g. qwen)")
    parser.add_argument("--out", type=Path, help="write the measurements as JSON")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        cases = selected(args.cases)
    except ValueError as error:
        parser.error(str(error))
    if args.worker is not None:
        worker(args.worker, cases)
        return 0
    if args.processes < 2:
        parser.error(f"--processes={args.processes}: expected at least 2 (the one-process run is always made)")
    torch.set_num_threads(1)
    alone = {f"{f}/{pe}": measure(f, pe, None) for f, pe in cases}
    ranks = run_ranks(args.processes, cases)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, fp32, CPU")
    print("\n".join(report(alone, ranks, args.processes)))
    if args.out is not None:
        from mmpos._atomic import written_atomically

        with written_atomically(args.out) as temporary:
            temporary.write_text(json.dumps({"one_process": alone, "ranks": ranks}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
