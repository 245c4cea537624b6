"""The mini-world's runners and reports: the world part of ``mmpos demo`` (``demo``, ``video_demo``), the
extrapolation runs of the world t2i model (``extrapolation_runs``) and the world video model's export
(``video_export``). They drive the pipelines on :mod:`mmpos.models.world` and score with :mod:`mmpos.eval`.
"""
