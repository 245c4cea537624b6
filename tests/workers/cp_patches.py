"""The diffusers limitations the 2-process context-parallel workers patch (and only these), on a machine without an
accelerator:

- ``torch.accelerator.device_count()`` is 0 and ``_resolve_parallel_config`` takes ``rank % 0`` (made 1);
- ring attention needs each block's log-sum-exp, which diffusers' native (SDPA) op refuses to return and no CPU
  backend has: the native op gets it from the plain softmax formula (in the inputs' dtype, with SDPA's reading of
  ``attn_mask``) when asked;
- gloo's ``all_gather`` takes equal shapes only, so the output gather of uneven shards (``*_anything``) pads to
  the longest shard and trims.

Even Ulysses runs diffusers unpatched. :func:`start` initialises the gloo group (``"cpu:gloo"`` also tells diffusers'
``ulysses_anything`` to gather sizes on the CPU) and applies the patches.
"""

import torch
import torch.distributed as dist


def start() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("cpu:gloo")
    torch.accelerator.device_count = lambda: 1

    from diffusers.hooks import context_parallel
    from diffusers.models import attention_dispatch

    stock_native_op = attention_dispatch._native_attention_forward_op

    def native_op_with_lse(
        ctx,
        query,
        key,
        value,
        attn_mask=None,
        dropout_p=0.0,
        is_causal=False,
        scale=None,
        enable_gqa=False,
        return_lse=False,
        _save_ctx=True,
        _parallel_config=None,
    ):
        """The native op, plus ``lse [B, S, H]`` from the softmax formula when ring attention asks for it."""
        if not return_lse:
            return stock_native_op(
                ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, False, _save_ctx,
                _parallel_config,
            )  # fmt: skip
        assert not is_causal and dropout_p == 0.0
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))  # [B, H, S, D]
        scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
        if attn_mask is not None:  # as SDPA reads it: bool keeps the True keys, a float mask is added
            scores = (
                scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
            )
        out = torch.softmax(scores, dim=-1) @ v
        return out.permute(0, 2, 1, 3), scores.logsumexp(dim=-1).permute(0, 2, 1)

    def all_gather_padded(tensor, dim, group):
        """diffusers' ``_all_gather_anything`` for gloo: uneven shards padded to the longest, gathered, trimmed."""
        sizes = [torch.zeros((), dtype=torch.int64) for _ in range(dist.get_world_size(group=group))]
        dist.all_gather(sizes, torch.tensor(tensor.shape[dim]), group=group)
        sizes = [int(s) for s in sizes]
        pad = [0, 0] * (tensor.dim() - 1 - dim % tensor.dim()) + [0, max(sizes) - tensor.shape[dim]]
        gathered = [torch.empty_like(torch.nn.functional.pad(tensor, pad)) for _ in sizes]
        dist.all_gather(gathered, torch.nn.functional.pad(tensor, pad).contiguous(), group=group)
        return torch.cat([g.narrow(dim, 0, n) for g, n in zip(gathered, sizes)], dim=dim)

    attention_dispatch._native_attention_forward_op = native_op_with_lse
    context_parallel._all_gather_anything = all_gather_padded


def parallel_config(mode: str, anything: bool):
    """``ContextParallelConfig`` of degree 2 for ``mode`` (``"ulysses"`` / ``"ring"``), uneven with ``anything``."""
    from diffusers import ContextParallelConfig

    options = {f"{mode}_degree": 2, "convert_to_fp32": False, **({f"{mode}_anything": True} if anything else {})}
    return ContextParallelConfig(**options)
