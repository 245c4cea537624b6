"""Learned rotary variants benchmark: ComRoPE vs a dense per-token d x d formulation and plain axial RoPE;
HARoPE vs the plain rotary encoding it wraps.

All rows of one section and shape are timed in turns (``--repeats`` rounds, one call of each per round; median).
ComRoPE rows: one training step of the encoding (table from the learned parameters, rotation of q and k,
backward to q, k and the parameters), median over repeats; "no grad" rows: the forward without gradients
(tables cached, as in evaluation). The dense row is the formulation of the
reference code, written here: block exponentials scattered into a zero ``[B, L, H, d, d]`` matrix per token
and applied by a batched matrix product. HARoPE rows: the attention forward (encoding + SDPA) without
gradients (sampling) and a training step (encoding + SDPA, forward and backward); "layer" rows: a training step
of the whole layer from its input ``x [B, L, C]`` (fused qkv projection + encoding + SDPA), with HARoPE's map
applied to every token or folded into the qkv weights (the timm / DiT attention's choice once a call has at
least ``C`` tokens).

Memory: on CUDA, the peak of ``torch.cuda.max_memory_allocated`` above what was allocated before the step.
On the CPU (no allocator statistics), the bytes of the tensors autograd saves for backward, counted once per
storage, excluding q, k and the parameters: the activation memory a training step holds, the term the
dense formulation blows up. Both are reported on CUDA.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch
from timing import write_results  # beside this script
from torch.nn import functional as F

# name: (B, H, L, D, grid, num_prefix_tokens) per size preset
SHAPES = {
    "full": {"vit-b": (64, 12, 197, 64, (14, 14), 1), "flux": (1, 24, 4096, 128, (64, 64), 0)},
    "cpu": {"vit-b": (8, 12, 197, 64, (14, 14), 1), "flux": (1, 24, 1024, 128, (32, 32), 0)},
    "quick": {"vit-b": (2, 12, 197, 64, (14, 14), 1), "flux": (1, 24, 256, 128, (16, 16), 0)},
}
COMROPE = [("comrope_ap", 2), ("comrope_ap", 4), ("comrope_ld", 2), ("comrope_ld", 4)]
TARGETS = "ComRoPE: >= 10x less memory and >= 5x faster than dense, b=2 <= 1.5x plain axial; HARoPE <= 1.3x"


# ----- the dense per-token reference formulation (as in ComRoPE's released code) -----------------------------
def dense_comrope(pe, q: torch.Tensor, k: torch.Tensor, coords: torch.Tensor):
    """``R(x) = exp(sum_i x_i A_i)`` materialised as a ``[B, L, H, d, d]`` matrix per token (zeros with the
    block exponentials scattered into the block diagonal), applied to q and k by a batched matrix product."""
    b, h, length, d = q.shape
    n, size = length - coords.shape[-2], pe.block_size
    blocks = torch.linalg.matrix_exp(torch.einsum("la,hamij->lhmij", coords, pe.generators()).contiguous())
    mask = torch.block_diag(*[torch.ones(size, size, dtype=torch.bool, device=q.device)] * pe.num_blocks)
    per_sample = blocks.unsqueeze(0).expand(b, -1, -1, -1, -1, -1)  # (B, L, H, m, b, b), in mask order
    dense = q.new_zeros(b, coords.shape[0], h, d, d).masked_scatter(mask, per_sample)
    rotation = dense.transpose(1, 2)  # [B, H, L, d, d]
    rotate = lambda x: torch.cat([x[:, :, :n], (rotation @ x[:, :, n:, :, None]).squeeze(-1)], dim=2)
    return rotate(q), rotate(k)


# ----- measurement -----------------------------------------------------------------------------------------
class SavedBytes:
    """Context manager: bytes of tensors saved for backward, once per storage, minus ``exclude``'s storages."""

    def __init__(self, exclude=()):
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.exclude:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def memory_of(step, device, exclude=()) -> dict:
    """Memory of one call of ``step()`` (see the module docstring); also its warm-up."""
    with SavedBytes(exclude) as saved:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
        step()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else None
    return dict(saved_mb=saved.nbytes / 2**20, peak_mb=None if peak is None else peak / 2**20)


def measure_interleaved(steps: dict, device, repeats: int, clock: str = "wall") -> dict:
    """Median milliseconds of each ``steps[name]()``, timed in turns (one call of each per round, ``repeats``
    rounds), so that a slow spell of a shared machine hits every method alike. ``clock="cpu"`` times this
    thread's CPU time (one-thread CPU runs on a loaded machine), ``"wall"`` the wall clock."""
    now = CLOCKS[clock]
    samples = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = now()
            step()
            _sync(device)
            samples[name].append(now() - start)
    return {name: statistics.median(times) * 1e3 for name, times in samples.items()}


def training_step(encode, q, k, params):
    """Forward of ``encode(q, k)`` and backward of a fixed random projection of both outputs."""

    def step():
        for t in (q, k, *params):
            t.grad = None
        rq, rk = encode(q, k)
        torch.autograd.backward((rq, rk), (grad_q, grad_k))

    grad_q, grad_k = torch.randn_like(q), torch.randn_like(k)
    return step


# ----- sections --------------------------------------------------------------------------------------------
def make_inputs(shape_spec, device, dtype, requires_grad=True):
    b, h, length, d, grid, prefix = shape_spec
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(b, h, length, d, generator=gen).to(device, dtype).requires_grad_(requires_grad)
    k = torch.randn(b, h, length, d, generator=gen).to(device, dtype).requires_grad_(requires_grad)
    return q, k


def comrope_rows(shape_name, shape_spec, device, repeats, log, dense=True, clock="wall") -> list[dict]:
    import mmpos
    from mmpos.coords import grid_coords

    b, h, length, d, grid, prefix = shape_spec
    q, k = make_inputs(shape_spec, device, torch.float32)
    coords = grid_coords(grid, "normalized", device=device)
    steps, memory = {}, {}

    def add(method, pe, encode, inference=False):
        params = list(pe.parameters())
        if inference:  # no gradients: tables are cached, as in evaluation or sampling

            def step():
                with torch.no_grad():
                    encode(q, k)
        else:
            step = training_step(encode, q, k, params)
        steps[method] = step
        memory[method] = memory_of(step, device, exclude=[q, k, *params])

    axial = mmpos.create_pe("rope_axial", head_dim=d, num_prefix_tokens=prefix, allocation="interleaved").to(device)
    add("rope_axial (plain)", axial, lambda q, k: axial(q, k, coords))
    add("rope_axial (plain), no grad", axial, lambda q, k: axial(q, k, coords), inference=True)
    mixed = mmpos.create_pe("rope_mixed", head_dim=d, num_heads=h, num_prefix_tokens=prefix, seed=0).to(device)
    add("rope_mixed (learned frequencies)", mixed, lambda q, k: mixed(q, k, coords))
    for name, size in COMROPE:
        pe = mmpos.create_pe(name, head_dim=d, num_heads=h, block_size=size, num_prefix_tokens=prefix, seed=0).to(
            device
        )
        add(f"{name} b={size}", pe, lambda q, k, pe=pe: pe(q, k, coords))
        add(f"{name} b={size}, no grad", pe, lambda q, k, pe=pe: pe(q, k, coords), inference=True)
        if size == 4 and dense:
            add(f"{name} b={size} dense d x d", pe, lambda q, k, pe=pe: dense_comrope(pe, q, k, coords))
    times = measure_interleaved(steps, device, repeats, clock)
    rows = []
    for method, ms in times.items():
        rows.append(
            dict(section="comrope", shape=shape_name, dims=[b, h, length, d], method=method, ms=ms, **memory[method])
        )
        log(
            f"  {shape_name:6s} {method:34s} {ms:9.2f} ms  saved {memory[method]['saved_mb']:9.2f} MB"
            + ("" if memory[method]["peak_mb"] is None else f"  peak {memory[method]['peak_mb']:9.2f} MB")
        )
    return rows


def harope_rows(shape_name, shape_spec, device, repeats, log, clock="wall") -> list[dict]:
    import mmpos
    from mmpos.coords import flux_ids, grid_coords

    b, h, length, d, grid, prefix = shape_spec
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if shape_name == "flux":  # Flux's 3-axis layout: (index, row, col) ids
        base_options, coords = dict(axes_dims=(16, 56, 56)), flux_ids(*grid, device=device)
    else:
        base_options, coords = dict(num_prefix_tokens=prefix), grid_coords(grid, device=device)
    plain = mmpos.create_pe("rope_axial", head_dim=d, **base_options).to(device)
    harope = mmpos.create_pe("harope", head_dim=d, num_heads=h, base_options=base_options).to(device)
    with torch.no_grad():  # away from the identity
        for p in harope.parameters():
            p.normal_(std=0.02)
    q, k = make_inputs(shape_spec, device, dtype)
    v = torch.randn_like(q).requires_grad_(True)

    def attention(pe):
        return lambda q, k: (F.scaled_dot_product_attention(*pe(q, k, coords), v), v)

    def forward_step(pe):
        def step():
            pe.eval()
            with torch.no_grad():
                attention(pe)(q, k)

        return step

    def train_step(pe):
        inner = training_step(attention(pe), q, k, list(pe.parameters()) + [v])

        def step():
            pe.train()
            inner()

        return step

    steps, memory = {}, {}
    for mode, make in (("forward (no grad)", forward_step), ("train fwd+bwd", train_step)):
        for method, pe in (("plain rotary", plain), ("harope", harope)):
            name = f"{method}, {mode}"
            steps[name] = make(pe)
            memory[name] = memory_of(steps[name], device, exclude=[q, k, v, *pe.parameters()])
    for name, step, params in layer_steps(plain, harope, shape_spec, coords, device, dtype):
        steps[name] = step
        memory[name] = memory_of(step, device, exclude=params)
    rows = []
    for name, ms in measure_interleaved(steps, device, repeats, clock).items():
        rows.append(
            dict(
                section="harope",
                shape=shape_name,
                dims=[b, h, length, d],
                method=name,
                dtype=str(dtype).replace("torch.", ""),
                ms=ms,
                **memory[name],
            )
        )
        log(f"  {shape_name:6s} {name:36s} {ms:9.2f} ms")
    return rows


def layer_steps(plain, harope, shape_spec, coords, device, dtype):
    """Training steps of a whole attention layer, ``x [B, L, C] -> qkv projection -> encoding -> SDPA``: plain
    rotary, HARoPE with ``M`` applied to every token, and HARoPE with ``M`` folded into the qkv weights
    (:meth:`~mmpos.encodings.harope.HARoPE.fold_into_qkv`, what the timm and DiT attention do once a call has
    at least ``C`` tokens). Yields ``(name, step, tensors to exclude from the memory count)``."""
    b, h, length, d = shape_spec[:4]
    gen = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(b, length, h * d, generator=gen).to(device, dtype).requires_grad_(True)
    qkv = torch.nn.Linear(h * d, 3 * h * d).to(device, dtype)
    grad = torch.randn(b, h, length, d, generator=gen).to(device, dtype)  # of the SDPA output, [B, H, L, d]
    seq_dim = harope.seq_dim

    def split(projected):  # [B, L, 3 H d] -> q, k, v in the encoding's layout
        q, k, v = projected.unflatten(-1, (3, h, d)).unbind(-3)  # [B, L, H, d]
        return (q, k, v) if seq_dim == -3 else (t.transpose(1, 2) for t in (q, k, v))

    def layer(pe, fold):
        def forward(x):
            if fold:
                q, k, v = split(F.linear(x, *harope.fold_into_qkv(qkv.weight, qkv.bias)))
                q, k = harope.rotate_mapped_qk(q, k, harope.table(coords, q.dtype, q.device))
            else:
                q, k, v = split(qkv(x))
                q, k = pe(q, k, coords)
            return (
                F.scaled_dot_product_attention(q, k, v)
                if seq_dim == -2
                else F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            )

        return forward

    for name, pe, fold in (
        ("plain rotary", plain, False),
        ("harope, map per token", harope, False),
        ("harope, map folded into qkv", harope, True),
    ):
        params = [x, *qkv.parameters(), *pe.parameters()]

        def step(forward=layer(pe, fold), pe=pe, params=params):
            pe.train()
            for t in params:
                t.grad = None
            forward(x).backward(grad)

        yield f"{name}, layer train fwd+bwd", step, params


def add_ratios(rows: list[dict]) -> None:
    """Ratios against the peers measured in the same run."""
    by = {(r["section"], r["shape"], r["method"]): r for r in rows}
    for r in rows:
        if r["section"] == "comrope":
            no_grad = r["method"].endswith(", no grad")
            plain = by[("comrope", r["shape"], "rope_axial (plain)" + (", no grad" if no_grad else ""))]
            r["time_vs_plain_axial"] = r["ms"] / plain["ms"]
            dense = by.get(("comrope", r["shape"], r["method"].split(" b=")[0] + " b=4 dense d x d"))
            if dense is not None and "dense" not in r["method"] and not no_grad:
                r["dense_time_over_this"] = dense["ms"] / r["ms"]
                mem = "peak_mb" if r["peak_mb"] is not None else "saved_mb"
                r["dense_memory_over_this"] = dense[mem] / max(r[mem], 1e-9)
        else:
            peer = r["method"].replace("harope, map per token", "plain rotary")
            peer = peer.replace("harope, map folded into qkv", "plain rotary").replace("harope", "plain rotary")
            r["time_vs_plain"] = r["ms"] / by[("harope", r["shape"], peer)]["ms"]


def summary(rows: list[dict]) -> str:
    lines = [
        "| shape | method | ms | saved MB | peak MB | x plain | dense time / this | dense memory / this |",
        "|---|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v, spec: "-" if v is None else format(v, spec)
    for r in rows:
        lines.append(
            f"| {r['shape']} {'x'.join(map(str, r['dims']))} | {r['method']} | {r['ms']:.1f} | "
            f"{r['saved_mb']:.1f} | {fmt(r['peak_mb'], '.1f')} | "
            f"{fmt(r.get('time_vs_plain_axial', r.get('time_vs_plain')), '.2f')} | "
            f"{fmt(r.get('dense_time_over_this'), '.1f')} | {fmt(r.get('dense_memory_over_this'), '.1f')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench_variants", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument(
        "--size",
        choices=list(SHAPES),
        default=None,
        help="shape preset: full (ViT-B 64x12x197x64, Flux 1x24x4096x128; default on cuda), "
        "cpu (ViT-B batch 8, Flux 1024 tokens; default on cpu), quick (smallest)",
    )
    parser.add_argument("--quick", action="store_true", help="same as --size quick (2 repeats unless --repeats)")
    parser.add_argument("--shapes", nargs="+", default=["vit-b", "flux"], choices=["vit-b", "flux"])
    parser.add_argument("--sections", nargs="+", default=["comrope", "harope"], choices=["comrope", "harope"])
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats, median reported (default 5)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall (default) or cpu: this thread's CPU time, steadier for --threads 1 on a loaded CPU",
    )
    parser.add_argument("--no-dense", action="store_true", help="skip the dense d x d ComRoPE rows (the slowest)")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_variants.json"), help="JSON results file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but CUDA is not available")
    if args.clock == "cpu" and device.type == "cuda":
        parser.error("--clock cpu times the CPU thread; use wall on cuda")
    size = "quick" if args.quick else args.size or ("full" if device.type == "cuda" else "cpu")
    repeats = args.repeats or (2 if args.quick else 5)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, {device} ({name}), {torch.get_num_threads()} threads, size preset {size!r}")
    print(f"targets: {TARGETS}")
    rows = []
    for shape in args.shapes:
        spec = SHAPES[size][shape]
        if "comrope" in args.sections:
            rows += comrope_rows(shape, spec, device, repeats, print, dense=not args.no_dense, clock=args.clock)
        if "harope" in args.sections:
            rows += harope_rows(shape, spec, device, repeats, print, clock=args.clock)
    add_ratios(rows)
    print(summary(rows))
    meta = dict(
        torch=torch.__version__,
        device=str(device),
        device_name=name,
        size=size,
        repeats=repeats,
        clock=args.clock,
        threads=torch.get_num_threads(),
        memory="cuda peak above baseline" if device.type == "cuda" else "bytes saved for backward (CPU)",
    )
    write_results(args.out, meta, results=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
