"""Moved to :mod:`mmpos.camera.video` (pure camera geometry); this old path warns and goes in the next release."""

from ..._deprecation import moved_names

__getattr__ = moved_names(
    "mmpos.integrations.diffusers.video_cameras",
    dict.fromkeys(
        ("CameraPath", "VideoCameras", "stack_cameras", "video_cameras", "CameraInput"), "mmpos.camera.video"
    ),
)
