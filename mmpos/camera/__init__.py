"""Cameras: the :class:`Cameras` value every camera encoding's ``prepare`` takes, models (project/unproject with validity masks), poses (OpenCV axes), patch rays, ray frames,
the latitude/up map, and trajectories (RealEstate10K text, JSON, presets)."""
from .cameras import Cameras
from .frusta import frustum_lines
from .models import (CAMERA_MODELS, CameraModel, Equirectangular, KannalaBrandt, OpenCVCamera, Pinhole,
                     UnifiedCamera, check_intrinsic_matrix, normalized_intrinsics)
from .poses import (ROTATION_TOLERANCE, axis_angle_to_matrix, blender_to_opencv, c2w_to_w2c, camera_centers,
                    check_pose, check_rotation, invert_pose, look_at, matrix_to_axis_angle, opencv_to_opengl,
                    opengl_to_opencv, orthonormalize, pose_from_rotation_translation, w2c_to_c2w)
from .presets import PRESETS, preset_trajectory
from .ray_frames import latitude_up_map, ray_frames, relative_transforms
from .rays import PLUCKER_ORDERS, patch_pixels, plucker_rays, ray_grid, reorder_plucker_inputs, world_rays
from .specs import frame_camera, resolve_trajectory
from .video import CameraPath, VideoCameras, stack_cameras, video_cameras
from .trajectory import (Trajectory, load_trajectory, read_json, read_re10k, resample, save_trajectory, write_json,
                         write_re10k)

__all__ = [
    "Cameras", "CameraPath", "VideoCameras", "stack_cameras", "video_cameras", "frustum_lines", "frame_camera",
    "resolve_trajectory",
    "CAMERA_MODELS", "CameraModel", "Equirectangular", "KannalaBrandt", "OpenCVCamera", "Pinhole", "UnifiedCamera",
    "check_intrinsic_matrix", "normalized_intrinsics", "ROTATION_TOLERANCE", "axis_angle_to_matrix",
    "blender_to_opencv", "c2w_to_w2c", "camera_centers", "check_pose", "check_rotation", "invert_pose", "look_at",
    "opencv_to_opengl", "opengl_to_opencv", "orthonormalize", "pose_from_rotation_translation", "w2c_to_c2w",
    "PRESETS", "preset_trajectory", "latitude_up_map", "ray_frames", "relative_transforms", "patch_pixels",
    "plucker_rays", "PLUCKER_ORDERS", "reorder_plucker_inputs", "ray_grid", "world_rays", "Trajectory",
    "load_trajectory", "read_json", "read_re10k", "save_trajectory", "write_json", "write_re10k", "resample", "matrix_to_axis_angle",
]
