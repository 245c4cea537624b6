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
    "BandConfig": ".edits.band.rule",
    "BandModulationFluxPipeline": ".edits.band.pipelines",
    "BandModulationKontextPipeline": ".edits.band.pipelines",
    "BAND_PIPELINES": ".edits.band.pipelines",
    "BandModulationFlux2Pipeline": ".edits.band.pipelines",
    "BandModulationFlux2KleinPipeline": ".edits.band.pipelines",
    "BandModulationQwenImagePipeline": ".edits.band.pipelines",
    "BandModulationZImagePipeline": ".edits.band.pipelines",
    "BandModulationQwenImage21Pipeline": ".edits.band.pipelines",
    "EditContext": ".edits.context",
    "EditSession": ".edits.context",
    "TokenSegments": ".edits.context",
    "LooseConfig": ".edits.loose.rule",
    "LooseRoPEKontextPipeline": ".edits.loose.pipelines",
    "LOOSE_PIPELINES": ".edits.loose.pipelines",
    "LooseRoPEKleinPipeline": ".edits.loose.pipelines",
    "LooseRoPEQwenEditPipeline": ".edits.loose.pipelines",
    "LooseRoPEQwenEditPlusPipeline": ".edits.loose.pipelines",
    "TransplantConfig": ".edits.transplant.canvas",
    "PosBridgeFillPipeline": ".edits.transplant.pipeline_fill",
    "TRANSPLANT_PIPELINES": ".edits.transplant.pipeline_inpaint",
    "PosBridgeKleinInpaintPipeline": ".edits.transplant.pipeline_inpaint",
    "PosBridgeQwenInpaintPipeline": ".edits.transplant.pipeline_inpaint",
    "load_pipeline": ".loading",
    "CameraControlWanPipeline": ".video.camera",
    "CameraControlWanImageToVideoPipeline": ".video.camera",
    "load_camera_adapter": ".video.camera",
    "WorldVideoPipeline": ".video.world",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
