"""FSDP2 (``fully_shard`` per block) with converted timm ViTs: every learned encoding of the registry, 2 processes
(torchrun, gloo) equal to one process without FSDP on the whole batch, forward and one optimizer step (fp64)."""

from pathlib import Path

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

import mmpos.integrations.timm as mt
from mmpos.integrations.timm.models import image_pes
from tests.workers.fsdp_worker import run_on_two_processes


def tiny_vit(**kw):
    return VisionTransformer(
        **{**dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, num_classes=5), **kw}
    )


def learned_image_pes() -> list[str]:
    """Registered image encodings whose converted model trains encoding parameters (listed, not hard-coded)."""
    return [pe for pe in image_pes() if mt.named_pe_parameters(mt.convert(tiny_vit(), pe=pe))]


def test_the_registry_has_learned_encodings_to_shard():
    assert {"rope_mixed", "comrope_ap"} <= set(learned_image_pes())  # the two of issue 33, at least


def test_a_blocks_own_encoding_builds_its_table_inside_that_block(monkeypatch):
    """Where FSDP2 gathered the block's parameters (a pre-hook before the blocks would see them sharded)."""
    model = mt.convert(tiny_vit(), pe="rope_mixed")
    running, built_in = [None], []
    for index, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda m, a, i=index: running.__setitem__(0, i))
        block.register_forward_hook(lambda m, a, o: running.__setitem__(0, None))
        original = block.attn.pe.table
        monkeypatch.setattr(
            block.attn.pe, "table", lambda *a, f=original, i=index, **k: built_in.append((i, running[0])) or f(*a, **k)
        )
    model(torch.randn(2, 3, 32, 32))
    assert built_in == [(0, 0), (1, 1), (2, 2)]


def test_a_shared_learned_encoding_is_refused_by_name():
    model = mt.convert(tiny_vit(), pe="rope_mixed", share_pe=True)
    with pytest.raises(ValueError, match="share one learned 'rope_mixed' encoding.*share_pe=False"):
        mt.fully_shard_blocks(model)
    with pytest.raises(TypeError, match="expects a model converted by mmpos"):
        mt.fully_shard_blocks(tiny_vit())


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed support")
def test_fsdp2_per_block_equals_one_process(tmp_path):
    # and a shared encoding without parameters, and activation checkpointing (tables rebuilt in the recomputation)
    pes = learned_image_pes() + ["rope_axial", "rope_mixed:checkpointed"]
    for results in run_on_two_processes("timm", pes, tmp_path, port=29561):
        for pe in pes:
            result = results[pe]
            assert "error" not in result, (pe, result.get("error"))
            assert result["sharded"], pe  # every parameter was a DTensor shard before the forward
            assert result["out"] < 1e-12 and result["after"] < 1e-12 and result["params"] < 1e-12, (pe, result)
            if pe != "rope_axial":
                assert result["encoding_params"] and result["encoding_step"] > 1e-5, (pe, result)  # it trained


def test_the_accelerate_fsdp2_config_shards_exactly_the_blocks():
    """accelerate's own loader and wrap policy on configs/accelerate/fsdp2.yaml: FSDP2, one group per timm block
    (what fully_shard_blocks does). accelerate runs FSDP on GPUs only, so the launch itself is not run here."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    config = load_config_from_file(str(Path(__file__).parents[2] / "configs/accelerate/fsdp2.yaml"))
    fsdp = config.fsdp_config
    assert config.distributed_type == "FSDP" and fsdp["fsdp_version"] == 2
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy=fsdp["fsdp_auto_wrap_policy"].lower(),
        transformer_cls_names_to_wrap=fsdp["fsdp_transformer_layer_cls_to_wrap"].split(","),
    )
    model = mt.convert(tiny_vit(), pe="rope_mixed")
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    assert [name for name, module in model.named_modules() if policy(module)] == [
        f"blocks.{index}" for index in range(len(model.blocks))
    ]
