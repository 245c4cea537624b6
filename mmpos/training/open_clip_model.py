"""open_clip vision towers as classifiers for the ViT trainer: ``model: open_clip:ViT-B-32``.

``pretrained`` is an open_clip tag (``"openai"``, ``"laion2b_s34b_b79k"``) or false; ``model_kwargs`` go to
``open_clip.create_model`` (e.g. ``vision_cfg`` for a custom tower); ``img_size`` is its
``force_image_size``. The tower is converted with :func:`mmpos.integrations.open_clip.convert` and a linear
head maps its ``output_dim`` features to the classes.
"""

from __future__ import annotations

from torch import nn

from .scaffold.config import ConfigError
from .task_configs import ViTConfig

PREFIX = "open_clip:"


class OpenClipClassifier(nn.Module):
    """``head(visual(x))``: ``[B, 3, H, W]`` -> ``[B, num_classes]``."""

    def __init__(self, visual: nn.Module, num_classes: int):
        super().__init__()
        self.visual = visual
        self.head = nn.Linear(visual.output_dim, num_classes)
        self.num_classes = num_classes
        self.patch_size = tuple(visual.patch_size)
        self.mmpos_positions = getattr(visual, "mmpos_positions", None)
        self.mmpos_pe = getattr(visual, "mmpos_pe", None)

    def forward(self, x):
        return self.head(self.visual(x))

    def no_weight_decay(self) -> set[str]:
        names = {"visual.class_embedding", "visual.positional_embedding"}
        return names | {name for name, _ in self.named_parameters() if ".pe." in name or "mmpos_ape" in name}


def build_open_clip(config: ViTConfig, num_classes: int, options: dict) -> nn.Module:
    import open_clip
    from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD

    from ..integrations.open_clip import convert

    name = config.model[len(PREFIX) :]
    pretrained = config.pretrained or None
    if pretrained is True:
        raise ConfigError("pretrained: an open_clip model needs a pretrained tag (e.g. openai), not true")
    if config.ape == "resample":
        raise ConfigError("ape=resample is not supported for open_clip towers (use drop or keep)")
    clip = open_clip.create_model(
        name, pretrained=pretrained, force_image_size=config.img_size, **(config.model_kwargs or {})
    )
    visual = clip.visual
    if config.pe is not None:
        convert(visual, pe=config.pe, abs_pos="keep" if config.ape == "keep" else "remove", **options)
    model = OpenClipClassifier(visual, num_classes)
    model.pretrained_cfg = {
        "mean": OPENAI_DATASET_MEAN,
        "std": OPENAI_DATASET_STD,
        "interpolation": "bicubic",
        "crop_pct": 1.0,
        "input_size": (3, config.img_size, config.img_size),
    }
    return model
