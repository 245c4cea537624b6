"""HARoPE (Head-wise Adaptive RoPE, CVPR 2026, arXiv 2510.10489): a learned linear map before any rotary map.

Per head ``h``, ``M_h = U_h diag(s_h) V_h^T`` with ``U, V = exp(skew)`` (rotations) and ``s > 0``. Queries
become ``R(p) M q`` and keys ``R(p) M^-T k``, so a logit is ``q^T M^T R(p_k - p_q) M^-T k``: relative for any
``M`` (``R`` is the wrapped encoding's rotation) and ``q^T k`` at zero offset. ``M^-T = U diag(1/s) V^T`` is
built analytically, never by inversion.

Differences from the reference parameterisation (each keeps its function class):
- only the ``d (d - 1) / 2`` free entries of each skew generator are stored (the reference stores full
  ``d x d`` matrices whose symmetric half is unused); :meth:`HARoPE.load_reference_parameters` converts;
- ``s = max(softplus(sigma) / log 2, eps)`` with ``sigma = 0`` at init, so ``M = I`` exactly and the
  encoding equals the wrapped one bit for bit at initialisation (the reference's ``softplus + 1e-6``
  starts at ``(1 + 1e-6) I``).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn
from torch.nn import functional as F
from torch.types import Device

from .._validation import check_positive_int
from ..ops.skew import matmul_safe_dtype, num_upper, skew_from_upper, upper_of
from ..ops.tables import frozen_key
from ..ops.taylor_exp import taylor_matrix_exp
from .base import Capabilities, PEKind, parameters_key
from .per_block import fitting_options
from .registry import create_pe, pe_class, register_pe
from .rotary_base import RotaryPE, Table, check_key_or_none


@register_pe("harope")
class HARoPE(RotaryPE):
    """HARoPE: a learned per-head map M on q and M^-T on k before any rotary encoding.

    Args:
        head_dim: channels per head (``M`` is ``head_dim x head_dim``).
        num_heads: heads; each has its own ``M``.
        base: the rotary encoding applied after ``M``: a registered name (default ``"rope_axial"``, 2D axial
            RoPE as in the reference DiT) or a :class:`RotaryPE` instance (e.g. Flux's 3-axis layout).
        base_options: options for ``create_pe(base, head_dim=head_dim, ...)`` (``num_heads`` is passed on
            when the base takes it), e.g. ``{"axes_dims": (16, 56, 56)}``.
        eps: floor of the singular values ``s``.
        num_prefix_tokens, seq_dim: passed on to a named base (default: the base's own); with a base instance they
            must agree with it. Integrations (timm, the DiT) set them from the model.
        fold_qkv: let attention modules with a fused qkv projection and no qk-norm (timm ``Attention``, the DiT)
            fold ``M`` into the projection's weights when a call has at least as many tokens as channels
            (:meth:`folds_into`); ``False`` applies ``M`` to every token (equal in exact arithmetic).
    Parameters: ``u_skew``, ``v_skew`` ``[num_heads, head_dim * (head_dim - 1) / 2]`` (zeros), ``sigma``
    ``[num_heads, head_dim]`` (zeros). ``M`` and ``M^-T`` are cached while no gradient is needed.
    Capabilities: the base's (relative when it is), plus learnable, plus ``folds_into_qkv`` (with ``fold_qkv``).
    """

    description = "HARoPE: a learned per-head map M on q and M^-T on k around any rotary encoding."

    example_options = dict(head_dim=16, num_heads=2)
    capabilities = Capabilities(relative=True, learnable=True, folds_into_qkv=True)

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        base: str | RotaryPE = "rope_axial",
        base_options: dict | None = None,
        eps: float = 1e-6,
        num_prefix_tokens: int | None = None,
        seq_dim: int | None = None,
        fold_qkv: bool = True,
    ):
        given = {k: v for k, v in (("num_prefix_tokens", num_prefix_tokens), ("seq_dim", seq_dim)) if v is not None}
        base = _build_base(base, head_dim, num_heads, base_options, given)
        super().__init__(head_dim, base.num_axes, base.layout, base.num_prefix_tokens, base.seq_dim)
        check_positive_int("num_heads", num_heads)
        if base.head_dim != head_dim:
            raise ValueError(f"base encoding has head_dim={base.head_dim}; expected head_dim={head_dim}")
        if getattr(base, "num_heads", num_heads) != num_heads:
            raise ValueError(f"base encoding has num_heads={base.num_heads}; expected num_heads={num_heads}")
        if not eps > 0:
            raise ValueError(f"eps must be positive, got {eps}")
        self.base, self.num_heads, self.eps, self.fold_qkv = base, num_heads, float(eps), bool(fold_qkv)
        self.u_skew = nn.Parameter(torch.zeros(num_heads, num_upper(head_dim)))
        self.v_skew = nn.Parameter(torch.zeros(num_heads, num_upper(head_dim)))
        self.sigma = nn.Parameter(torch.zeros(num_heads, head_dim))
        self._cached: tuple | None = None
        self.capabilities = replace(
            base.capabilities,
            learnable=True,
            takes_extrapolation=False,
            reads_image_grid=False,
            folds_into_qkv=self.fold_qkv,
        )

    # ----- the head-wise matrices ---------------------------------------------------------------------------
    def singular_values(self) -> torch.Tensor:
        """``s`` ``[H, d]``: ``softplus(sigma) / log 2`` (1 at ``sigma = 0``), floored at ``eps``."""
        return (F.softplus(self.sigma) / math.log(2.0)).clamp_min(self.eps)

    def factors(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(U, s, V)``: ``U, V`` ``[H, d, d]`` rotations, ``s`` ``[H, d]``, computed in ``dtype`` with autocast
        off. The forward uses fp64 on CUDA for fp32 work (TF32 matmuls would visibly break the factors' orthogonality;
        docs/results.md, "Numbers behind implementation choices")."""
        with torch.autocast(self.sigma.device.type, enabled=False):
            generators = skew_from_upper(torch.stack([self.u_skew, self.v_skew]).to(dtype), self.head_dim)
            u, v = taylor_matrix_exp(generators)  # one batched call for both factors (its backward: docs/results.md)
            return u, self.singular_values().to(dtype), v

    def matrices(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """``(M, M^-T)``, each ``[H, d, d]``: ``U diag(s) V^T`` and ``U diag(1/s) V^T``."""
        u, s, v = self.factors(dtype)
        vt = v.transpose(-1, -2)
        return (u * s[:, None, :]) @ vt, (u / s[:, None, :]) @ vt

    def _matrices_for(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(M, M^-T)`` at the working precision of ``dtype`` activations, cached while no gradient is needed."""
        work = matmul_safe_dtype(torch.float64 if dtype == torch.float64 else torch.float32, self.sigma.device)
        key = parameters_key((self.u_skew, self.v_skew, self.sigma))
        if key is None:
            return self.matrices(work)
        key += (work,)
        if self._cached is None or self._cached[0] != key:
            with torch.no_grad():
                self._cached = (frozen_key(key), self.matrices(work))
        return self._cached[1]

    # ----- application -------------------------------------------------------------------------------------
    def transform(self, q: torch.Tensor, k: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(M q, M^-T k)`` per head, in the activations' dtype (no rotation); ``k=None`` gives ``(M q, None)``."""
        head_dim = -2 if self.seq_dim == -3 else -3
        for name, x in (("q", q), ("k", k)) if k is not None else (("q", q),):
            if x.dim() < 3 or x.shape[head_dim] != self.num_heads or x.shape[-1] != self.head_dim:
                raise ValueError(
                    f"{name} has shape {tuple(x.shape)}; expected {self.num_heads} heads of "
                    f"{self.head_dim} channels ({'[B, L, H, D]' if self.seq_dim == -3 else '[B, H, L, D]'})"
                    "; grouped keys (GQA) are not supported: M^-T of head h must meet M of head h"
                )
        m, m_inv_t = self._matrices_for(q.dtype)
        return _per_head_matmul(q, m, head_dim), None if k is None else _per_head_matmul(k, m_inv_t, head_dim)

    # ----- folded into a fused qkv projection -------------------------------------------------------------
    def folds_into(self, x: torch.Tensor, projection: nn.Linear) -> bool:
        """Whether folding ``M`` into ``projection`` (:meth:`fold_into_qkv`) is the cheaper way for input ``x``
        ``[B, N, C]``: folding costs ``d x d x C`` per head and call, applying ``M`` per token ``d x d`` per token,
        so it pays once a call has at least ``C`` tokens (a training batch; not one image at inference). Under
        ``torch.compile`` it always folds: a test on the token count would recompile when a size crosses it.
        Only a plain ``nn.Linear`` without hooks folds: LoRA and other adapters wrap or subclass it, and hooks
        watch its call, which folding bypasses."""
        plain = type(projection) is nn.Linear and not (projection._forward_hooks or projection._forward_pre_hooks)
        if not (self.fold_qkv and plain):
            return False
        return torch.compiler.is_compiling() or x.shape[0] * x.shape[1] >= projection.in_features

    def fold_into_qkv(
        self, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A fused ``qkv`` projection (``weight`` ``[3 * H * d, C]``: q, k, v rows, heads in order; ``bias``
        ``[3 * H * d]`` or ``None``) with ``M_h`` folded into the q rows of head ``h`` and ``M_h^-T`` into its k
        rows, so that it projects straight to ``M q`` and ``M^-T k`` (then :meth:`rotate_mapped_qk`). Only valid
        when nothing acts on q and k between the projection and the encoding (no qk-norm). Returns ``(weight,
        bias)``; the products run in fp32 (fp64 for fp64 weights), differentiable in both the weights and ``M``."""
        heads, d = self.num_heads, self.head_dim
        if weight.dim() != 2 or weight.shape[0] != 3 * heads * d:
            raise ValueError(
                f"weight has shape {tuple(weight.shape)}; expected a fused qkv projection "
                f"[{3 * heads * d}, C] for {heads} heads of {d} channels"
            )
        m, m_inv_t = self._matrices_for(weight.dtype)
        q, k, v = weight.unflatten(0, (3, heads, d)).unbind(0)  # [H, d, C] each
        weight = torch.cat([(m @ q.to(m)).to(weight), (m_inv_t @ k.to(m)).to(weight), v]).flatten(0, 1)
        if bias is not None:
            bq, bk, bv = bias.unflatten(0, (3, heads, d)).unbind(0)
            mapped = [(matrix @ b.to(matrix)[..., None]).squeeze(-1).to(bias) for matrix, b in ((m, bq), (m_inv_t, bk))]
            bias = torch.cat([*mapped, bv]).flatten()
        return weight, bias

    def rotate_mapped_qk(
        self, q: torch.Tensor, k: torch.Tensor | None, table: Table
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The wrapped encoding's rotation of ``M q`` and ``M^-T k`` (from a projection :meth:`fold_into_qkv`
        made)."""
        return self.base.rotate_qk(q, k, table)

    def compute_table(self, coords: torch.Tensor, complex_dtype: torch.dtype) -> Table:
        return self.base.compute_table(coords, complex_dtype)

    def table(self, coords: torch.Tensor, dtype: torch.dtype = torch.float32, device: Device = None) -> Table:
        """The wrapped encoding's table (cached by it)."""
        return self.base.table(coords, dtype, device)

    def rotate(self, x: torch.Tensor, table: Table) -> torch.Tensor:
        """The wrapped encoding's rotation only; :meth:`forward` applies ``M`` / ``M^-T`` first."""
        return self.base.rotate(x, table)

    def default_coords(self, length: int, device: Device) -> torch.Tensor:
        return self.base.default_coords(length, device)

    def rotate_qk(
        self, q: torch.Tensor, k: torch.Tensor | None, table: Table
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``R M q, R M^-T k`` with a table from :meth:`table` (what :meth:`forward` applies; :meth:`rotate`
        alone cannot tell q from k)."""
        return self.base.rotate_qk(*self.transform(q, k), table)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor | None, coords: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``q, k -> R(p) M q, R(p) M^-T k`` (shapes as the wrapped encoding; checked here first); ``k=None``
        encodes q alone (decoding against cached keys) and returns ``(R(p) M q, None)``."""
        check_key_or_none(k)  # shapes: transform
        q, k = self.transform(q, k)
        return self.base(q, k, coords)

    def frequency_matrix(self) -> torch.Tensor:
        return self.base.frequency_matrix()

    @torch.no_grad()
    def load_reference_parameters(
        self, a_u: torch.Tensor, a_v: torch.Tensor, sigma: torch.Tensor, reference_eps: float = 1e-6
    ) -> None:
        """Load the reference's parameters: full ``A_u, A_v`` ``[H, d, d]`` (``U = exp((A - A^T) / 2)``) and
        ``sigma`` ``[H, d]`` with ``s = softplus(sigma) + reference_eps``."""
        shape = (self.num_heads, self.head_dim, self.head_dim)
        for name, a in (("a_u", a_u), ("a_v", a_v)):
            if tuple(a.shape) != shape:
                raise ValueError(f"{name} has shape {tuple(a.shape)}; expected {shape}")
        if tuple(sigma.shape) != (self.num_heads, self.head_dim):
            raise ValueError(f"sigma has shape {tuple(sigma.shape)}; expected {(self.num_heads, self.head_dim)}")
        self.u_skew.copy_(upper_of((a_u - a_u.transpose(-1, -2)) / 2))
        self.v_skew.copy_(upper_of((a_v - a_v.transpose(-1, -2)) / 2))
        s = (F.softplus(sigma.double()) + reference_eps) * math.log(2.0)  # our s * log 2 = softplus(our sigma)
        self.sigma.copy_(s + torch.log(-torch.expm1(-s)))  # inverse softplus

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_heads={self.num_heads}, eps={self.eps}, fold_qkv={self.fold_qkv}"


def _per_head_matmul(x: torch.Tensor, matrix: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``x @ matrix[h]^T`` for each head ``h`` (``x`` ``[B, H, L, D]`` or ``[B, L, H, D]``)."""
    matrix = matrix.to(x.device, x.dtype)
    if head_dim == -3:
        return torch.matmul(x, matrix.transpose(-1, -2))
    return torch.einsum("...hd,hed->...he", x, matrix)


def _build_base(
    base: str | RotaryPE, head_dim: int, num_heads: int, base_options: dict | None, given: dict
) -> RotaryPE:
    """The wrapped encoding; ``given`` (``num_prefix_tokens``, ``seq_dim``) are passed on to a named base, and
    must agree with an instance's."""
    if isinstance(base, RotaryPE):
        if base_options:
            raise ValueError("base_options only apply when base is a registered name, not an instance")
        for name, value in given.items():
            if getattr(base, name) != value:
                raise ValueError(f"{name}={value} disagrees with the base encoding's {name}={getattr(base, name)}")
        return base
    if not isinstance(base, str):
        raise TypeError(f"base must be a registered rotary encoding name or a RotaryPE, got {type(base).__name__}")
    if pe_class(base).kind != PEKind.ROTARY:
        raise ValueError(f"base={base!r} is not a rotary encoding; HARoPE wraps rotary encodings only")
    options = dict(base_options or {})
    for fixed in ("head_dim",):
        if fixed in options:
            raise ValueError(f"base_options must not set {fixed!r}; it is HARoPE's own option")
    for name in given:
        if name in options:
            raise ValueError(f"base_options must not set {name!r}; it is HARoPE's own option")
    facts = {"num_heads": num_heads, **given}
    built = create_pe(base, head_dim=head_dim, **fitting_options(base, facts, options))
    if not isinstance(built, RotaryPE):
        raise TypeError(f"base={base!r} builds a {type(built).__name__}; HARoPE wraps RotaryPE subclasses only")
    return built
