"""Where a converted timm ViT's tokens sit: one :class:`TokenPositions` per model, filled each forward.

Hooks set it, attention blocks read it:

* the patch embedding reports the patch grid (static size, ``dynamic_img_size`` or NaFlex ``patch_coord``);
* PatchDropout reports which patch tokens each sample kept;
* every converted attention block asks for the coordinates of its patch tokens (prefix tokens, i.e.
  cls and registers, get none and stay unrotated).

The coordinates tensor is built once per forward and returned as the same object to every block, so
encodings' table caches hit by identity.
"""
from __future__ import annotations

import torch
from timm.layers import PatchDropout
from timm.layers.patch_dropout import PatchDropoutWithIndices, patch_dropout_forward
from torch import nn

from ..._validation import check_choice
from ...coords.grids import MODES, image_grid
from ...ops.tables import KeyedCache


class TokenPositions:
    """(row, col) coordinates of the patch tokens of the current forward.

    Args:
        num_prefix_tokens: leading tokens without coordinates (cls, registers).
        grid_mode, grid_scale: how patch indices become coordinates (see :func:`mmpos.coords.image_grid`):
            ``"index"`` (0 .. n-1, rope-vit and timm), ``"centered"`` or ``"normalized"`` ((i + .5) / n).
        grid_indexing: ``"ij"`` gives (row, col) coordinates, ``"xy"`` gives (col, row) (timm's option of the
            same name: which axis the encoding's first channels read).
    """

    def __init__(self, num_prefix_tokens: int, grid_mode: str = "index", grid_scale: float = 1.0,
                 grid_indexing: str = "ij"):
        check_choice("grid_mode", grid_mode, MODES)
        check_choice("grid_indexing", grid_indexing, ("ij", "xy"))
        self.num_prefix_tokens, self.grid_mode, self.grid_scale = num_prefix_tokens, grid_mode, grid_scale
        self.grid_indexing = grid_indexing
        # coordinates of recent grids, reused across forwards: table caches then hit by identity (no value
        # comparison, so no device sync per step)
        self._grid_cache = KeyedCache(max_entries=4)
        self.start()

    def start(self, grid: tuple[int, int] | None = None, patch_coord: torch.Tensor | None = None) -> None:
        """A new forward: tokens on a ``grid`` (row-major) or at per-sample ``patch_coord`` ``[B, N, 2]``."""
        self.grid = None if grid is None else (int(grid[0]), int(grid[1]))
        self.patch_coord = patch_coord
        self.keep_indices = None
        self._coords = None

    def keep(self, keep_indices: torch.Tensor | None) -> None:
        """PatchDropout kept patch tokens ``keep_indices`` ``[B, K]`` (indices among patch tokens)."""
        self.keep_indices = keep_indices
        self._coords = None

    def coords(self, num_tokens: int, device: torch.device) -> torch.Tensor:
        """``[L, 2]`` (or ``[B, L, 2]`` after PatchDropout / in NaFlex mode) float32 coordinates of the
        ``L = num_tokens - num_prefix_tokens`` patch tokens."""
        if self._coords is None or self._coords.device != torch.device(device):
            self._coords = self._build(device)
        expected = num_tokens - self.num_prefix_tokens
        if self._coords.shape[-2] != expected:
            where = f"a {self.grid[0]}x{self.grid[1]} patch grid" if self.grid else "patch_coord"
            raise ValueError(f"{where} gives {self._coords.shape[-2]} patch tokens but attention sees {num_tokens} "
                             f"tokens with {self.num_prefix_tokens} prefix token(s), i.e. {expected}")
        return self._coords

    def _grid_coords(self, device) -> torch.Tensor:
        key = (self.grid, torch.device(device), self.grid_mode, self.grid_scale, self.grid_indexing,
               torch.is_inference_mode_enabled())

        def build():
            coords = image_grid(*self.grid, mode=self.grid_mode, scale=self.grid_scale, device=device)
            return coords.flip(-1) if self.grid_indexing == "xy" else coords

        return self._grid_cache.get(key, build)

    def _build(self, device) -> torch.Tensor:
        if self.patch_coord is not None:
            coords = self.patch_coord.to(device, torch.float32) * self.grid_scale
        elif self.grid is not None:
            coords = self._grid_coords(device)
        else:
            raise RuntimeError("no patch grid was recorded for this forward: the converted model's patch "
                               "embedding did not run (call the model, forward_features or forward_intermediates)")
        if self.grid_indexing == "xy" and self.patch_coord is not None:
            coords = coords.flip(-1)
        if self.keep_indices is not None:
            keep = self.keep_indices.to(device)
            if coords.dim() == 2:
                coords = coords[keep]  # [B, K, 2]
            else:
                coords = coords.gather(1, keep.unsqueeze(-1).expand(-1, -1, coords.shape[-1]))
        return coords


class PatchGridHook:
    """Forward hook for a timm ``PatchEmbed``: record the grid of the image it just embedded.

    Hooks are small objects, not closures, so ``copy.deepcopy(model)`` (EMA) rewires them to the copy's
    ``TokenPositions``.
    """

    def __init__(self, positions: TokenPositions):
        self.positions = positions

    def __call__(self, module, args, output):
        if output.dim() == 4:  # NHWC: dynamic_img_size
            grid = output.shape[1:3]
        elif hasattr(module, "dynamic_feat_size"):
            grid = module.dynamic_feat_size(tuple(args[0].shape[-2:]))
        else:
            grid = module.grid_size
        self.positions.start(grid=grid)


class NaFlexEmbedsHook(PatchGridHook):
    """Forward hook (with kwargs) for NaFlexVit's ``embeds``: the grid, or per-token ``patch_coord``."""

    def __call__(self, module, args, kwargs, output):
        patch_coord = kwargs.get("patch_coord", args[1] if len(args) > 1 else None)
        if patch_coord is not None:
            self.positions.start(patch_coord=patch_coord)
        else:
            self.positions.start(grid=output[1])


class RecordingPatchDropout(nn.Module):
    """timm PatchDropout that also tells ``positions`` which patch tokens it kept (same randomness,
    same output type as the module it replaces)."""

    def __init__(self, original: nn.Module, positions: TokenPositions):
        super().__init__()
        if not isinstance(original, (PatchDropout, PatchDropoutWithIndices)):
            raise TypeError(f"cannot track keep indices of {type(original).__name__}; expected timm PatchDropout")
        self.prob, self.num_prefix_tokens, self.ordered = original.prob, original.num_prefix_tokens, original.ordered
        self.returns_indices = isinstance(original, PatchDropoutWithIndices)
        self.positions = positions

    def forward(self, x):
        out, keep = patch_dropout_forward(x, self.prob, self.num_prefix_tokens, self.ordered, self.training)
        self.positions.keep(keep)
        return (out, keep) if self.returns_indices else out

    def extra_repr(self):
        return f"prob={self.prob}, num_prefix_tokens={self.num_prefix_tokens}, returns_indices={self.returns_indices}"
