"""The mini-world's image models (:mod:`mmpos.models.world`) as trained on its data (:mod:`mmpos.world`): the
pieces the image task (:mod:`mmpos.training.tasks.world_image`) runs.

Modules: ``config`` (the image trainer's keys and their rules), ``training_data`` / ``losses`` / ``flux2_losses`` /
``checkpoints`` (its examples, objectives and the trained unit), ``export`` (the trained pipeline folder and model
card). The world video model's stages and the novel-view transformer are :mod:`mmpos.training.tasks.world_video` and
:mod:`mmpos.training.tasks.nvs`.
"""
