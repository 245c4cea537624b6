"""Deprecated (one release): the editing runs moved to the edit methods' modules, :mod:`mmpos.pipelines.edits`
(``band.run_band``, ``transplant.run_transplant``, ``loose.run_loose``, ``loose.loose_for_steps``; one runner,
:func:`mmpos.pipelines.edits.run_edit`); the names below still import from here, with a ``DeprecationWarning``."""

from mmpos._deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "EditRun": "mmpos.pipelines.edits.method",
        "run_band": "mmpos.pipelines.edits.band.demo",
        "run_transplant": "mmpos.pipelines.edits.transplant.demo",
        "run_loose": "mmpos.pipelines.edits.loose.demo",
        "loose_for_steps": "mmpos.pipelines.edits.loose.demo",
        "load_edit_pipeline": "mmpos.pipelines.world.sources:load_world_edit",
        "LOOSE_SCHEDULE_STEPS": "mmpos.pipelines.edits.loose.demo:SCHEDULE_STEPS",
    },
)
