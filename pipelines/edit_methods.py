"""Deprecated (one release): the ``mmpos edit`` methods are registered edit methods now,
:mod:`mmpos.pipelines.edits` (one module each, its ``cli_run``); the functions below keep their old signatures and
warn (``DeprecationWarning``)."""

from __future__ import annotations

import warnings

from mmpos._deprecation import moved_names

__getattr__ = moved_names(
    __name__,
    {"target_box": "mmpos.pipelines.edits.transplant.cli", "image_height_width": "mmpos.pipelines.edits.transplant.cli"},
)


def _warn(old: str, new: str) -> None:
    warnings.warn(
        f"mmpos.pipelines.edit_methods.{old} moved to {new}; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )


def load_edit_pipeline(kind: str, config):
    """``kind``: an edit method name or ``band_kontext``: :func:`mmpos.pipelines.loading.load_edit_pipeline`."""
    _warn("load_edit_pipeline", "mmpos.pipelines.loading.load_edit_pipeline(get_edit(name), config)")
    from .loading import edit_kind
    from .loading import load_edit_pipeline as load

    method, variant = edit_kind(kind)
    if variant is not None:
        config["variant"] = variant
    return load(method, config)


def _cli_run(name: str, args, config, tqdm) -> dict:
    from .edits import get_edit
    from .loading import load_edit_pipeline as load

    method = get_edit(name)
    return method.cli_run(args, config, lambda: load(method, config), tqdm)


def run_band(args, config, tqdm) -> dict:
    _warn("run_band", "mmpos.pipelines.edits.band.cli.cli_run")
    return _cli_run("band", args, config, tqdm)


def run_transplant(args, config, tqdm) -> dict:
    _warn("run_transplant", "mmpos.pipelines.edits.transplant.cli.cli_run")
    return _cli_run("transplant", args, config, tqdm)


def run_loose(args, config, tqdm) -> dict:
    _warn("run_loose", "mmpos.pipelines.edits.loose.cli.cli_run")
    return _cli_run("loose", args, config, tqdm)
