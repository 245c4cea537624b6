"""Reference models: a class-conditional DiT with any mmpos encoding, its sampler and training loss."""

from .dit import DIT_PRESETS, DiT
from .dit_sampling import sample_dit
from .dit_training import ProceduralShapes, diffusion_loss, make_noise_scheduler
from .ema import EMA

__all__ = ["DIT_PRESETS", "DiT", "sample_dit", "EMA", "ProceduralShapes", "diffusion_loss", "make_noise_scheduler"]
