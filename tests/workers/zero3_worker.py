"""One process of test_zero3 under torchrun (gloo, ``DS_ACCELERATOR=cpu``): for each case ``"FAMILY:PE"`` of ``CASES``
(a JSON list), a tiny model of ``FAMILY`` (``timm``: a converted ViT; ``dit``: the reference DiT; as in fsdp_worker)
with encoding ``PE`` trained ``STEPS``
SGD steps under DeepSpeed ZeRO-3 (``deepspeed.initialize`` with the DeepSpeed config accelerate makes of
``configs/accelerate/zero3.yaml``, gradient clipping included, every parameter partitioned; each rank reads its half of
every global batch) against the same model without ZeRO on the whole batches in this process, clipped the same way
(fp32: DeepSpeed partitions fp16, bf16 and fp32 only). Writes ``rank{R}.json``: per case, the largest differences
of the outputs and parameters (or the error it raised).

    DS_ACCELERATOR=cpu python -m torch.distributed.run --nproc_per_node 2 tests/workers/zero3_worker.py CASES STEPS DIR
"""

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests` is a package
from mmpos.integrations.pe_parameters import named_pe_parameters
from tests.workers.ending import end_process_group  # noqa: E402
from tests.workers.fsdp_worker import batch, loss_of, run, tiny_model  # noqa: E402

LR, MICRO_BATCH = 0.5, 2
CONFIG = Path(__file__).parents[2] / "configs/accelerate/zero3.yaml"
PLUGIN_KEYS = ("zero_stage", "offload_optimizer_device", "offload_param_device", "zero3_init_flag")
PLUGIN_KEYS += ("zero3_save_16bit_model", "gradient_accumulation_steps", "gradient_clipping")


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


def train_reference(reference, inputs, target, optimizer, clip: float) -> torch.Tensor:
    """One step of the model without ZeRO on the whole batch; its output before the step."""
    out = run(reference, inputs)
    loss_of(out, target).backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(reference.parameters(), clip)
    optimizer.step()
    optimizer.zero_grad()
    return out.detach()


def compare(family: str, pe: str, steps: int, rank: int, world: int) -> dict:
    import deepspeed

    config = zero3_config(MICRO_BATCH, world)
    reference = tiny_model(family, pe, dtype=torch.float32)
    before = {name: p.detach().clone() for name, p in reference.named_parameters()}
    model = copy.deepcopy(reference)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), config=config)
    partitioned = all(p.numel() == 0 and hasattr(p, "ds_id") for p in model.parameters())
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    mine, out_diff = slice(MICRO_BATCH * rank, MICRO_BATCH * (rank + 1)), 0.0
    for index in range(steps):  # the same global batches on every rank
        inputs, target = batch(family, MICRO_BATCH * world, seed=1 + index, dtype=torch.float32)
        out = run(engine, [x[mine] for x in inputs])
        engine.backward(loss_of(out, target[mine]))
        engine.step()
        expected = train_reference(reference, inputs, target, optimizer, config["gradient_clipping"])
        out_diff = max(out_diff, (out.detach() - expected[mine]).abs().max().item())
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
    import deepspeed

    cases, steps, records = json.loads(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for case in cases:
        family, _, pe = case.partition(":")
        try:
            results[case] = compare(family, pe, steps, rank, world)
        except Exception as error:  # reported to the test, which names the case
            results[case] = dict(error=f"{type(error).__name__}: {error}"[:2000])
    (records / f"rank{rank}.json").write_text(json.dumps(results, indent=1))
    end_process_group()


if __name__ == "__main__":
    main()
