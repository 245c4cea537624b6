"""Deprecated (one release): the demo's model sources moved to :mod:`mmpos.pipelines.sources` (the application
layer); the names below still import from here, with a ``DeprecationWarning``."""
from mmpos._deprecation import moved_names

__getattr__ = moved_names(__name__, {name: "mmpos.pipelines.sources" for name in (
    "ModelSource", "HUB_FLUX", "TASK_OF_METHOD", "WORLD_GUIDANCE", "PRETRAINED_IMAGE_SIZE", "trained_tasks",
    "parse_model_args", "task_of_method")})
