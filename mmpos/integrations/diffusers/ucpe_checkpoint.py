"""Convert UCPE's released Wan2.1 adapter checkpoints into a ``ucpe`` :class:`~.camera_adapter.CameraAdapter`.

The reference (UCPE, ``src/camera_control.py``) adds a module ``cam_self_attn`` to every DiT block of DiffSynth's
Wan model, so its trainable keys are (any prefix, e.g. ``dit.`` or ``model.dit.``)::

    blocks.{i}.cam_self_attn.{q_proj,k_proj,v_proj}.{weight,bias}    [attn_dim, dim], [attn_dim]
    blocks.{i}.cam_self_attn.out_proj.{weight,bias}                  [dim, attn_dim], [dim]
    blocks.{i}.cam_self_attn.cam_encoder.{weight,bias}               [dim, 3], [dim]  (relray_absmap only)

with ``attn_dim = dim // attn_compress`` split into ``num_heads // attn_compress`` heads (Wan2.1-1.3B, compress 8:
one head of 192). The mmpos adapter has the same projections under ``layers.{i}.{to_q,to_k,to_v,out_proj,
cam_encoder}``; the attention in between is the same formula (UCPE's relative ray encoding with the references'
sign, ``docs/cameras.md``). The head count is not in the weights: pass it (``num_heads``). The reference casts
rays through integer patch indices with the principal point at the grid centre (its half-cell offset): the
converted adapter's ``ray_offset`` is ``(0, 0)``, which the pipelines pass to :func:`mmpos.camera.video.video_cameras`.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from .camera_adapter import CameraAdapter

KEY = re.compile(r"(?:^|\.)blocks\.(\d+)\.cam_self_attn\.(q_proj|k_proj|v_proj|out_proj|cam_encoder)\.(weight|bias)$")
NAMES = {"q_proj": "to_q", "k_proj": "to_k", "v_proj": "to_v", "out_proj": "out_proj", "cam_encoder": "cam_encoder"}


def convert_ucpe_state_dict(state_dict: dict, num_heads: int = 1) -> tuple[dict, dict]:
    """``(config, state_dict)`` of the mmpos ``ucpe`` adapter from the reference's keys (others are ignored:
    a full DiT checkpoint may be passed). Raises ``ValueError`` naming what does not fit."""
    converted, layers = {}, set()
    for key, value in state_dict.items():
        match = KEY.search(key)
        if match:
            layer, name, kind = match.groups()
            layers.add(int(layer))
            converted[f"layers.{layer}.{NAMES[name]}.{kind}"] = value
    if not converted:
        raise ValueError("state_dict has no UCPE adapter keys (blocks.{i}.cam_self_attn.q_proj.weight, ...)")
    num_layers = max(layers) + 1
    if layers != set(range(num_layers)):
        raise ValueError(f"UCPE adapter keys cover blocks {sorted(layers)}; expected every block 0..{num_layers - 1}")
    attn_dim, dim = converted["layers.0.to_q.weight"].shape
    if attn_dim % num_heads or (attn_dim // num_heads) % 8:
        raise ValueError(
            f"num_heads={num_heads} does not split attn_dim={attn_dim} into heads of a multiple of 8 channels"
        )
    encoder = converted.get("layers.0.cam_encoder.weight")
    if encoder is not None and encoder.shape[1] != 3:
        raise ValueError(
            f"cam_encoder takes {encoder.shape[1]} inputs: only UCPE's relray_absmap (3: the "
            "latitude/up map) converts; absc2w/absray (12) are not supported"
        )
    config = dict(
        kind="ucpe",
        dim=int(dim),
        num_layers=num_layers,
        num_heads=int(num_heads),
        head_dim=int(attn_dim // num_heads),
        use_orientation=encoder is not None,
        qkv_bias=True,
        ray_offset=(0.0, 0.0),
    )  # the reference's rays start at integer patch indices
    return config, converted


def load_ucpe_checkpoint(path, num_heads: int = 1, dtype: torch.dtype | None = None) -> CameraAdapter:
    """A :class:`CameraAdapter` from a reference checkpoint (``.safetensors``, or a torch/Lightning ``.ckpt``/``.pt``
    with the weights at the top level or under ``state_dict``), in ``dtype`` (default: the checkpoint's)."""
    from mmpos._safe_state import load_torch_file, read_tensors

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not a checkpoint file (missing, or a folder)")
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads!r}")
    # a truncated, foreign or pickled file: UnsafeStateError (a ValueError) naming it
    state_dict = read_tensors(path) if path.suffix == ".safetensors" else load_torch_file(path)
    if isinstance(state_dict, dict) and isinstance(state_dict.get("state_dict"), dict):
        state_dict = state_dict["state_dict"]
    if not isinstance(state_dict, dict) or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        raise ValueError(
            f"{path}: expected a dict of tensors (at the top level or under 'state_dict'), got "
            f"{type(state_dict).__name__}"
        )
    try:
        config, converted = convert_ucpe_state_dict(state_dict, num_heads)
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    adapter = CameraAdapter(**config)
    dtype = dtype or converted["layers.0.to_q.weight"].dtype
    if dtype != adapter.dtype:
        adapter = adapter.to(dtype=dtype)
    try:
        adapter.load_state_dict(converted, strict=True)
    except RuntimeError as error:  # missing projections or shapes that disagree between layers
        raise ValueError(
            f"{path}: the UCPE adapter weights do not fit one adapter ({' '.join(str(error).split())[:300]})"
        ) from None
    return adapter
