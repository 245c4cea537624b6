"""Convert a UCPE Wan2.1 adapter checkpoint (their `cam_self_attn` keys) into an mmpos camera adapter folder.

    python scripts/convert_ucpe_checkpoint.py ucpe_wan1.3b.ckpt adapters/ucpe-wan1.3b --num-heads 1
    mmpos generate video --model Wan-AI/Wan2.1-T2V-1.3B-Diffusers --adapter adapters/ucpe-wan1.3b ...

Wan2.1-1.3B with UCPE's default attn_compress 8 has 12 // 8 = 1 adapter head (pass --num-heads for others).
"""

import sys
from pathlib import Path

import torch

from mmpos._arguments import OneLineErrorParser, positive_int_arg
from mmpos.integrations.diffusers.ucpe_checkpoint import load_ucpe_checkpoint


def main(argv=None) -> int:
    parser = OneLineErrorParser(prog="convert_ucpe_checkpoint", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="UCPE checkpoint (.safetensors, .ckpt or .pt)")
    parser.add_argument("out", help="new folder for the mmpos adapter (save_pretrained)")
    parser.add_argument("--num-heads", type=positive_int_arg, default=1, help="adapter heads (default: 1, Wan2.1-1.3B)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), help="default: the checkpoint's")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if out.exists():
        parser.exit(2, f"{parser.prog}: error: OUT {out}: exists; choose a new folder\n")
    dtype = getattr(torch, args.dtype) if args.dtype else None
    try:
        adapter = load_ucpe_checkpoint(args.checkpoint, args.num_heads, dtype)
    except (OSError, ValueError) as error:  # missing, unreadable or not a UCPE checkpoint (UnsafeStateError)
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    temporary = out.with_name(f".{out.name}.partial")
    adapter.save_pretrained(temporary)
    temporary.rename(out)
    print(f"wrote {out}: { {k: v for k, v in adapter.config.items() if not k.startswith('_')} }")
    return 0


if __name__ == "__main__":
    sys.exit(main())
