"""Integrations with other libraries (timm, diffusers, transformers)."""
