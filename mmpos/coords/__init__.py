"""Coordinates: which position each token gets. Pure functions, float tensors ``[L, A]``."""
from .grids import MODES, axis_positions, flux_ids, grid_coords, image_grid, positions_1d, video_grid

__all__ = ["MODES", "axis_positions", "flux_ids", "grid_coords", "image_grid", "positions_1d", "video_grid"]
from .perturb import perturb_grid_coords
__all__ += ["perturb_grid_coords"]
