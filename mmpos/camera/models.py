"""Camera models: ``project`` (camera-frame points -> pixels) and ``unproject`` (pixels -> unit rays).

Conventions (OpenCV axes, continuous pixel coordinates, never NaN): see :mod:`.base`.

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

CAMERA_MODELS = {
    "pinhole": Pinhole,
    "opencv": OpenCVCamera,
    "kannala_brandt": KannalaBrandt,
    "unified": UnifiedCamera,
    "equirectangular": Equirectangular,
}

__all__ = [
    "CAMERA_MODELS",
    "CameraModel",
    "Equirectangular",
    "KannalaBrandt",
    "OpenCVCamera",
    "Pinhole",
    "UnifiedCamera",
    "check_intrinsic_matrix",
    "normalized_intrinsics",
]
