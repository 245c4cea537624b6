"""Adapters that put mmpos encodings into other libraries' models (timm, diffusers, transformers)."""
