"""Coordinates: which position each token gets. Pure functions, float tensors ``[L, A]``."""

from .canvas import CANVAS_LAYOUTS, Box, CanvasLayout, corner_centered_layout, side_by_side_layout
from .edits import box_map, mask_bbox, shrink_ids, transplant_ids
from .grids import MODES, axis_positions, flux_ids, grid_coords, image_grid, positions_1d, video_grid
from .perturb import perturb_grid_coords
from .phase_aligned import MixedGrid, mixed_resolution_grid, phase_aligned_positions

__all__ = [
    "MODES",
    "axis_positions",
    "flux_ids",
    "grid_coords",
    "image_grid",
    "positions_1d",
    "video_grid",
    "perturb_grid_coords",
    "MixedGrid",
    "mixed_resolution_grid",
    "phase_aligned_positions",
    "CANVAS_LAYOUTS",
    "Box",
    "CanvasLayout",
    "corner_centered_layout",
    "side_by_side_layout",
    "box_map",
    "mask_bbox",
    "shrink_ids",
    "transplant_ids",
]
