"""The one training scaffold every task runs on (torch-free to import: a command line parses first).

``loop`` (:class:`~.loop.TrainingTask`, :func:`~.loop.train`, the data stream and every sample's noise, and
:func:`~.loop.backward`, the one backward pass of the package), ``checkpoint`` (the one checkpoint layout,
``checkpoint-<step>/``, and the earlier layouts it resumes), ``config`` (the one config style: a dataclass per
task, YAML, flags and ``--set``), ``folders`` (run folders: ``--resume`` / ``--overwrite``, finding checkpoints),
``interrupt`` (Ctrl-C / SIGTERM: checkpoint, exit 130) and ``processes`` (the one accelerator factory and what N
processes share).
"""
