"""Camera models: ``project`` (camera-frame points -> pixels) and ``unproject`` (pixels -> unit rays).

Conventions (one for the whole package):

- Camera axes are OpenCV's: x right, y down, z forward (the optical axis).
- Pixel coordinates are continuous: pixel ``(row i, col j)`` covers ``[j, j+1) x [i, i+1)`` and its centre is
  ``(u, v) = (j + 0.5, i + 0.5)``. The image spans ``[0, W] x [0, H]``, so ``cx = W / 2`` is the exact
  centre and intrinsics follow resizing by plain scaling (no half-pixel terms).
- Nothing returns NaN: every call returns ``(values, valid)``, where ``valid`` is a bool mask and invalid
  entries hold finite placeholders (the optical axis for rays, the principal point for pixels).
- Arithmetic runs in the input's dtype (float32 or float64; 16-bit is refused) with autocast off.

One module per family: :mod:`.base` (the interface, conventions), :mod:`.intrinsics` (focal lengths and
principal point, ``K`` matrices), :mod:`.perspective`, :mod:`.fisheye`, :mod:`.panorama`.

Models: :class:`Pinhole`, :class:`OpenCVCamera` (radial-tangential), :class:`KannalaBrandt` (fisheye),
:class:`UnifiedCamera` (xi: pinhole at 0 through beyond-180-degree fisheye above 1),
:class:`Equirectangular` (full 360 x 180 panorama).
"""
from .base import CameraModel
from .fisheye import KannalaBrandt, UnifiedCamera
from .intrinsics import check_intrinsic_matrix, normalized_intrinsics
from .panorama import Equirectangular
from .perspective import OpenCVCamera, Pinhole

CAMERA_MODELS = {"pinhole": Pinhole, "opencv": OpenCVCamera, "kannala_brandt": KannalaBrandt,
                 "unified": UnifiedCamera, "equirectangular": Equirectangular}

__all__ = ["CAMERA_MODELS", "CameraModel", "Equirectangular", "KannalaBrandt", "OpenCVCamera", "Pinhole",
           "UnifiedCamera", "check_intrinsic_matrix", "normalized_intrinsics"]
