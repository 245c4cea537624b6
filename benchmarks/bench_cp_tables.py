"""Rotary-table memory per rank under diffusers' context parallelism: 1 process against N processes (torchrun, gloo).

Per case (Wan with Wan2.1-1.3B's attention: 12 heads x 128; Flux with FLUX.1's head_dim 128 and axes (16, 56, 56),
2 heads: only ``rope_mixed``'s tables grow with the heads), one forward of a one-block model with ``set_pe``, in
one process and on every rank of ``--processes`` processes under ``enable_parallelism`` (Ulysses). Measured on the
position module's first call (its table builds), counting every tensor storage an op creates there
(``torch.utils._python_dispatch.TorchDispatchMode``; a storage counts until it is freed):

- ``cached``: bytes still alive after the forward, its outputs dropped (the tables and coordinates the seam and
  its encodings keep for the next step);
- ``peak``: the most bytes alive at once during the call.

Then the same for Wan 720p / 81 frames (21 x 45 x 80 = 75600 tokens; 1.3B: 12 heads, 14B: 40) and FLUX.1 at
4096 px (256 x 256 + 512 text = 66048 tokens, 24 heads), computed from the shapes (``formula``: the tables,
coordinates and copies each cache keeps; checked against the measured ``cached`` bytes at the run's size) and,
for the peak, the measured peak bytes per token scaled to the token count.

    OMP_NUM_THREADS=1 python benchmarks/bench_cp_tables.py                 # 1 vs 2 CPU processes
    OMP_NUM_THREADS=1 python benchmarks/bench_cp_tables.py --processes 4 --out cp_tables.json

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
CASES = [(family, pe) for family in ("wan", "flux") for pe in ("native", "rope_axial", "rope_mixed")]
WAN_LATENTS = (4, 32, 32)  # frames, height, width: grid 4 x 16 x 16 = 1024 tokens
FLUX_GRID = (32, 32, 64)  # image rows, cols, text: 1088 tokens
LARGE = {  # name: (family, tokens, heads)
    "Wan 1.3B 720p/81f": ("wan", 21 * 45 * 80, 12),
    "Wan 14B 720p/81f": ("wan", 21 * 45 * 80, 40),
    "FLUX.1 4096px": ("flux", 256 * 256 + 512, 24),
}
HEAD_DIM = 128


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
    ``cos`` and ``sin`` ``[L, head_dim]``."""
    pairs, coords = HEAD_DIM // 2, 3 * 4
    if pe == "native":
        return tokens * (coords + pairs * 16 + 2 * HEAD_DIM * 4)
    groups = heads if pe == "rope_mixed" else 1
    grid = coords if family == "wan" else 0
    frequencies = heads * 3 * pairs * 4 if pe == "rope_mixed" else 0
    return tokens * (coords + grid + groups * pairs * 8) + frequencies


def model_and_inputs(family: str, pe: str):
    """A one-block model with ``set_pe``, its forward's inputs and its token count."""
    from diffusers import FluxTransformer2DModel, WanTransformer3DModel

    from mmpos.coords.grids import flux_ids
    from mmpos.integrations.diffusers import set_pe

    torch.manual_seed(0)
    if family == "wan":
        model = WanTransformer3DModel(**WAN_CONFIG).eval()
        frames, height, width = WAN_LATENTS
        inputs = dict(
            hidden_states=torch.randn(1, 4, frames, height, width),
            encoder_hidden_states=torch.randn(1, 8, WAN_CONFIG["text_dim"]),
            timestep=torch.tensor([500]),
        )
        tokens = frames * height * width // 4
    else:
        model = FluxTransformer2DModel(**FLUX_CONFIG).eval()
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
        tokens = rows * cols + text
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


def worker(out: Path) -> None:
    """One rank: every case under Ulysses (degree = the processes); writes ``rank{R}.json``."""
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    torch.set_num_threads(1)
    dist.init_process_group("cpu:gloo")
    torch.accelerator.device_count = lambda: 1  # the diffusers CPU limitation (module docstring)
    degree = dist.get_world_size()
    results = {f"{f}/{pe}": measure(f, pe, ContextParallelConfig(ulysses_degree=degree)) for f, pe in CASES}
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def run_ranks(processes: int) -> list[dict]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
        command += ["--master_port", str(port), __file__, "--worker", folder]
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True)
        return [json.loads((Path(folder) / f"rank{r}.json").read_text()) for r in range(processes)]


def mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def report(alone: dict, ranks: list[dict], processes: int) -> list[str]:
    heads = {"wan": WAN_CONFIG["num_attention_heads"], "flux": FLUX_CONFIG["num_attention_heads"]}
    lines = [
        f"| case | tokens | 1 process: cached / peak (MiB) | {processes} processes, largest rank: cached / peak "
        "(MiB) | ratio cached / peak | formula (1 process) |",
        "|---|---|---|---|---|---|",
    ]
    for name, one in alone.items():
        family, pe = name.split("/")
        cached, peak = (max(rank[name][key] for rank in ranks) for key in ("cached", "peak"))
        formula = formula_bytes(family, pe, one["tokens"], heads[family])
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
        for pe in ("native", "rope_axial", "rope_mixed"):
            measured, share = alone[f"{family}/{pe}"], math.ceil(tokens / processes)
            per_token = max(rank[f"{family}/{pe}"]["peak"] for rank in ranks) / math.ceil(
                measured["tokens"] / processes
            )
            peak = mib(per_token * share * (model_heads / heads[family] if pe == "rope_mixed" else 1))
            lines.append(
                f"| {name}, {pe} | {tokens} | {mib(formula_bytes(family, pe, tokens, model_heads))} | "
                f"{mib(formula_bytes(family, pe, share, model_heads))} | {peak} |"
            )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2, help="context-parallel degree (torchrun processes)")
    parser.add_argument("--out", type=Path, help="write the measurements as JSON")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker(args.worker)
        return 0
    if args.processes < 2:
        parser.error(f"--processes={args.processes}: expected at least 2 (the one-process run is always made)")
    torch.set_num_threads(1)
    alone = {f"{f}/{pe}": measure(f, pe, None) for f, pe in CASES}
    ranks = run_ranks(args.processes)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, fp32, CPU")
    print("\n".join(report(alone, ranks, args.processes)))
    if args.out is not None:
        from mmpos._atomic import written_atomically

        with written_atomically(args.out) as temporary:
            temporary.write_text(json.dumps({"one_process": alone, "ranks": ranks}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
