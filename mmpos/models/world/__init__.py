"""The mini-world's small models: the image models (VAE, text encoder, Flux transformers, their pipelines), the
world video model, the novel-view transformer, latents in the pipelines' layout, and sampling held-out examples.

Modules: ``image`` (built from the real diffusers classes, loaded as real pipelines), ``text`` (the word-level text
encoder), ``latents`` (VAE latents, 2x2 packing, Flux ids), ``samples`` (held-out examples run through a pipeline,
labelled grids), ``video`` (the world video model's ``WanTransformer3DModel``), ``nvs`` (an LVSM-style novel-view
transformer with a pluggable camera encoding). Their data is :mod:`mmpos.world`; their training
:mod:`mmpos.training.world`.
"""
