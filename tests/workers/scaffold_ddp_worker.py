"""One process of a scaffold task under torchrun (test_training_scaffold): trains ``TASK`` with ``ARGV`` and writes
``rank{R}.safetensors`` (its final weights and EMA) and ``rank{R}.json`` (the files this process wrote)."""

import json
import os
import sys
from pathlib import Path

import safetensors.torch
import torch

import mmpos.training.scaffold.checkpoint as checkpoint_module
from mmpos.training.scaffold.config import build_parser, parse_config
from mmpos.training.scaffold.loop import JsonLog, train

task_name, argv, records = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
written = []


def recording(function, name_of):
    def wrapper(*args, **kwargs):
        name = name_of(*args, **kwargs)
        if name is not None:
            written.append(Path(name).name)
        return function(*args, **kwargs)

    return wrapper


checkpoint_module.write_json = recording(checkpoint_module.write_json, lambda path, value: path)
checkpoint_module.write_tensors = recording(checkpoint_module.write_tensors, lambda path, tensors: path)
safetensors.torch.save_model = recording(safetensors.torch.save_model, lambda model, path, *a, **k: path)
JsonLog.write = recording(JsonLog.write, lambda self, row: self.path if self.enabled else None)
if task_name == "dit":
    from mmpos.training.tasks.dit import DiTConfig as Config
    from mmpos.training.tasks.dit import DiTTask as Task

    Task.finish = recording(Task.finish, lambda self, *a: "finish")
else:
    from mmpos.training.tasks.camera_adapter import CameraAdapterConfig as Config
    from mmpos.training.tasks.camera_adapter import CameraAdapterTask as Task
torch.set_num_threads(1)
config, args = parse_config(Config, build_parser(Config, "worker"), argv)
if os.environ.get("SCAFFOLD_NODE_LOCAL_OUT"):  # stands for a node-local --out: the same name, another folder
    config.out = str(Path(config.out) / f"node{os.environ['RANK']}")
result = train(Task(config), args.resume, args.overwrite)
rank = result.accelerator.process_index
tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in result.model.state_dict().items()}
if result.ema is not None:
    tensors.update({f"ema.{k}": v.detach().cpu().contiguous() for k, v in result.ema.state_dict().items()})
safetensors.torch.save_file(tensors, str(records / f"rank{rank}.safetensors"))
(records / f"rank{rank}.json").write_text(
    json.dumps({"written": written, "losses": result.losses, "num_processes": result.accelerator.num_processes})
)
