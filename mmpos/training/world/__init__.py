"""Training the mini-world's models (:mod:`mmpos.models.world`) on its data (:mod:`mmpos.world`).

Modules: ``training`` (the image models' command-line entry: VAE, then t2i / fill / kontext transformers),
``trainer`` (one image model's run: optimiser, EMA, progress, resume, export), ``training_data`` / ``losses`` /
``checkpoints`` (its examples, objectives and the trained unit), ``export`` (the trained pipeline folder and model
card), ``video_training`` (the world video model's three stages), ``nvs_training`` (the novel-view transformer).
"""
