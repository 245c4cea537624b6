"""Coordinates: which position each token gets. Pure functions, float tensors ``[L, A]``."""
from .grids import MODES, axis_positions, flux_ids, grid_coords, image_grid, positions_1d, video_grid

__all__ = ["MODES", "axis_positions", "flux_ids", "grid_coords", "image_grid", "positions_1d", "video_grid"]
from .perturb import perturb_grid_coords
__all__ += ["perturb_grid_coords"]
from .canvas import CANVAS_LAYOUTS, Box, CanvasLayout, corner_centered_layout, side_by_side_layout
from .edits import box_map, mask_bbox, shrink_ids, transplant_ids
__all__ += ["CANVAS_LAYOUTS", "Box", "CanvasLayout", "corner_centered_layout", "side_by_side_layout", "box_map",
            "mask_bbox", "shrink_ids", "transplant_ids"]
