"""Training-free editing pipelines on diffusers, installed as ``mmpos.pipelines``.

Band modulation (Untwisting RoPE) on Flux and Kontext, PE transplant (PosBridge) on Fill, LooseRoPE on Kontext
(and on FLUX.2 Klein / Qwen-Image(-Edit): ``BAND_PIPELINES``, ``TRANSPLANT_PIPELINES``, ``LOOSE_PIPELINES``);
camera-controlled Wan video (:mod:`.camera_pipeline`) and the mini-world's image-to-video model (:mod:`.world_video`);
all share an explicit edit context set by a transformer pre-forward hook (:mod:`.context`). Exports are loaded on
first use, so ``mmpos`` commands that do not edit never import diffusers.

The camera adapter's training data, its lens augmentation and the tiny offline Wan moved below the pipelines
(:data:`MOVED`); their old paths here (``mmpos.pipelines.camera_clips``, ...) still import, the same module with a
``DeprecationWarning``, for one release.
"""

from importlib import import_module

from mmpos._deprecation import moved_modules

MOVED = {  # old submodule -> its new module (the old path goes in the next release)
    "camera_clips": "mmpos.training.camera_clips",
    "lens_augment": "mmpos.camera.lens_augment",
    "tiny_wan": "mmpos.models.tiny_wan",
}
moved_modules(__name__, MOVED)

_EXPORTS = {
    "BandConfig": ".band",
    "BandModulationFluxPipeline": ".band_pipeline",
    "BandModulationKontextPipeline": ".band_pipeline",
    "BAND_PIPELINES": ".band_families",
    "BandModulationFlux2Pipeline": ".band_families",
    "BandModulationFlux2KleinPipeline": ".band_families",
    "BandModulationQwenImagePipeline": ".band_families",
    "BandModulationZImagePipeline": ".band_families",
    "BandModulationQwenImage21Pipeline": ".band_families",
    "EditContext": ".context",
    "EditSession": ".context",
    "TokenSegments": ".context",
    "LooseConfig": ".loose",
    "LooseRoPEKontextPipeline": ".loose_pipeline",
    "LOOSE_PIPELINES": ".loose_family_pipeline",
    "LooseRoPEKleinPipeline": ".loose_family_pipeline",
    "LooseRoPEQwenEditPipeline": ".loose_family_pipeline",
    "LooseRoPEQwenEditPlusPipeline": ".loose_family_pipeline",
    "TransplantConfig": ".transplant",
    "PosBridgeFillPipeline": ".transplant_pipeline",
    "TRANSPLANT_PIPELINES": ".family_transplant_pipeline",
    "PosBridgeKleinInpaintPipeline": ".family_transplant_pipeline",
    "PosBridgeQwenInpaintPipeline": ".family_transplant_pipeline",
    "load_pipeline": ".loading",
    "CameraControlWanPipeline": ".camera_pipeline",
    "CameraControlWanImageToVideoPipeline": ".camera_pipeline",
    "load_camera_adapter": ".camera_pipeline",
    "WorldVideoPipeline": ".world_video",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
