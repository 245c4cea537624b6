"""Where the world demo's and the editing evaluation's models come from: the trained world checkpoints (default) or ``from_pretrained`` FLUX models.

    ModelSource()                                      # assets/: world-vae, world-t2i, world-fill, world-kontext
    ModelSource(models=HUB_FLUX, device="cuda", dtype="bfloat16", image_size=512)   # FLUX.1 dev / Fill / Kontext

With ``models``, only those tasks run, each loaded with :func:`mmpos.pipelines.load_pipeline` (a path or hub id,
the text encoders included) and fed the world's captions as prompts; without, every task whose world checkpoint
is there. One model per task is loaded once: the methods on the same model (generate and band on t2i) share its
components.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mmpos._validation import check_choice
from mmpos.models.world.image import DEFAULT_ASSETS, TASKS, load_world_pipeline, trained_image_size

from ..edits import get_edit, list_edits, resolve_pipeline
from ..loading import DTYPES, load_pipeline, pipeline_class

HUB_FLUX = {
    "t2i": "black-forest-labs/FLUX.1-dev",
    "fill": "black-forest-labs/FLUX.1-Fill-dev",
    "kontext": "black-forest-labs/FLUX.1-Kontext-dev",
}
GENERATE = "generate"  # text to image with the stock FluxPipeline; every other method is a registered edit
WORLD_GUIDANCE = {"t2i": 3.0, "fill": None, "kontext": 3.0}  # true CFG of the world models (Fill: none)
PRETRAINED_IMAGE_SIZE = 512


def task_of_method(method: str) -> str:
    """The task (``t2i``, ``fill``, ``kontext``) whose model runs ``method`` (generate or an edit method)."""
    check_choice("method", method, (GENERATE, *list_edits()))
    return "t2i" if method == GENERATE else get_edit(method).world_task


def __getattr__(name):
    if name == "TASK_OF_METHOD":  # method -> task, of the methods registered now
        return {method: task_of_method(method) for method in (GENERATE, *list_edits())}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def world_pipeline_class(method: str, task: str):
    """The pipeline class of ``method`` on the world model of ``task`` (its stock class, family flux)."""
    if method == GENERATE:
        return pipeline_class(GENERATE)
    from mmpos.models.world.image import PIPELINES

    edit = get_edit(method)
    return edit.pipeline_class(
        resolve_pipeline(edit, [PIPELINES[task].__name__, "flux"], where=f"the world {task} model")
    )


def trained_tasks(root=None) -> list[str]:
    """The tasks whose models (and the VAE) are under ``root`` (default: the shipped assets)."""
    root = Path(root) if root is not None else DEFAULT_ASSETS
    if not (root / "world-vae" / "config.json").is_file():
        return []
    return [t for t in TASKS if (root / f"world-{t}" / "transformer" / "config.json").is_file()]


def parse_model_args(values) -> dict:
    """``["flux"]`` -> :data:`HUB_FLUX`; ``["t2i=PATH", "fill=ID", ...]`` -> ``{task: path or id}``."""
    models = {}
    for value in values or []:
        if value == "flux":
            models.update(HUB_FLUX)
            continue
        task, sep, path = value.partition("=")
        if not sep or not path:
            raise ValueError(
                f"--model {value!r}: expected TASK=PATH_OR_HUB_ID with TASK one of {list(TASKS)}, "
                "or 'flux' for the three FLUX.1 models"
            )
        check_choice("--model task", task, TASKS)
        models[task] = path
    return models


@dataclass
class ModelSource:
    root: str | Path | None = None  # world checkpoint folder (None: the shipped assets)
    models: dict = field(default_factory=dict)  # task -> from_pretrained path or hub id
    device: str = "cpu"
    dtype: str = "float32"
    image_size: int | None = None  # None: the world models' trained size, 512 for the others
    _loaded: dict = field(default_factory=dict, repr=False)  # task -> the first pipeline built on its model

    def tasks(self) -> list[str]:
        """Tasks with a model: every ``models`` task, plus the world's when ``models`` is empty."""
        return list(self.models) if self.models else trained_tasks(self.root)

    def describe(self) -> str:
        world = "small Flux-class models trained on mmpos.world"
        return "; ".join(
            f"{task}: {self.models[task]}" if task in self.models else f"{task}: {world}" for task in self.tasks()
        )

    def is_world(self, task: str) -> bool:
        return task not in self.models

    def size(self, task: str) -> int:
        if self.image_size is not None:
            return self.image_size
        return trained_image_size(self.root, task) if self.is_world(task) else PRETRAINED_IMAGE_SIZE

    def guidance(self, task: str):
        """True-CFG scale of a world model; None (the pipeline's default) for the others."""
        return WORLD_GUIDANCE[task] if self.is_world(task) else None

    def pipeline(self, method: str):
        """The pipeline for ``method`` (generate, or a registered edit method: band, transplant, loose, ...),
        progress bar off; the task's model is loaded on the first call and shared by later ones."""
        task = task_of_method(method)
        if self.is_world(task):
            cls = world_pipeline_class(method, task)
        else:
            cls = pipeline_class(method, self.models[task] if method != GENERATE else None)
        if task in self._loaded:
            pipe = cls(**self._loaded[task].components)
        elif self.is_world(task):
            check_choice("dtype", self.dtype, tuple(DTYPES))
            pipe = load_world_pipeline(task, self.root, self.device, DTYPES[self.dtype], pipeline_class=cls)
        else:
            pipe = load_pipeline(method, self.models[task], self.dtype, self.device)
        self._loaded.setdefault(task, pipe)
        pipe.set_progress_bar_config(disable=True)
        return pipe


def load_world_edit(method: str, root=None, device="cpu"):
    """The editing pipeline for ``method`` (transplant, loose, band, ...) on the world model it needs."""
    return ModelSource(root, device=device).pipeline(method)
