"""The procedural mini-world: seeded 2D scenes with ground truth, edit pairs and datasets."""
from .render import Rendered, mask_box, render_scene, shape_mask
from .scene import COLOURS, PATTERNS, SHAPES, ObjectSpec, SceneSpec, SceneStyle, sample_scene, scene_caption

__all__ = ["COLOURS", "PATTERNS", "SHAPES", "ObjectSpec", "SceneSpec", "SceneStyle", "Rendered", "mask_box",
           "render_scene", "sample_scene", "scene_caption", "shape_mask"]
