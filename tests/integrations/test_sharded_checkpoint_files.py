"""A sharded checkpoint folder is a file a user may be handed (:mod:`mmpos.ops.sharded_checkpoint`): the attacker's
folders are built here from a genuine one (a one-process group, AdamW) and loading them runs nothing, reads nothing
outside the folder, and fails with a named mmpos error (an ``Exception``), never DCP's ``BaseException``."""

import os
import pickle
import tempfile

import pytest
import torch
import torch.distributed as dist

from mmpos.ops.sharded_checkpoint import (
    RefusedCheckpointError,
    ShardedCheckpointError,
    load_sharded_checkpoint,
    save_sharded_checkpoint,
)

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch without distributed support")


@pytest.fixture
def one_process_group():
    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/rendezvous", rank=0, world_size=1)
    yield
    if started_here:
        dist.destroy_process_group()


def sharded_dit(hidden_size=16, pe="rope_mixed"):
    from mmpos.models import DiT
    from mmpos.ops.sharding import fully_shard_blocks

    torch.manual_seed(0)
    model = DiT(sample_size=4, patch_size=2, in_channels=3, hidden_size=hidden_size, depth=1, num_heads=2,
                num_classes=2, pe=pe).double()  # fmt: skip
    fully_shard_blocks(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


class WritesAMarker:  # a pickle payload: unpickling it calls os.system (harmless here: it creates a file)
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def read_metadata(folder):
    with open(folder / ".metadata", "rb") as stream:
        return pickle.load(stream)  # the test's own genuine file


def write_metadata(folder, metadata):
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


def lr_index(metadata):
    return next(index for index in metadata.storage_data if index.fqn == "optimizer.param_groups.0.lr")


def point_lr_at_payload(folder, marker):
    """The attack of issue 41: append ``torch.save`` of the payload to a shard, point the byte item of the
    optimizer's ``lr`` at it in ``.metadata`` (re-pickled with DCP's classes only, so the allowlist admits it)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    metadata = read_metadata(folder)
    index = lr_index(metadata)
    shard = folder / metadata.storage_data[index].relative_path
    offset = shard.stat().st_size
    payload_file = folder / "payload.pt"
    torch.save(WritesAMarker(marker), payload_file)
    payload = payload_file.read_bytes()
    payload_file.unlink()
    with open(shard, "ab") as stream:
        stream.write(payload)
    metadata.storage_data[index] = _StorageInfo(shard.name, offset, len(payload))
    write_metadata(folder, metadata)


def test_a_pickled_object_in_a_shard_is_refused_by_name_and_never_runs(tmp_path, one_process_group):
    model, optimizer = sharded_dit()
    target = save_sharded_checkpoint(tmp_path / "checkpoint-1", model, optimizer)
    marker = tmp_path / "ran.txt"
    point_lr_at_payload(target, marker)
    with pytest.raises(RefusedCheckpointError, match=r"item 'optimizer\.param_groups\.0\.lr'.*posix\.system"):
        load_sharded_checkpoint(target, *sharded_dit())
    assert not marker.exists()

    # the control: DCP's own loader runs the payload of this very folder (the attack is real)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer = sharded_dit()
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=target)
    assert marker.exists()


def test_the_genuine_optimizer_values_still_load(tmp_path, one_process_group):
    model, optimizer = sharded_dit()
    optimizer.param_groups[0]["lr"] = 0.125
    optimizer.param_groups[0]["betas"] = (0.5, 0.75)
    target = save_sharded_checkpoint(tmp_path / "checkpoint-1", model, optimizer, extra={"step": 7})
    model, optimizer = sharded_dit()
    assert load_sharded_checkpoint(target, model, optimizer) == {"step": 7}
    assert optimizer.param_groups[0]["lr"] == 0.125 and tuple(optimizer.param_groups[0]["betas"]) == (0.5, 0.75)


def elsewhere_copy(tmp_path, target, metadata, index):
    """A copy of the shard of ``index`` in a folder beside the checkpoint (the file an attacker wants read)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    shard = target / metadata.storage_data[index].relative_path
    (elsewhere / shard.name).write_bytes(shard.read_bytes())
    return elsewhere / shard.name


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_storage_path_outside_the_folder_is_refused_before_any_read(tmp_path, one_process_group, how):
    import dataclasses

    model, optimizer = sharded_dit()
    target = save_sharded_checkpoint(tmp_path / "checkpoint-1", model, optimizer)
    metadata = read_metadata(target)
    index = lr_index(metadata)
    outside = elsewhere_copy(tmp_path, target, metadata, index)
    relative = {"dotdot": f"../elsewhere/{outside.name}", "absolute": str(outside), "symlink": "link.distcp"}[how]
    if how == "symlink":
        (target / "link.distcp").symlink_to(outside)
    metadata.storage_data[index] = dataclasses.replace(metadata.storage_data[index], relative_path=relative)
    write_metadata(target, metadata)  # DCP's own loader reads the copy outside without a word
    with pytest.raises(RefusedCheckpointError, match=f"{relative!r} is outside the checkpoint folder"):
        load_sharded_checkpoint(target, *sharded_dit())


def test_a_metadata_file_linked_from_outside_is_refused(tmp_path, one_process_group):
    model, optimizer = sharded_dit()
    target = save_sharded_checkpoint(tmp_path / "checkpoint-1", model, optimizer)
    (tmp_path / "outside.metadata").write_bytes((target / ".metadata").read_bytes())
    (target / ".metadata").unlink()
    (target / ".metadata").symlink_to(tmp_path / "outside.metadata")
    with pytest.raises(RefusedCheckpointError, match="'.metadata' is outside the checkpoint folder"):
        load_sharded_checkpoint(target, *sharded_dit())


def test_dcp_failures_arrive_as_a_named_exception(tmp_path, one_process_group):
    """DCP raises ``CheckpointException``, a ``BaseException`` that ``except Exception`` misses: a checkpoint whose
    ``.metadata`` lacks an item this optimizer needs reaches the caller as :class:`ShardedCheckpointError` naming the
    folder and the item."""
    from torch.distributed.checkpoint.api import CheckpointException

    assert not issubclass(CheckpointException, Exception) and issubclass(ShardedCheckpointError, Exception)
    model, optimizer = sharded_dit()
    target = save_sharded_checkpoint(tmp_path / "checkpoint-1", model, optimizer)
    metadata = read_metadata(target)
    del metadata.state_dict_metadata["optimizer.param_groups.0.lr"]
    write_metadata(target, metadata)
    message = r"load_sharded_checkpoint: .*checkpoint-1 \(process 0\): .*optimizer\.param_groups\.0\.lr"
    with pytest.raises(ShardedCheckpointError, match=message):
        try:
            load_sharded_checkpoint(target, *sharded_dit())
        except Exception:
            raise
        except BaseException as escaped:  # pragma: no cover - the bug this test guards
            pytest.fail(f"a BaseException escaped: {type(escaped).__name__}")


def test_a_checkpoint_of_another_encoding_or_width_is_refused_by_name(tmp_path, one_process_group):
    """Saved with ``rope_mixed`` (learned frequencies), loaded into a DiT built with ``rope_axial`` (none): before,
    DCP loaded what the new model asked for and dropped the learned tables without a word."""
    model, optimizer = sharded_dit(pe="rope_mixed")
    target = save_sharded_checkpoint(tmp_path / "checkpoint-1", model, optimizer)
    message = r"saved with encoding rope_mixed, this model has rope_axial \(rotary_pes\.0: rope_mixed saved, rope_axial"
    with pytest.raises(ShardedCheckpointError, match=message):
        load_sharded_checkpoint(target, *sharded_dit(pe="rope_axial"))
    wider = r"saved from another model: blocks\.0\.adaLN_modulation\.1\.bias \[96\] saved, \[192\] here and 20 more"
    with pytest.raises(ShardedCheckpointError, match=wider):
        load_sharded_checkpoint(target, *sharded_dit(hidden_size=32))
    assert load_sharded_checkpoint(target, *sharded_dit(pe="rope_mixed")) == {}  # the same model loads
