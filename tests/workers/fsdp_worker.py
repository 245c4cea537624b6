"""One process of test_fsdp_timm / test_fsdp_dit under torchrun (gloo): for each case of ``CASES`` (a JSON list of
``"pe"`` or ``"pe:variant"``), a tiny model of ``FAMILY`` (``timm``: a converted ViT; ``dit``: the reference DiT)
under FSDP2 (``fully_shard`` per block, then the root; each rank reads its half of the batch) against the same model
without FSDP on the whole batch in this process: forward, one SGD step, a second forward (fp64). Writes
``rank{R}.json``: per case, the largest differences (or the error it raised).

    python -m torch.distributed.run --nproc_per_node 2 tests/workers/fsdp_worker.py FAMILY CASES RECORDS_DIR
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mmpos.integrations.pe_parameters import named_pe_parameters

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests` is a package
from tests.workers.ending import end_process_group  # noqa: E402

VARIANTS = ("", "checkpointed", "shared", "reshard")  # checkpointed: blocks recomputed in backward


def tiny_vit(pe: str, variant: str) -> torch.nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    import mmpos.integrations.timm as mt

    model = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5, reg_tokens=1
    )
    model = mt.convert(model, pe=pe)
    model.set_grad_checkpointing(variant == "checkpointed")
    return model


def tiny_dit(pe: str, variant: str) -> torch.nn.Module:
    from mmpos.models import DiT

    model = DiT(
        sample_size=8, patch_size=2, in_channels=3, hidden_size=32, depth=3, num_heads=2, num_classes=4,
        class_dropout_prob=0.0, pe=pe, share_pe=True if variant == "shared" else None,
    )  # fmt: skip
    if variant == "checkpointed":
        model.enable_gradient_checkpointing()
    return model


def tiny_model(family: str, pe: str, variant: str = "", dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """The same tiny model on every rank (seeded), its weights moved away from their initial values (the DiT's
    zero-initialised gates), so that every parameter matters."""
    torch.manual_seed(0)
    model = (tiny_vit if family == "timm" else tiny_dit)(pe, variant).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def batch(family: str, size: int, seed: int = 1, dtype: torch.dtype = torch.float64) -> tuple:
    """A global batch (the same on every rank): model inputs and the regression / class target."""
    generator = torch.Generator().manual_seed(seed)
    if family == "timm":
        images = torch.randn(size, 3, 32, 32, generator=generator, dtype=dtype)
        return (images,), torch.randint(0, 5, (size,), generator=generator)
    latents = torch.randn(size, 3, 8, 8, generator=generator, dtype=dtype)
    timesteps = torch.rand(size, generator=generator, dtype=dtype) * 999
    labels = torch.randint(0, 4, (size,), generator=generator)
    return (latents, timesteps, labels), torch.randn(size, 3, 8, 8, generator=generator, dtype=dtype)


def run(model, inputs) -> torch.Tensor:
    out = model(*inputs)
    return out if isinstance(out, torch.Tensor) else out.sample


def loss_of(out, target) -> torch.Tensor:
    """Mean over the samples (so that the mean of two halves' gradients is the whole batch's gradient)."""
    if target.dtype == torch.int64:
        return torch.nn.functional.cross_entropy(out, target)
    return (out - target).square().flatten(1).mean(1).mean()


def step(model, inputs, target):
    """Forward, loss, backward, one SGD step, forward again: (first output, second output)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    out = run(model, inputs)
    loss_of(out, target).backward()
    optimizer.step()
    with torch.no_grad():
        return out.detach(), run(model, inputs)


def full(param) -> torch.Tensor:
    return param.full_tensor() if hasattr(param, "full_tensor") else param.detach()


def shard(family: str, model, variant: str):
    if family == "timm":
        import mmpos.integrations.timm as mt

        return mt.fully_shard_blocks(model)
    from mmpos.ops.sharding import fully_shard_blocks

    return fully_shard_blocks(model, **(dict(reshard_after_forward=True) if variant == "reshard" else {}))


def compare(family: str, case: str, rank: int, world: int) -> dict:
    pe, _, variant = case.partition(":")
    if variant not in VARIANTS:
        raise ValueError(f"case {case!r}: variant must be one of {VARIANTS}")
    reference = tiny_model(family, pe, variant)
    before = {name: p.detach().clone() for name, p in reference.named_parameters()}
    sharded = shard(family, copy.deepcopy(reference), variant)
    is_sharded = all(type(p).__name__ == "DTensor" for p in sharded.parameters())
    inputs, target = batch(family, 2 * world)
    mine = slice(2 * rank, 2 * rank + 2)
    expected_out, expected_after = step(reference, inputs, target)
    out, after = step(sharded, [x[mine] for x in inputs], target[mine])
    expected_params = dict(reference.named_parameters())
    params = {
        name: (full(p) - expected_params[name].detach()).abs().max().item() for name, p in sharded.named_parameters()
    }
    encoding = [name for name, _ in named_pe_parameters(reference)]
    return dict(
        out=(out - expected_out[mine]).abs().max().item(),
        after=(after - expected_after[mine]).abs().max().item(),
        params=max(params.values()),
        encoding_params=encoding,  # and how far the step moved them (the step is not a no-op)
        encoding_step=min((expected_params[n].detach() - before[n]).abs().max().item() for n in encoding)
        if encoding
        else None,
        sharded=is_sharded,
    )


def main():
    family, cases, records = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for case in cases:
        try:
            results[case] = compare(family, case, rank, world)
        except Exception as error:  # reported to the test, which names the case
            results[case] = dict(error=f"{type(error).__name__}: {error}"[:2000])
    (records / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    end_process_group()


if __name__ == "__main__":
    main()


def run_on_two_processes(family: str, cases: list[str], records: Path, port: int) -> list[dict]:
    """Run this worker under ``torchrun`` on 2 processes (for the tests); the results of rank 0 and rank 1."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    command += [__file__, family, json.dumps(cases), str(records)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return [json.loads((records / f"rank{rank}.json").read_text()) for rank in (0, 1)]
