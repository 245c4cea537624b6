"""``mmpos list``: the registered encodings, their kind and one-line description (``-v``: their options).

The names, kinds and descriptions are written out in :data:`ENCODINGS` so that ``mmpos list`` imports no torch
(0.3 s instead of the registry's 2-3 s); a test keeps them equal to the registry
(``mmpos.encodings.list_pes``). ``-v`` reads each encoding's options from the registry itself.
"""

from __future__ import annotations

# (name, kind, description) of every registered encoding, sorted by name, as the registry gives them.
ENCODINGS = (
    ("ape_learned", "absolute", "Learned absolute embedding on a fixed patch grid, resampled to other grids."),
    ("ape_sincos", "absolute", "Fixed sin-cos absolute embedding in 1D, 2D or 3D (Transformer, MAE, DiT)."),
    (
        "comrope_ap",
        "rotary",
        "ComRoPE-AP: each block of a head rotates with one axis by a learned commuting generator.",
    ),
    (
        "comrope_ld",
        "rotary",
        "ComRoPE-LD: each block rotates by a learned mix of the axes through commuting generators.",
    ),
    ("harope", "rotary", "HARoPE: a learned per-head map M on q and M^-T on k around any rotary encoding."),
    ("liere", "rotary", "LieRE: learned non-commuting rotations exp(sum_i x_i A_i), a baseline that is not relative."),
    (
        "mhrope",
        "rotary",
        "MHRoPE: whole KV heads per axis, each with the full spectrum; heads past the section are NoPE.",
    ),
    ("mrope", "rotary", "MRoPE (Qwen2-VL): t, h and w read contiguous sections of one frequency ladder."),
    ("mrope_interleave", "rotary", "MRoPE-I (Qwen3-VL, Qwen3.5): t, h and w interleaved over one frequency ladder."),
    ("nope", "none", "No positional encoding: q and k are returned unchanged."),
    (
        "plucker",
        "camera",
        "Plücker coordinates of each token's camera ray, embedded and added to the tokens (CameraCtrl).",
    ),
    ("prope", "camera", "PRoPE: projective camera frames on q, k, v and the output, 2D RoPE on the rest of each head."),
    (
        "rayrope",
        "camera",
        "RayRoPE: rays at predicted depth in each query camera's frame, rotated in expectation over depth.",
    ),
    ("rope_1d", "rotary", "1D RoPE over sequence positions (transformers' rotate-half layout by default)."),
    ("rope_axial", "rotary", "Axial RoPE in 2D, 3D or N-D: each channel pair rotates with one axis at one frequency."),
    ("rope_mixed", "rotary", "RoPE-Mixed: learned per-head 2D frequency directions (RoPE-ViT)."),
    ("ucpe", "camera", "UCPE: relative ray frames from any camera model on q, k, v and the output, plus 2D RoPE."),
    ("vrope", "rotary", "VRoPE (video LLMs): channel pair f reads diagonal variant f mod 4 of the token's ids."),
)


def register(subparsers) -> None:
    lister = subparsers.add_parser("list", help="list registered encodings", description="List registered encodings.")
    lister.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also list each encoding's options (imports torch; default: names and one-line descriptions only)",
    )
    lister.set_defaults(func=run)


def run(args) -> int:
    width = max(len(name) for name, _, _ in ENCODINGS)
    options = _options_by_name() if args.verbose else {}
    for name, kind, description in ENCODINGS:
        print(f"{name:{width}s}  [{kind}] {description}")
        for line in options.get(name, ()):
            print(f"    {line}")
    return 0


def _options_by_name() -> dict[str, list[str]]:
    """Encoding name -> ``"option = default"`` lines (``"option (required)"``), from the registry (imports torch)."""
    import inspect

    from mmpos.encodings import list_pes, pe_options

    def shown(default) -> str:
        return "(required)" if default is inspect.Parameter.empty else f"= {default!r}"

    return {name: [f"{o} {shown(d)}" for o, d in pe_options(name).items()] for name in list_pes()}
