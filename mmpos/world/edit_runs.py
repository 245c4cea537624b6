"""Deprecated (one release): the editing runs moved to the edit methods' modules, :mod:`mmpos.pipelines.edits`
(``band.run_band``, ``transplant.run_transplant``, ``loose.run_loose``, ``loose.loose_for_steps``; one runner,
:func:`mmpos.pipelines.edits.run_edit`); the names below still import from here, with a ``DeprecationWarning``."""

from mmpos._deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    {
        "EditRun": "mmpos.pipelines.edits.base",
        "run_band": "mmpos.pipelines.edits.band",
        "run_transplant": "mmpos.pipelines.edits.transplant",
        "run_loose": "mmpos.pipelines.edits.loose",
        "loose_for_steps": "mmpos.pipelines.edits.loose",
        "load_edit_pipeline": "mmpos.pipelines.sources:load_world_edit",
        "LOOSE_SCHEDULE_STEPS": "mmpos.pipelines.edits.loose:SCHEDULE_STEPS",
    },
)
