"""Operators applied to q and k: rotation tables and the rotary operator."""

from .backends import ROTARY_BACKENDS, get_rotary_backend, rotary_backend, set_rotary_backend
from .rotation import LAYOUTS, compute_dtype, rotate
from .tables import (
    RotaryTable,
    TableCache,
    axial_phases,
    check_coords,
    device_has_fp64,
    phases_fp32_reduced,
    table_from_phases,
)

__all__ = [
    "LAYOUTS",
    "compute_dtype",
    "rotate",
    "RotaryTable",
    "TableCache",
    "axial_phases",
    "check_coords",
    "device_has_fp64",
    "phases_fp32_reduced",
    "table_from_phases",
    "ROTARY_BACKENDS",
    "get_rotary_backend",
    "rotary_backend",
    "set_rotary_backend",
]
from .block_rotation import BlockRotationTable, apply_block_rotation

__all__ += ["BlockRotationTable", "apply_block_rotation"]
