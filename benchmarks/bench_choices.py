"""The numbers behind two implementation choices of the learned encodings (docs/results.md, "Numbers behind
implementation choices"), each against its alternative in the same run:

- LieRE's dense form (``block_size = head_dim``): one ``torch.linalg.matrix_exp`` of a ``d x d`` skew matrix per
  token and head, against the closed form of the default 4 x 4 blocks (:func:`mmpos.ops.skew.exp_skew`);
- HARoPE's factors: the backward of the batched Taylor exponential (:func:`mmpos.ops.taylor_exp.taylor_matrix_exp`)
  against its forward, and against ``torch.linalg.matrix_exp``'s.

    python benchmarks/bench_choices.py --threads 1 [--out outputs/bench_choices.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_seconds  # noqa: E402

from mmpos._atomic import written_atomically  # noqa: E402
from mmpos.ops.skew import exp_skew, num_upper, skew_from_upper  # noqa: E402
from mmpos.ops.taylor_exp import taylor_matrix_exp  # noqa: E402


def skew(count: int, size: int, seed: int = 0) -> torch.Tensor:
    """``[count, size, size]`` fp32 skew-symmetric matrices of entries ~ N(0, 0.02^2)."""
    a = torch.randn(count, size, size, generator=torch.Generator().manual_seed(seed)) * 0.02
    return a - a.transpose(-1, -2)


def liere_dense_vs_blocks(head_dim: int, tokens: int, repeats: int) -> dict:
    """Milliseconds per token and head: a dense ``head_dim x head_dim`` exponential vs ``head_dim / 4`` blocks."""
    dense, blocks = skew(tokens, head_dim), skew(tokens * head_dim // 4, 4)
    dense_s = median_seconds(lambda: torch.linalg.matrix_exp(dense), "cpu", repeats) / tokens
    blocks_s = median_seconds(lambda: exp_skew(blocks), "cpu", repeats) / tokens
    return dict(dense_ms=dense_s * 1e3, blocks_ms=blocks_s * 1e3, dense_over_blocks=dense_s / blocks_s)


def harope_factor_backward(heads: int, head_dim: int, repeats: int) -> dict:
    """Forward and forward + backward of HARoPE's ``(U, V)`` (one batched exponential), Taylor vs matrix_exp."""
    upper = torch.randn(2, heads, num_upper(head_dim), generator=torch.Generator().manual_seed(1)) * 0.02

    def step(exp, grad: bool) -> None:
        u = upper.clone().requires_grad_(grad)
        out = exp(skew_from_upper(u, head_dim))
        if grad:
            out.square().sum().backward()

    result = {}
    for name, exp in (("taylor", taylor_matrix_exp), ("matrix_exp", torch.linalg.matrix_exp)):
        forward = median_seconds(lambda: step(exp, False), "cpu", repeats)
        both = median_seconds(lambda: step(exp, True), "cpu", repeats)
        result[name] = dict(forward_ms=forward * 1e3, backward_ms=(both - forward) * 1e3)
        result[name]["backward_over_forward"] = (both - forward) / forward
    return result


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=64, help="LieRE: matrices per timed call")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON (atomically)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = dict(
        liere=liere_dense_vs_blocks(args.head_dim, args.tokens, args.repeats),
        harope=harope_factor_backward(args.heads, args.head_dim, args.repeats),
        threads=args.threads,
        torch=torch.__version__,
    )
    liere, harope = results["liere"], results["harope"]
    print(
        f"LieRE d={args.head_dim}: dense matrix_exp {liere['dense_ms']:.3f} ms per token and head, "
        f"4x4 blocks {liere['blocks_ms']:.3f} ms ({liere['dense_over_blocks']:.0f}x)"
    )
    for name, row in harope.items():
        print(
            f"HARoPE factors ({args.heads} heads, d={args.head_dim}), {name}: forward {row['forward_ms']:.2f} ms, "
            f"backward {row['backward_ms']:.2f} ms ({row['backward_over_forward']:.1f}x the forward)"
        )
    if args.out is not None:
        with written_atomically(args.out) as temporary:
            temporary.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
