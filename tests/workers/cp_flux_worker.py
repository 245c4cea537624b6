"""One rank of test_context_parallel's 2-process runs (torchrun, gloo): a tiny Flux with ``set_pe`` and a
scheduled extrapolation preset, run in one process and then under diffusers' ``enable_parallelism`` (Ulysses and
ring); writes ``rank{R}.json``: per case, the largest difference between the two outputs.

diffusers limitations patched here (and only these): on a machine without an accelerator
``torch.accelerator.device_count()`` is 0 and ``_resolve_parallel_config`` takes ``rank % 0`` (made 1); and ring
attention needs each block's log-sum-exp, which diffusers' native (SDPA) op refuses to return and no CPU backend
has: the native op gets it from the plain softmax formula (fp64) when asked; and gloo's ``all_gather`` takes
equal shapes only, so the output gather of uneven shards (``*_anything``) pads to the longest shard and trims.
Even Ulysses runs diffusers unpatched.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests` is a package

from mmpos.integrations.diffusers import model_extrapolation, set_pe  # noqa: E402
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs  # noqa: E402

out_dir, cases = Path(sys.argv[1]), json.loads(sys.argv[2])  # [[preset, mode, height, width, text], ...]
torch.set_num_threads(1)
dist.init_process_group("cpu:gloo")  # "cpu:" also tells diffusers' ulysses_anything to gather sizes on the CPU
torch.accelerator.device_count = lambda: 1  # the diffusers CPU limitation (see the module docstring)

from diffusers import ContextParallelConfig  # noqa: E402
from diffusers.hooks import context_parallel  # noqa: E402
from diffusers.models import attention_dispatch  # noqa: E402

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
            ctx,
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            False,
            _save_ctx,
            _parallel_config,
        )
    assert attn_mask is None and not is_causal and dropout_p == 0.0
    q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))  # [B, H, S, D]
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
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

differences = {}
for preset, mode, height, width, text in cases:
    model = tiny_flux(torch.float64)
    model.set_attention_backend("native")
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, trained_grid=(4, 4)))
    inputs = tiny_flux_inputs(torch.float64, height=height, width=width, text=text)
    with torch.no_grad():
        alone = model(**inputs, return_dict=False)[0]
        anything = (height * width) % 2 or text % 2
        options = {f"{mode}_degree": 2, "convert_to_fp32": False, **({f"{mode}_anything": True} if anything else {})}
        config = ContextParallelConfig(**options)
        model.enable_parallelism(config=config)
        parallel = model(**inputs, return_dict=False)[0]
    differences[f"{preset}/{mode}/{height}x{width}+{text}"] = float((parallel - alone).abs().max())
(out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(differences))
dist.destroy_process_group()
