"""The procedural mini-world as data: seeded 2D scenes and 3D scenes with ground truth, edit pairs, datasets.

Modules: ``scene`` (specs, sampling, captions), ``render`` (pixels and masks), ``images`` (uint8 / float arrays,
PNG files), ``edit_pairs`` (transplant, harmonise, style and instruction pairs), ``canvas`` (Fill canvases in PE
transplant's layout), ``data`` (torch Dataset, ImageFolder writer, training arrays), ``positional`` (positional
classification scenes), ``vocabulary`` / ``tokenizer`` (the captions' words and their tokenizer), ``scene3d`` / ``textures`` (3D scenes ray-cast
through ``mmpos.camera`` models along trajectories, their solid textures), ``nvs_data`` (posed view triples),
``video_data`` (camera-moving clips).

The models trained on the world are :mod:`mmpos.models.world`, their training :mod:`mmpos.training.world`, the
metrics :mod:`mmpos.eval`, the demo and exports :mod:`mmpos.pipelines.world`, the demo's model sources
:mod:`mmpos.pipelines.sources` and the edit runners the edit methods (:mod:`mmpos.pipelines.edits`).
"""

from .render import Rendered, mask_box, render_scene, shape_mask
from .scene import COLOURS, PATTERNS, SHAPES, ObjectSpec, SceneSpec, SceneStyle, sample_scene, scene_caption

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
