"""One rank of test_train_vit's 2-process run: trains through ``train_vit`` and writes ``rank{R}.json`` with
the (epoch, sample index) pairs this rank read and a hash of its final weights."""

import hashlib
import json
import sys
from pathlib import Path

import torch

import mmpos.training.tasks.vit as vit_train
from mmpos.training.task_configs import ViTConfig
from mmpos.training.vit_data import SeededSamples

config_path, run_dir, out_dir = sys.argv[1:4]
record = {"indices": []}
original_getitem = SeededSamples.__getitem__


def recording_getitem(self, index):
    record["indices"].append((self.epoch, int(index)))
    return original_getitem(self, index)


def recording_evaluate(config, model, accelerator, *args, **kwargs):
    weights = accelerator.unwrap_model(model).state_dict()
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].detach().cpu().contiguous().numpy().tobytes())
    record.update(weights=digest.hexdigest(), num_processes=accelerator.num_processes)
    (Path(out_dir) / f"rank{accelerator.process_index}.json").write_text(json.dumps(record))
    return original_evaluate(config, model, accelerator, *args, **kwargs)


SeededSamples.__getitem__ = recording_getitem
original_evaluate = vit_train.evaluate_resolutions
vit_train.evaluate_resolutions = recording_evaluate
torch.set_num_threads(1)
vit_train.train_vit(ViTConfig(**{**json.loads(Path(config_path).read_text()), "out": run_dir}))
