"""The procedural mini-world as data: seeded 2D scenes and 3D scenes with ground truth, edit pairs, datasets.

Modules: ``scene`` (specs, sampling, captions), ``render`` (pixels and masks), ``images`` (uint8 / float arrays,
PNG files), ``edit_pairs`` (transplant, harmonise, style and instruction pairs), ``canvas`` (Fill canvases in PE
transplant's layout), ``data`` (torch Dataset, ImageFolder writer, training arrays), ``positional`` (positional
classification scenes), ``vocabulary`` / ``tokenizer`` (the captions' words and their tokenizer), ``scene3d`` / ``textures`` (3D scenes ray-cast
through ``mmpos.camera`` models along trajectories, their solid textures), ``nvs_data`` (posed view triples),
``video_data`` (camera-moving clips).

The models trained on the world are :mod:`mmpos.models.world`, their training :mod:`mmpos.training.world`, the
metrics :mod:`mmpos.eval`, the demo and exports :mod:`mmpos.pipelines.world`, the demo's model sources
:mod:`mmpos.pipelines.world.sources` and the edit runners the edit methods (:mod:`mmpos.pipelines.edits`;
``mmpos.world.edit_runs`` names them, with a ``DeprecationWarning``). Their old paths here
(``mmpos.world.models``, ``mmpos.world.trainer``, ...; :data:`MOVED`) still import, with a ``DeprecationWarning``,
for one release.
"""

from .._deprecation import moved_modules
from .render import Rendered, mask_box, render_scene, shape_mask
from .scene import COLOURS, PATTERNS, SHAPES, ObjectSpec, SceneSpec, SceneStyle, sample_scene, scene_caption

MOVED = {  # old submodule -> its new module (the old path goes in the next release)
    "models": "mmpos.models.world.image",
    "text": "mmpos.models.world.text",
    "latents": "mmpos.models.world.latents",
    "samples": "mmpos.models.world.samples",
    "video_model": "mmpos.models.world.video",
    "nvs_model": "mmpos.models.world.nvs",
    "trainer": "mmpos.training.world.trainer",
    "training": "mmpos.training.world.training",
    "training_data": "mmpos.training.world.training_data",
    "losses": "mmpos.training.world.losses",
    "checkpoints": "mmpos.training.world.checkpoints",
    "export": "mmpos.training.world.export",
    "video_training": "mmpos.training.world.video_training",
    "nvs_training": "mmpos.training.world.nvs_training",
    "metrics": "mmpos.eval.metrics",
    "edit_scores": "mmpos.eval.edit_scores",
    "layout_metrics": "mmpos.eval.layout_metrics",
    "image_quality": "mmpos.eval.image_quality",
    "camera_following": "mmpos.eval.camera_following",
    "video_eval": "mmpos.eval.video_eval",
    "demo": "mmpos.pipelines.world.demo",
    "video_demo": "mmpos.pipelines.world.video_demo",
    "extrapolation_runs": "mmpos.pipelines.world.extrapolation_runs",
    "video_export": "mmpos.pipelines.world.video_export",
    "sources": "mmpos.pipelines.world.sources",
}
moved_modules(__name__, MOVED)

__all__ = [
    "COLOURS",
    "PATTERNS",
    "SHAPES",
    "ObjectSpec",
    "SceneSpec",
    "SceneStyle",
    "Rendered",
    "mask_box",
    "render_scene",
    "sample_scene",
    "scene_caption",
    "shape_mask",
]
