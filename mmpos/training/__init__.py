"""Training workflows built on the public mmpos API (timm conversion, the mini-world data)."""
from .vit_config import DEFAULTS as VIT_DEFAULTS
from .vit_config import load_config
from .vit_eval import evaluate_resolutions, plot_results
from .vit_model import build_vit, freeze_except
from .vit_train import train_vit

__all__ = ["VIT_DEFAULTS", "build_vit", "evaluate_resolutions", "freeze_except", "load_config", "plot_results",
           "train_vit"]
