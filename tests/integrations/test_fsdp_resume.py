"""Resume under FSDP2 (:mod:`mmpos.ops.sharded_checkpoint` on torch's distributed checkpoint): 2 processes (torchrun,
gloo, fp64, AdamW), a timm ViT and the DiT with learned encodings; 2 steps, a checkpoint, 2 more equal bit for bit a
new launch that loads the checkpoint and takes the 2 steps, and a run of 4 steps without a checkpoint. The errors
and the atomic write are tested in this process (one-process group)."""

import tempfile

import pytest
import torch
import torch.distributed as dist

from mmpos.ops.sharded_checkpoint import IncompleteCheckpointError, load_sharded_checkpoint, save_sharded_checkpoint
from tests.workers.resume_worker import assert_resumed_bit_identical, run_resume

# learned encodings in a timm block (rope_mixed, comrope_ap) and on the DiT (rope_mixed, harope folded into qkv)
CASES = ["timm:rope_mixed", "timm:comrope_ap", "dit:rope_mixed", "dit:harope"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed support")
def test_fsdp2_resume_is_bit_identical(tmp_path):
    results = run_resume("fsdp", CASES, tmp_path, port=29567)
    assert_resumed_bit_identical(results, tmp_path, CASES)


@pytest.fixture
def one_process_group():
    started_here = not dist.is_initialized()
    if started_here:
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/rendezvous", rank=0, world_size=1)
    yield
    if started_here:
        dist.destroy_process_group()


def small_sharded_model():
    from mmpos.models import DiT
    from mmpos.ops.sharding import fully_shard_blocks

    torch.manual_seed(0)
    model = DiT(sample_size=4, patch_size=2, in_channels=3, hidden_size=16, depth=1, num_heads=2, num_classes=2,
                pe="rope_mixed").double()  # fmt: skip
    fully_shard_blocks(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_a_checkpoint_is_written_atomically_and_never_overwritten_unless_told(tmp_path, one_process_group):
    model, optimizer = small_sharded_model()
    target = tmp_path / "checkpoint-1"
    assert save_sharded_checkpoint(target, model, optimizer, extra={"step": 1}) == target
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]  # no .partial left behind
    assert {".metadata", "sharded_checkpoint.json", "rng_0.json"} <= {p.name for p in target.iterdir()}
    with pytest.raises(FileExistsError, match="checkpoint-1 exists; pass overwrite=True"):
        save_sharded_checkpoint(target, model, optimizer)
    save_sharded_checkpoint(target, model, optimizer, extra={"step": 2}, overwrite=True)
    assert load_sharded_checkpoint(target, *small_sharded_model()) == {"step": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    with pytest.raises(TypeError, match="extra must hold JSON values"):
        save_sharded_checkpoint(tmp_path / "other", model, optimizer, extra={"step": torch.ones(1)})


def test_a_missing_or_incomplete_checkpoint_is_refused_by_name(tmp_path, one_process_group):
    model, optimizer = small_sharded_model()
    with pytest.raises(FileNotFoundError, match="nowhere does not exist"):
        load_sharded_checkpoint(tmp_path / "nowhere", model, optimizer)
    partial = tmp_path / ".checkpoint-3.partial"
    partial.mkdir()
    with pytest.raises(IncompleteCheckpointError, match=r"unfinished checkpoint \(.partial\)"):
        load_sharded_checkpoint(partial, model, optimizer)
    save_sharded_checkpoint(tmp_path / "checkpoint-3", model, optimizer)
    (tmp_path / "checkpoint-3" / "sharded_checkpoint.json").unlink()  # as if its writer had died before the rename
    with pytest.raises(IncompleteCheckpointError, match="checkpoint-3: not a complete sharded checkpoint"):
        load_sharded_checkpoint(tmp_path / "checkpoint-3", model, optimizer)


class RunsACommand:  # a pickle payload: unpickling it would call os.system
    def __reduce__(self):
        import os

        return os.system, ("echo tampered > tampered.txt",)


def test_a_tampered_metadata_pickle_is_refused_without_running_it(tmp_path, one_process_group, monkeypatch):
    """DCP's ``.metadata`` is a pickle: the loader admits DCP's metadata classes only, so a folder whose metadata
    calls a function is refused naming it, and the function never runs. The genuine file loads (above)."""
    import pickle

    model, optimizer = small_sharded_model()
    target = save_sharded_checkpoint(tmp_path / "checkpoint-1", model, optimizer)
    (target / ".metadata").write_bytes(pickle.dumps(RunsACommand()))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(IncompleteCheckpointError, match=r"\.metadata: refused \(posix\.system is not part of"):
        load_sharded_checkpoint(target, *small_sharded_model())
    assert not (tmp_path / "tampered.txt").exists()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed support")
def test_a_2_process_checkpoint_of_another_encoding_is_refused_by_name(tmp_path):
    """Saved by 2 processes from a DiT with ``rope_mixed``, resumed by 2 processes into one built with
    ``rope_axial``: every process refuses it naming both encodings (was: loaded, learned tables dropped)."""
    import json
    import os
    import subprocess
    import sys

    from tests.workers import resume_worker

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for phase, case in (("save", "dit:rope_mixed"), ("resume", "dit:rope_axial")):
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29571"]
        command += [resume_worker.__file__, "fsdp", phase, json.dumps([case]), str(tmp_path)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        if phase == "save":
            (tmp_path / "dit-rope_mixed").rename(tmp_path / "dit-rope_axial")  # where the resume looks
    for rank in (0, 1):
        error = json.loads((tmp_path / f"rank{rank}.resume.json").read_text())["dit:rope_axial"].get("error", "")
        assert error.startswith("ShardedCheckpointError: "), error
        assert "saved with encoding rope_mixed, this model has rope_axial" in error, error
