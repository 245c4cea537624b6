"""One process of test_fsdp_timm under torchrun (gloo): for each encoding of ``PES`` (a JSON list), a converted tiny
timm ViT under FSDP2 (````mt.fully_shard_blocks``: ``fully_shard`` per block, then the root; each rank reads its half of the batch) against the
same model without FSDP on the whole batch in this process: forward, one SGD step, a second forward. Writes
``rank{R}.json``: per encoding, the largest differences (or the error it raised)."""

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from timm.models.vision_transformer import VisionTransformer

import mmpos.integrations.timm as mt

pes, records = json.loads(sys.argv[1]), Path(sys.argv[2])


def tiny_converted(pe: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5, reg_tokens=1
    )
    name, _, variant = pe.partition(":")  # "rope_mixed:checkpointed": blocks recomputed in backward
    model = mt.convert(model, pe=name).double()
    model.set_grad_checkpointing(variant == "checkpointed")
    with torch.no_grad():  # away from the initial values, so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def step(model, images, labels):
    """Forward, mean cross-entropy, backward, one SGD step, forward again: (first output, second output)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    out = model(images)
    torch.nn.functional.cross_entropy(out, labels).backward()
    optimizer.step()
    with torch.no_grad():
        return out.detach(), model(images)


def full(param) -> torch.Tensor:
    return param.full_tensor() if hasattr(param, "full_tensor") else param.detach()


def compare(pe: str, rank: int, world: int) -> dict:
    reference = tiny_converted(pe)
    before = {name: p.detach().clone() for name, p in reference.named_parameters()}
    sharded = copy.deepcopy(reference)
    mt.fully_shard_blocks(sharded)
    is_sharded = all(type(p).__name__ == "DTensor" for p in sharded.parameters())
    generator = torch.Generator().manual_seed(1)  # the same global batch on every rank
    images = torch.randn(2 * world, 3, 32, 32, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 5, (2 * world,), generator=generator)
    mine = slice(2 * rank, 2 * rank + 2)
    expected_out, expected_after = step(reference, images, labels)
    out, after = step(sharded, images[mine], labels[mine])
    expected_params = dict(reference.named_parameters())
    params = {
        name: (full(p) - expected_params[name].detach()).abs().max().item() for name, p in sharded.named_parameters()
    }
    encoding = [name for name, _ in mt.named_pe_parameters(reference)]
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
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for pe in pes:
        try:
            results[pe] = compare(pe, rank, world)
        except Exception as error:  # reported to the test, which names the encoding
            results[pe] = dict(error=f"{type(error).__name__}: {error}"[:2000])
    (records / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
