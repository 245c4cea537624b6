"""Training-free editing pipelines on diffusers, and camera-controlled video, installed as ``mmpos.pipelines``.

Every registered edit method's pipelines and options class are exported by name (``BandModulationFluxPipeline``,
``PosBridgeKleinInpaintPipeline``, ``LooseConfig``, ...): read from the edit registry (:mod:`.edits`, each method's
record in ``edits/<method>/__init__.py``), the one map from a model's pipeline class or family to the edit pipeline.
Beside them: the edit context and session (:mod:`.edits.context`), :func:`~.loading.load_pipeline`, the
camera-controlled Wan pipelines (:mod:`.video.camera`) and the mini-world's image-to-video model
(:mod:`.video.world`). Exports are loaded on first use, so ``mmpos`` commands that do not edit never import diffusers.
"""

from importlib import import_module

_EXPORTS = {  # besides the edit methods' pipelines and options classes (those come from their records)
    "EditContext": ".edits.context",
    "EditSession": ".edits.context",
    "TokenSegments": ".edits.segments",
    "load_pipeline": ".loading",
    "CameraControlWanPipeline": ".video.camera",
    "CameraControlWanImageToVideoPipeline": ".video.camera",
    "load_camera_adapter": ".video.camera",
    "camera_control": ".video.camera",
    "WorldVideoPipeline": ".video.world",
}


def _edit_exports() -> dict:
    """Class name -> module of each shipped edit method's options class and pipelines (its registry record)."""
    from .edits import get_edit, list_edits

    exports = {}
    for name in list_edits():
        method = get_edit(name)
        for spec in (method.config_class, *method.pipelines.values()):
            if isinstance(spec, str):
                module, _, attribute = spec.partition(":")
                exports[attribute] = module
    return exports


_EXPORTS.update(_edit_exports())
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
