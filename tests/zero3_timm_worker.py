"""One process of test_zero3_timm under torchrun (gloo, ``DS_ACCELERATOR=cpu``): for each encoding of ``PES`` (a JSON
list), a converted tiny timm ViT trained ``STEPS`` SGD steps under DeepSpeed ZeRO-3 (``deepspeed.initialize`` with
the DeepSpeed config accelerate makes of ``configs/accelerate/zero3.yaml``, gradient clipping included, in fp32, every
parameter partitioned; each rank reads its half of every global batch) against the same model without ZeRO on the
whole batches in this process, clipped the same way (fp32).
Writes ``rank{R}.json``: per encoding, the largest differences of the outputs and parameters (or the error it raised).

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 tests/zero3_timm_worker.py PES STEPS DIR
"""

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from timm.models.vision_transformer import VisionTransformer

import mmpos.integrations.timm as mt
from mmpos.integrations.pe_parameters import named_pe_parameters

LR, MICRO_BATCH = 0.5, 2
CONFIG = Path(__file__).parents[1] / "configs/accelerate/zero3.yaml"
PLUGIN_KEYS = ("zero_stage", "offload_optimizer_device", "offload_param_device", "zero3_init_flag")
PLUGIN_KEYS += ("zero3_save_16bit_model", "gradient_accumulation_steps", "gradient_clipping")


def tiny_converted(pe: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5)
    model = mt.convert(model, pe=pe)
    with torch.no_grad():  # away from the initial values, so every parameter matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def zero3_config(micro_batch: int, processes: int) -> dict:
    """The DeepSpeed config accelerate's ``DeepSpeedPlugin`` makes of configs/accelerate/zero3.yaml, its ``auto``
    batch sizes filled as accelerate fills them, in fp32 (the file's bf16 is accelerate's mixed precision), with every
    parameter partitioned (ZeRO-3 keeps tensors under 1e5 elements whole by default: all of a tiny model)."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DeepSpeedPlugin

    options = load_config_from_file(str(CONFIG)).deepspeed_config
    config = copy.deepcopy(DeepSpeedPlugin(**{key: options[key] for key in PLUGIN_KEYS}).deepspeed_config)
    accumulation = config["gradient_accumulation_steps"]
    config.update(train_micro_batch_size_per_gpu=micro_batch, train_batch_size=micro_batch * accumulation * processes)
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    config.update(bf16={"enabled": False}, fp16={"enabled": False}, zero_allow_untested_optimizer=True)  # torch SGD
    return config


def compare(pe: str, steps: int, rank: int, world: int) -> dict:
    import deepspeed

    config = zero3_config(MICRO_BATCH, world)
    reference = tiny_converted(pe)
    before = {name: p.detach().clone() for name, p in reference.named_parameters()}
    model = copy.deepcopy(reference)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), config=config)
    partitioned = all(p.numel() == 0 and hasattr(p, "ds_id") for p in model.parameters())
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(1)  # the same global batches on every rank
    mine, out_diff = slice(MICRO_BATCH * rank, MICRO_BATCH * (rank + 1)), 0.0
    for _ in range(steps):
        images = torch.randn(MICRO_BATCH * world, 3, 32, 32, generator=generator)
        labels = torch.randint(0, 5, (MICRO_BATCH * world,), generator=generator)
        out = engine(images[mine])
        engine.backward(torch.nn.functional.cross_entropy(out, labels[mine]))
        engine.step()
        expected = reference(images)
        torch.nn.functional.cross_entropy(expected, labels).backward()
        if config["gradient_clipping"]:
            torch.nn.utils.clip_grad_norm_(reference.parameters(), config["gradient_clipping"])
        optimizer.step()
        optimizer.zero_grad()
        out_diff = max(out_diff, (out.detach() - expected[mine].detach()).abs().max().item())
    expected_params = dict(reference.named_parameters())
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        params = {name: (p.detach() - expected_params[name].detach()).abs().max().item()
                  for name, p in model.named_parameters()}  # fmt: skip
    encoding = [name for name, _ in named_pe_parameters(reference)]
    return dict(
        out=out_diff,
        params=max(params.values()),
        encoding_params=encoding,  # and how far the steps moved them (the steps are no no-ops)
        encoding_step=min((expected_params[n].detach() - before[n]).abs().max().item() for n in encoding)
        if encoding
        else None,
        partitioned=partitioned,
    )


def main():
    pes, steps, records = json.loads(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for pe in pes:
        try:
            results[pe] = compare(pe, steps, rank, world)
        except Exception as error:  # reported to the test, which names the encoding
            results[pe] = dict(error=f"{type(error).__name__}: {error}"[:2000])
    (records / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
