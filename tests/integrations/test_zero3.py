"""DeepSpeed ZeRO-3 with converted timm ViTs and the reference DiT: 2 processes (torchrun, gloo, DeepSpeed's CPU
accelerator) equal to one process without ZeRO on the whole batches, three optimizer steps (fp32: DeepSpeed partitions
fp16, bf16 or fp32 only), with the DeepSpeed config accelerate makes of configs/accelerate/zero3.yaml; and resume (DeepSpeed's checkpoint,
bit-identical). deepspeed is the optional `deepspeed` extra (`make test` installs it): the 2-process tests skip
where it is not installed.

ZeRO-3 gathers a parameter that a forward reads outside its own module's forward (an encoding's table built in the
block's attention, or the DiT's encodings read by the model itself) and registers it with the module that runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.workers.resume_worker import assert_resumed_bit_identical, run_resume
from tests.workers.zero3_worker import CONFIG, zero3_config

WORKER = Path(__file__).parents[1] / "workers" / "zero3_worker.py"
STEPS = 3
NO_DEEPSPEED = "deepspeed is not installed (the `deepspeed` extra: docs/scaling.md, DeepSpeed ZeRO-3)"
# learned encodings in the blocks (timm), on the model (the DiT's rotary_pes and abs_pe), folded into qkv (harope)
CASES = ["timm:rope_mixed", "timm:comrope_ap", "timm:ape_learned", "dit:rope_mixed", "dit:harope", "dit:ape_learned"]


def test_the_accelerate_zero3_config_is_zero3_without_offload():
    """accelerate's own loader and DeepSpeedPlugin on configs/accelerate/zero3.yaml (no deepspeed needed)."""
    from accelerate.commands.config.config_args import load_config_from_file

    assert load_config_from_file(str(CONFIG)).distributed_type == "DEEPSPEED"
    config = zero3_config(micro_batch=2, processes=2)
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == zero["offload_optimizer"]["device"] == "none"
    assert config["train_batch_size"] == 4 and config["gradient_clipping"] == 1.0


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed support")
def test_zero3_equals_one_process(tmp_path):
    pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29565"]
    command += [str(WORKER), json.dumps(CASES), str(STEPS), str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in (0, 1):
        results = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for case in CASES:
            result = results[case]
            assert "error" not in result, (case, result.get("error"))
            assert result["partitioned"], case  # every parameter was partitioned before the first forward
            # fp32 round-off of another reduction order (measured <= 1e-6 on outputs of size ~1)
            assert result["out"] < 1e-5 and result["params"] < 1e-5, (case, result)
            assert result["encoding_params"] and result["encoding_step"] > 1e-6, (case, result)  # it trained


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch without distributed support")
def test_zero3_resume_is_bit_identical(tmp_path):
    """DeepSpeed's save_checkpoint / load_checkpoint (plus each rank's generators), AdamW, fp32: 2 steps, a
    checkpoint, 2 more equal bit for bit a new launch that loads it and takes the 2 steps, and 4 steps in one go."""
    pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)
    cases = ["timm:rope_mixed", "dit:harope"]
    assert_resumed_bit_identical(run_resume("zero3", cases, tmp_path, port=29569), tmp_path, cases)
