"""A tier-1 seam for stock position modules that hold buffers: its tables follow the model's casts as the buffers
would.

``set_pe`` keeps the stock module outside the model (it is put back by ``restore``), so a ``model.to(dtype)`` made
while mmpos is installed misses it. :class:`ProbedSeam` carries a non-persistent scalar buffer,
``native_dtype_probe``, made with the stock buffer's dtype and device: the seam's tables read their dtype from it,
and ``restore`` moves the stock module to it (so the restored model is the stock model after the same cast).
"""

from __future__ import annotations

import torch

from .base import SpectrumSeam


class ProbedSeam(SpectrumSeam):
    """:class:`~.base.SpectrumSeam` plus ``native_dtype_probe`` (the stock ``buffer``'s dtype and device; float32
    on the model's device when the stock module has no such buffer)."""

    def __init__(self, family, encoding, stock, axes_dims, theta, buffer: str):
        super().__init__(family, encoding, stock, axes_dims, theta)
        like = getattr(stock, buffer, None)
        dtype, device = (like.dtype, like.device) if isinstance(like, torch.Tensor) else (torch.float32, None)
        self.register_buffer("native_dtype_probe", torch.zeros((), dtype=dtype, device=device), persistent=False)


def probed_seam(buffer: str):
    """A ``Family.make_seam`` building a :class:`ProbedSeam` on the stock module's ``buffer``."""

    def make_seam(model, stock, encodings, native, coord_axes):
        from . import family_for

        family = family_for(model)
        (encoding,) = encodings
        axes_dims, theta = family.native_axes_dims(model), family.native_theta(model)
        return ProbedSeam(family, encoding, stock, axes_dims, theta, buffer)

    return make_seam
