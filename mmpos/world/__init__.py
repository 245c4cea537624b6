"""The procedural mini-world: seeded 2D scenes with ground truth, edit pairs, datasets, 3D clips.

Modules: ``scene`` (specs, sampling, captions), ``render`` (pixels and masks), ``edits`` (transplant,
harmonise, style and instruction pairs), ``canvas`` (Fill canvases in PE transplant's layout), ``data``
(torch Dataset, ImageFolder writer), ``scene3d`` (3D scenes ray-cast through ``mmpos.camera`` models along
trajectories), ``metrics`` (ground-truth scores), ``models`` / ``text`` / ``training`` / ``export`` /
``samples`` (the small diffusers models trained on it), ``textures`` (solid textures of the 3D scenes),
``nvs_data`` / ``nvs_model`` / ``nvs_training`` / ``image_quality`` (the novel-view benchmark of the camera
encodings: triples of posed views, an LVSM-style model, PSNR and SSIM), ``editing`` (the mmpos editing
pipelines on them), ``sources`` (world checkpoints or pretrained FLUX for the demo) and ``demo`` (the command line:
:mod:`mmpos.pipelines.commands.world`).
"""
from .render import Rendered, mask_box, render_scene, shape_mask
from .scene import COLOURS, PATTERNS, SHAPES, ObjectSpec, SceneSpec, SceneStyle, sample_scene, scene_caption

__all__ = ["COLOURS", "PATTERNS", "SHAPES", "ObjectSpec", "SceneSpec", "SceneStyle", "Rendered", "mask_box",
           "render_scene", "sample_scene", "scene_caption", "shape_mask"]
