"""Training-free editing pipelines on diffusers, installed as ``mmpos.pipelines``.

Empty until the editing-pipelines issue lands (band modulation, PE transplant, LooseRoPE).
"""
