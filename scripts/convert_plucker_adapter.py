"""Convert a saved ``plucker`` camera adapter to another Plücker channel order, in place and atomically.

    python scripts/convert_plucker_adapter.py assets/world-video/camera-plucker   # (d, o x d) -> (o x d, d)

mmpos' Plücker rays follow CameraCtrl's ``ray_condition`` order ``(o x d, d)`` (``"moment_direction"``); adapters
trained on the former ``(d, o x d)`` order (``"direction_moment"``) give the same output after their input
weights (every ``*.proj.weight`` with 6 input channels) are permuted. The order is recorded in the safetensors
metadata (``plucker_order``); a file already in the target order is left alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mmpos._atomic import written_atomically
from mmpos.camera import PLUCKER_ORDERS, reorder_plucker_inputs

WEIGHTS = "diffusion_pytorch_model.safetensors"
ORDER_KEY = "plucker_order"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="convert_plucker_adapter", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help=f"a CameraAdapter folder (config.json, {WEIGHTS}) of kind plucker")
    p.add_argument(
        "--source",
        choices=PLUCKER_ORDERS,
        default="direction_moment",
        help="the order the adapter was trained on (when its file does not record one)",
    )
    p.add_argument("--target", choices=PLUCKER_ORDERS, default="moment_direction", help="the order to convert to")
    return p


def convert(path: Path, source: str, target: str) -> bool:
    """Rewrite the weights file ``path`` for rays in ``target`` order; ``False`` if it already was."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), "pt") as handle:
        metadata = dict(handle.metadata() or {})
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    source = metadata.get(ORDER_KEY, source)
    if source == target:
        return False
    projections = [
        key
        for key, value in tensors.items()
        if key.endswith("proj.weight") and value.dim() == 2 and value.shape[1] == 6
    ]
    if not projections:
        raise ValueError(f"{path} has no Plücker input weights (*.proj.weight [out, 6])")
    for key in projections:
        tensors[key] = reorder_plucker_inputs(tensors[key], source, target).contiguous()
    with written_atomically(path) as temporary:
        save_file(tensors, str(temporary), metadata={**metadata, ORDER_KEY: target})
    return True


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    path = folder / WEIGHTS
    if not path.is_file():
        parser.exit(2, f"{parser.prog}: error: folder: no {WEIGHTS} in {folder}\n")
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter

    kind = CameraAdapter.load_config(folder).get("kind")
    if kind != "plucker":
        parser.exit(2, f"{parser.prog}: error: folder: expected a plucker camera adapter, got kind={kind!r}\n")
    changed = convert(path, args.source, args.target)
    print(f"{path}: {'converted to' if changed else 'already in'} {args.target} order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
