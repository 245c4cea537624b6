"""Deprecated (one release): moved to :mod:`mmpos.pipelines.commands.generate.world_video` (the names import from here,
with a ``DeprecationWarning``)."""

from mmpos._deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    dict.fromkeys(
        (
            "WORLD",
            "WORLD_DEFAULTS",
            "world_model_folder",
            "world_settings",
            "world_trajectory",
            "world_first_frame",
            "run_world",
        ),
        "mmpos.pipelines.commands.generate.world_video",
    ),
)
