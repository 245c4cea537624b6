"""One process of a world trainer under torchrun (test_world_training): ``KIND`` (image / video / nvs) with the JSON
``SPEC``; writes ``rank{R}.safetensors`` (final weights, and EMA for image) and ``rank{R}.json`` (the files this
process wrote, its losses)."""

import json
import sys
from pathlib import Path

import safetensors.torch
import torch

import mmpos.training.scaffold.checkpoint as checkpoint_module

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests` is a package
kind, spec, records = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
written = []


def recording(function, name_of):
    def wrapper(*args, **kwargs):
        written.append(Path(name_of(*args, **kwargs)).name)
        return function(*args, **kwargs)

    return wrapper


checkpoint_module.write_json = recording(checkpoint_module.write_json, lambda path, value: path)
checkpoint_module.write_tensors = recording(checkpoint_module.write_tensors, lambda path, tensors: path)
safetensors.torch.save_model = recording(safetensors.torch.save_model, lambda model, path, *a, **k: path)
torch.set_num_threads(1)
tensors = {}
if kind == "image":
    import mmpos.training.tasks.world_image as trainer_module
    from mmpos.training.task_configs import WorldImageConfig
    from mmpos.training.tasks.world_image import train

    trainer_module.export_model = recording(trainer_module.export_model, lambda task, *a: f"world-{task}")
    captured = {}
    original_init = trainer_module.WorldTrainer.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        captured["trainer"] = self

    trainer_module.WorldTrainer.__init__ = init
    train(WorldImageConfig(**spec["config"]), spec["out"], progress=False)
    trainer = captured["trainer"]
    accelerator, losses = trainer.accelerator, trainer.history
    tensors = {f"model.{k}": v for k, v in trainer.raw.state_dict().items()}
    tensors.update({f"ema.{k}": v for k, v in trainer.ema.state_dict().items()})
elif kind == "video":
    from tests.training.test_world_training import video_run

    state, stage = video_run(Path(spec["out"]), spec["recipe"], spec.get("base"))
    accelerator, losses = stage.accelerator, state["losses"]
    tensors = {f"model.{k}": v for k, v in stage.trained.state_dict().items()}
else:
    from tests.training.test_world_training import nvs_run

    model, state, accelerator = nvs_run(Path(spec["out"]), spec["recipe"])
    losses = state["losses"]
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
rank = accelerator.process_index
safetensors.torch.save_file(
    {k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(records / f"rank{rank}.safetensors")
)
(records / f"rank{rank}.json").write_text(
    json.dumps({"written": written, "losses": losses, "num_processes": accelerator.num_processes})
)
