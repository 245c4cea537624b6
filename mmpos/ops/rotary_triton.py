"""Fused rotary kernel for CUDA (Triton): one read and one write of q or k, arithmetic in fp32.

The PyTorch path upcasts a 16-bit tensor to an fp32 buffer, multiplies and rounds back (three passes);
this kernel reads each pair once, rotates it in registers and writes the result in the input dtype.

Opt-in: :func:`mmpos.ops.rotation.rotate` takes it for CUDA tensors only under the ``"auto"`` or ``"triton"``
rotary backend (:func:`mmpos.ops.set_rotary_backend`; ``MMPOS_TRITON=1`` makes ``"auto"`` the default). It is
tested under Triton's CPU interpreter (``TRITON_INTERPRET=1``) but has not yet run on a GPU in this project's
checks (``tests/cuda/test_rotary_kernel_cuda.py`` compares it with the PyTorch path and
``benchmarks/bench_rotary.py --device cuda`` times both); it becomes the default once that has been done.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from .backends import fused_kernel_enabled


@functools.lru_cache(maxsize=None)
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def rotate_pairs(  # type: ignore[no-untyped-def]  # a Triton kernel: its parameters are pointers and ints
        x_ptr,
        out_ptr,
        cs_ptr,
        heads,
        length,
        pairs,
        half_offset,
        xs_b,
        xs_h,
        xs_l,
        xs_d,
        os_b,
        os_h,
        os_l,
        os_d,
        cs_b,
        cs_h,
        cs_l,
        cs_p,
        INTERLEAVED: tl.constexpr,
        BLOCK_L: tl.constexpr,
        BLOCK_P: tl.constexpr,
    ):
        bh = tl.program_id(0)
        b = (bh // heads).to(tl.int64)  # int64 offsets: tensors may exceed 2^31 elements
        h = (bh % heads).to(tl.int64)
        rows = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)[:, None]
        cols = tl.arange(0, BLOCK_P)[None, :]
        mask = (rows < length) & (cols < pairs)
        if INTERLEAVED:
            re_ch = 2 * cols
            im_ch = 2 * cols + 1
        else:
            re_ch = cols
            im_ch = cols + half_offset
        x_row = x_ptr + b * xs_b + h * xs_h + rows * xs_l
        o_row = out_ptr + b * os_b + h * os_h + rows * os_l
        c_at = cs_ptr + b * cs_b + h * cs_h + rows * cs_l + cols * cs_p
        xr = tl.load(x_row + re_ch * xs_d, mask=mask).to(tl.float32)
        xi = tl.load(x_row + im_ch * xs_d, mask=mask).to(tl.float32)
        cos = tl.load(c_at, mask=mask)
        sin = tl.load(c_at + 1, mask=mask)
        tl.store(o_row + re_ch * os_d, (xr * cos - xi * sin).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(o_row + im_ch * os_d, (xr * sin + xi * cos).to(out_ptr.dtype.element_ty), mask=mask)

    return rotate_pairs


def can_fuse(src: torch.Tensor, cis: torch.Tensor) -> bool:
    """Whether the kernel takes this ``[..., L, R]`` view (CUDA, or CPU under TRITON_INTERPRET) and table."""
    interpreted = os.environ.get("TRITON_INTERPRET", "") == "1"
    on_device = src.device.type == "cuda" or (interpreted and src.device.type == "cpu")
    return (
        on_device
        and fused_kernel_enabled()
        and src.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and cis.dtype == torch.complex64
        and 2 <= src.dim() <= 4
        and cis.dim() <= 4
    )


def rotate_fused(src: torch.Tensor, cis: torch.Tensor, dst: torch.Tensor, interleaved: bool) -> None:
    """Write the rotation of ``src`` ``[..., L, R]`` (any strides) by ``cis`` ``[..., L, R/2]`` into ``dst``."""
    src4, dst4 = _as_4d(src), _as_4d(dst)
    batch, heads, length, rotary_dim = src4.shape
    pairs = rotary_dim // 2
    cs = torch.view_as_real(_as_4d(cis).expand(batch, heads, length, pairs))  # broadcast dims get stride 0
    block_p = max(16, 1 << (pairs - 1).bit_length())
    block_l = max(1, min(64, 4096 // block_p))
    grid = (batch * heads, -(-length // block_l))
    _kernel()[grid](
        src4,
        dst4,
        cs,
        heads,
        length,
        pairs,
        pairs,
        *src4.stride(),
        *dst4.stride(),
        *cs.stride()[:4],
        INTERLEAVED=interleaved,
        BLOCK_L=block_l,
        BLOCK_P=block_p,
    )


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    while t.dim() < 4:
        t = t.unsqueeze(0)
    return t
