"""FSDP2 (``fully_shard`` per block, then the root) with the reference DiT: every learned encoding it offers, 2
processes (torchrun, gloo) equal to one process without FSDP on the whole batch, forward and one optimizer step (fp64).

The DiT keeps its encodings on the model (``rotary_pes``, ``abs_pe``), so they belong to the root group, which FSDP
gathers before the blocks run: the tables built there see whole parameters, and the blocks only apply them."""

import pytest
import torch

from mmpos.encodings import list_pes
from mmpos.integrations.pe_parameters import named_pe_parameters
from mmpos.models import DiT
from mmpos.ops.sharding import fully_shard_blocks
from tests.workers.fsdp_worker import run_on_two_processes

TINY = dict(sample_size=8, patch_size=2, in_channels=3, hidden_size=32, depth=3, num_heads=2, num_classes=4)


def tiny_dits() -> dict:
    """A tiny DiT per registered encoding it takes (those reading 1, 3 or 4 axes, or cameras, do not fit it)."""
    models = {}
    for pe in list_pes("absolute") + list_pes("rotary"):
        try:
            models[pe] = DiT(**TINY, pe=pe)
        except ValueError as error:
            assert "DiT (head_dim=16, num_heads=2)" in str(error), (pe, error)  # refused by the DiT, by name
    return models


def learned_dit_pes() -> list[str]:
    """Encodings whose DiT trains encoding parameters (listed from the registry, not hard-coded)."""
    return [pe for pe, model in tiny_dits().items() if named_pe_parameters(model)]


def test_the_dit_has_learned_encodings_to_shard():
    assert {"rope_mixed", "comrope_ap", "comrope_ld", "harope", "liere", "ape_learned"} <= set(learned_dit_pes())


def test_fully_shard_blocks_names_a_model_without_blocks():
    with pytest.raises(TypeError, match="Linear has no `blocks` ModuleList; pass blocks="):
        fully_shard_blocks(torch.nn.Linear(2, 2))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed support")
def test_fsdp2_per_block_equals_one_process(tmp_path):
    # and a shared encoding without parameters, one learned encoding shared by every block (on the root, so it
    # shards too), activation checkpointing, and the root resharded after the forward (gathered again for backward)
    cases = learned_dit_pes() + ["rope_axial", "rope_mixed:shared", "rope_mixed:checkpointed", "harope:reshard"]
    for results in run_on_two_processes("dit", cases, tmp_path, port=29563):
        for case in cases:
            result = results[case]
            assert "error" not in result, (case, result.get("error"))
            assert result["sharded"], case  # every parameter was a DTensor shard before the forward
            assert result["out"] < 1e-12 and result["after"] < 1e-12 and result["params"] < 1e-12, (case, result)
            if case != "rope_axial":
                # it trained (harope moves least: 1e-5; the differences above are round-off, 1e-16)
                assert result["encoding_params"] and result["encoding_step"] > 1e-8, (case, result)


def test_the_accelerate_fsdp2_config_with_dit_blocks_shards_exactly_the_blocks():
    """configs/accelerate/fsdp2.yaml with `fsdp_transformer_layer_cls_to_wrap: DiTBlock` (the DiT's
    `_no_split_modules`), read by accelerate's own loader and wrap policy: one group per DiT block, the encodings left
    to the root group (what fully_shard_blocks does). accelerate runs FSDP on GPUs only: the launch is not run here."""
    from pathlib import Path

    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    fsdp = load_config_from_file(str(Path(__file__).parents[2] / "configs/accelerate/fsdp2.yaml")).fsdp_config
    model = DiT(**TINY, pe="rope_mixed")
    assert model._no_split_modules == ["DiTBlock"]
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=fsdp["fsdp_version"],
        auto_wrap_policy=fsdp["fsdp_auto_wrap_policy"].lower(),
        transformer_cls_names_to_wrap=model._no_split_modules,
    )
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    assert [name for name, module in model.named_modules() if policy(module)] == [
        f"blocks.{index}" for index in range(len(model.blocks))
    ]
