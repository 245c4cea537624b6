"""Reference class-conditional DiT (Peebles & Xie 2023, arXiv 2212.09748) with any mmpos encoding.

adaLN-Zero blocks: the conditioning ``c = t_emb + y_emb`` regresses per-block shift, scale and gate for the
attention and MLP branches; gates and the output layer start at zero, so every block starts as the
identity. The positional encoding is a registry name: absolute ones (``ape_sincos``, the paper's, and
``ape_learned``) are added to the patch tokens; rotary ones (``rope_axial``, ``rope_mixed``, and any
encoding registered later) act on q and k in every block (one shared instance, or one per block for
encodings with parameters); the model builds their tables once per forward and the blocks only apply them.
Built on diffusers' ``ModelMixin``/``ConfigMixin``: ``save_pretrained`` and ``from_pretrained`` round-trip,
schedulers and training utilities apply.

    model = DiT.from_preset("DiT-S/2", pe="rope_mixed", sample_size=32, num_classes=10)
    out = model(latents, timesteps, class_labels).sample     # [B, C, H, W]
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.embeddings import TimestepEmbedding, Timesteps
from diffusers.models.modeling_outputs import Transformer2DModelOutput
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from .._validation import check_choice, check_positive_int
from ..coords.grids import MODES, image_grid
from ..encodings.base import PEKind
from ..encodings.per_block import check_fits, create_block_pes, no_weight_decay_names
from ..encodings.registry import pe_class
from ..ops.forward_tables import ForwardTables, run_dtype
from ..ops.tables import library_owned

# name: (depth, hidden_size, num_heads), as in the DiT paper (Table 1); patch 2, 4 or 8 after the slash.
DIT_SIZES = {"S": (12, 384, 6), "B": (12, 768, 12), "L": (24, 1024, 16), "XL": (28, 1152, 16)}
DIT_PRESETS = {
    f"DiT-{size}/{patch}": dict(depth=d, hidden_size=h, num_heads=n, patch_size=patch)
    for size, (d, h, n) in DIT_SIZES.items()
    for patch in (2, 4, 8)
}


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: ``x * (1 + scale) + shift`` with per-sample ``shift, scale`` ``[B, C]``."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class LabelEmbedding(nn.Module):
    """Class labels to vectors; label ``num_classes`` is the null class used for classifier-free guidance,
    and in training each label is replaced by it with probability ``dropout_prob``."""

    def __init__(self, num_classes: int, hidden_size: int, dropout_prob: float):
        super().__init__()
        self.num_classes, self.dropout_prob = num_classes, dropout_prob
        self.embedding = nn.Embedding(num_classes + 1, hidden_size)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        if labels.dtype not in (torch.int64, torch.int32) or labels.dim() != 1:
            raise ValueError(f"class_labels must be a 1D integer tensor, got {labels.dtype} {tuple(labels.shape)}")
        if bool(((labels < 0) | (labels > self.num_classes)).any()):
            raise ValueError(f"class_labels must be in [0, {self.num_classes}] ({self.num_classes} = null class)")
        if self.training and self.dropout_prob > 0:
            drop = torch.rand(labels.shape, device=labels.device) < self.dropout_prob
            labels = torch.where(drop, torch.full_like(labels, self.num_classes), labels)
        return self.embedding(labels)


class DiTAttention(nn.Module):
    """Multi-head self-attention; a rotary encoding (if given) turns q and k before SDPA, with its table from
    the forward's :class:`~mmpos.ops.forward_tables.ForwardTables`."""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor, pe: nn.Module | None, tables: ForwardTables | None) -> torch.Tensor:
        B, L, C = x.shape
        folds = pe is not None and pe.capabilities.folds_into_qkv and pe.folds_into(x, self.qkv)  # HARoPE
        qkv = F.linear(x, *pe.fold_into_qkv(self.qkv.weight, self.qkv.bias)) if folds else self.qkv(x)
        q, k, v = qkv.reshape(B, L, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if folds:
            q, k = pe.rotate_mapped_qk(q, k, tables.get(pe, q))
        elif pe is not None:
            q, k = pe.rotate_qk(q, k, tables.get(pe, q))
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, L, C))


class DiTBlock(nn.Module):
    """adaLN-Zero transformer block."""

    def __init__(self, hidden_size: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = DiTAttention(hidden_size, num_heads)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        hidden = int(hidden_size * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(hidden_size, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, hidden_size)
        )
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))

    def forward(self, x, c, pe, tables):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa), pe, tables)
        return x + gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))


class DiTFinalLayer(nn.Module):
    def __init__(self, hidden_size: int, patch_size: int, out_channels: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 2 * hidden_size))

    def forward(self, x, c):
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm(x), shift, scale))


class DiT(ModelMixin, ConfigMixin):
    """Class-conditional DiT.

    Args:
        sample_size: training height and width of the input (latents or pixels); other sizes divisible by
            ``patch_size`` work too (the encoding follows the grid; ``ape_learned`` is resampled).
        patch_size, in_channels, out_channels (default ``in_channels``), hidden_size, depth, num_heads,
            mlp_ratio: architecture (see :data:`DIT_PRESETS`).
        num_classes: classes; label ``num_classes`` is the null (unconditional) class.
        class_dropout_prob: label dropout in training, for classifier-free guidance.
        pe: registered encoding name (``mmpos.list_pes()``); ``pe_options``: its options (JSON-able).
        share_pe: rotary only: one instance for all blocks, one per block, or ``None`` (per block iff the
            encoding has parameters).
        grid_mode: patch coordinates (``"index"``, ``"centered"``, ``"normalized"``).
    """

    _supports_gradient_checkpointing = True
    _no_split_modules = ["DiTBlock"]

    @register_to_config
    def __init__(
        self,
        sample_size: int = 32,
        patch_size: int = 2,
        in_channels: int = 4,
        out_channels: int | None = None,
        hidden_size: int = 1152,
        depth: int = 28,
        num_heads: int = 16,
        mlp_ratio: float = 4.0,
        num_classes: int = 1000,
        class_dropout_prob: float = 0.1,
        pe: str = "ape_sincos",
        pe_options: dict | None = None,
        share_pe: bool | None = None,
        grid_mode: str = "index",
    ):
        super().__init__()
        for name, value in dict(
            sample_size=sample_size,
            patch_size=patch_size,
            in_channels=in_channels,
            hidden_size=hidden_size,
            depth=depth,
            num_heads=num_heads,
            num_classes=num_classes,
        ).items():
            check_positive_int(name, value)
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
        if sample_size % patch_size:
            raise ValueError(f"sample_size={sample_size} must be divisible by patch_size={patch_size}")
        check_choice("grid_mode", grid_mode, MODES)
        if pe == "ape_learned" and grid_mode != "index":
            raise ValueError(f"ape_learned indexes its table by patch index: grid_mode='index' (got {grid_mode!r})")
        self.out_channels = out_channels or in_channels
        self.gradient_checkpointing = False
        self.patch_embed = nn.Conv2d(in_channels, hidden_size, patch_size, stride=patch_size)
        self.time_proj = Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.time_embed = TimestepEmbedding(256, hidden_size)
        self.label_embed = LabelEmbedding(num_classes, hidden_size, class_dropout_prob)
        self.blocks = nn.ModuleList([DiTBlock(hidden_size, num_heads, mlp_ratio) for _ in range(depth)])
        self.final_layer = DiTFinalLayer(hidden_size, patch_size, self.out_channels)
        self.pe_kind = pe_class(pe).kind
        self.abs_pe, self.rotary_pes, self._pe_index = None, nn.ModuleList(), [None] * depth
        self._build_pe(pe, dict(pe_options or {}), share_pe)
        self._coords_cache: dict = {}
        self._init_weights()

    @classmethod
    def from_preset(cls, name: str, **config) -> "DiT":
        """``DiT.from_preset("DiT-XL/2", pe="rope_axial", sample_size=32)``; presets: :data:`DIT_PRESETS`."""
        check_choice("preset", name, tuple(DIT_PRESETS))
        return cls(**{**DIT_PRESETS[name], **config})

    def _build_pe(self, pe, options, share_pe):
        cfg = self.config
        grid = (cfg.sample_size // cfg.patch_size,) * 2
        where = f"DiT (head_dim={cfg.hidden_size // cfg.num_heads}, num_heads={cfg.num_heads})"
        if self.pe_kind == PEKind.ABSOLUTE:
            facts = dict(embed_dim=cfg.hidden_size, num_axes=2, num_prefix_tokens=0, grid_size=grid)
            self.abs_pe = create_block_pes(pe, 1, facts, options, share=True, where=where)[0]
        elif self.pe_kind == PEKind.ROTARY:
            head_dim = cfg.hidden_size // cfg.num_heads
            facts = dict(head_dim=head_dim, num_heads=cfg.num_heads, num_axes=2, num_prefix_tokens=0, seq_dim=-2)
            pes = create_block_pes(pe, cfg.depth, facts, options, share=share_pe, where=where)
            for i, block_pe in enumerate(pes):
                check_fits(block_pe, head_dim, 2, where)
                if block_pe not in list(self.rotary_pes):
                    self.rotary_pes.append(block_pe)
                self._pe_index[i] = len(self.rotary_pes) - 1
        elif options:
            raise TypeError(f"encoding {pe!r} takes no options, got {sorted(options)}")

    def _init_weights(self):
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.xavier_uniform_(self.patch_embed.weight.view(self.patch_embed.weight.shape[0], -1))
        nn.init.zeros_(self.patch_embed.bias)
        nn.init.normal_(self.label_embed.embedding.weight, std=0.02)
        nn.init.normal_(self.time_embed.linear_1.weight, std=0.02)
        nn.init.normal_(self.time_embed.linear_2.weight, std=0.02)
        for layer in [b.adaLN_modulation[-1] for b in self.blocks] + [
            self.final_layer.adaLN_modulation[-1],
            self.final_layer.linear,
        ]:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def grid_coords(self, height: int, width: int, device) -> torch.Tensor:
        """``[height * width, 2]`` patch coordinates (cached, so encodings' tables hit by identity)."""
        key = (height, width, str(device))
        if key not in self._coords_cache:
            grid = image_grid(height, width, mode=self.config.grid_mode, device=device)
            self._coords_cache[key] = library_owned(grid)
        return self._coords_cache[key]

    def no_weight_decay(self) -> set[str]:
        """Encoding parameters that should not be weight-decayed (timm/optimizer convention)."""
        return no_weight_decay_names(self)

    def forward(self, sample: torch.Tensor, timestep, class_labels: torch.Tensor, return_dict: bool = True):
        """``sample`` ``[B, in_channels, H, W]`` (H, W divisible by the patch size), ``timestep`` scalar or
        ``[B]`` (DDPM steps 0..999 or flow-matching ``sigma * 1000``), ``class_labels`` ``[B]`` long.
        Returns ``Transformer2DModelOutput(sample=[B, out_channels, H, W])``."""
        x, grid = self._patchify(sample)
        coords = self.grid_coords(*grid, x.device)
        if self.abs_pe is not None:
            x = self._add_absolute(x, coords, grid)
        c = self._condition(timestep, class_labels, sample)
        # tables once per forward, outside the (possibly checkpointed) blocks; coordinates checked once
        tables = ForwardTables(self.rotary_pes, coords, run_dtype(x), x.device) if len(self.rotary_pes) else None
        for i, block in enumerate(self.blocks):
            pe = None if self._pe_index[i] is None else self.rotary_pes[self._pe_index[i]]
            if torch.is_grad_enabled() and self.gradient_checkpointing:
                x = self._gradient_checkpointing_func(block, x, c, pe, tables)
            else:
                x = block(x, c, pe, tables)
        out = self._unpatchify(self.final_layer(x, c), grid)
        return Transformer2DModelOutput(sample=out) if return_dict else (out,)

    def _patchify(self, sample):
        cfg = self.config
        if sample.dim() != 4 or sample.shape[1] != cfg.in_channels:
            raise ValueError(f"sample has shape {tuple(sample.shape)}; expected [B, {cfg.in_channels}, H, W]")
        h, w = sample.shape[-2:]
        if h % cfg.patch_size or w % cfg.patch_size:
            raise ValueError(f"sample size {h}x{w} is not divisible by patch_size={cfg.patch_size}")
        x = self.patch_embed(sample)
        return x.flatten(2).transpose(1, 2), (h // cfg.patch_size, w // cfg.patch_size)

    def _add_absolute(self, x, coords, grid):
        ape = self.abs_pe
        if getattr(ape, "grid_size", grid) != grid:  # learned table on another grid: resample it
            return x + ape.resample(grid).to(x.dtype)
        return ape(x, coords)

    def _condition(self, timestep, class_labels, sample):
        t = torch.as_tensor(timestep, device=sample.device)
        if t.dim() == 0:
            t = t.expand(sample.shape[0])
        if t.shape != (sample.shape[0],):
            raise ValueError(f"timestep has shape {tuple(t.shape)}; expected a scalar or [{sample.shape[0]}]")
        t_emb = self.time_embed(self.time_proj(t).to(self.time_embed.linear_1.weight.dtype))
        return t_emb + self.label_embed(class_labels.to(sample.device))

    def _unpatchify(self, x, grid):
        p, c = self.config.patch_size, self.out_channels
        h, w = grid
        x = x.reshape(x.shape[0], h, w, p, p, c)
        return torch.einsum("bhwpqc->bchpwq", x).reshape(x.shape[0], c, h * p, w * p)
