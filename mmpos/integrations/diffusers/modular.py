"""mmpos in diffusers' modular pipelines: a block that installs a :class:`PEConfig` or :class:`DyPEConfig` on the
pipeline's transformer before its denoise block runs, as the ``pe_config`` input of the pipeline call.

    from diffusers.modular_pipelines import FluxAutoBlocks
    from mmpos.integrations.diffusers import DyPEConfig, PEConfig
    from mmpos.integrations.diffusers.modular import insert_pe_step

    blocks = insert_pe_step(FluxAutoBlocks())           # a "mmpos_pe" block before "denoise"
    pipe = blocks.init_pipeline("black-forest-labs/FLUX.1-dev")
    pipe(prompt="...", pe_config=PEConfig("native", options={"extrapolation": {"type": "ntk", "factor": 2}}))
    pipe(prompt="...", pe_config=DyPEConfig(trained_grid=(64, 64), shift=None))
    pipe(prompt="...")                                  # no pe_config: the stock transformer (mmpos removed)

The block reads nothing else from the state and writes nothing to it: the family's own RoPE-inputs block still
builds the position ids, which the installed encoding reads. The install is the registry hook of :mod:`.hooks`
(kept between calls with the same config, replaced by another, removed when ``pe_config`` is absent). DyPE's
noise-schedule shift changes the scheduler, which the modular timesteps blocks read from their own config: the
block refuses a :class:`DyPEConfig` whose ``shift`` is not ``None`` (set the scheduler's shift in the pipeline's
components instead).
"""

from __future__ import annotations

from diffusers.modular_pipelines import ModularPipelineBlocks, SequentialPipelineBlocks
from diffusers.modular_pipelines.modular_pipeline_utils import ComponentSpec, InputParam

from .hooks import DyPEConfig, PEConfig, apply_dype, apply_pe, installed_hook, remove_pe

PE_STEP = "mmpos_pe"


class PEStep(ModularPipelineBlocks):
    """Installs the call's ``pe_config`` (a :class:`PEConfig`, a :class:`DyPEConfig` with ``shift=None``, or
    ``None``: the stock transformer) on the ``transformer`` component."""

    model_name = None

    @property
    def description(self) -> str:
        return "Installs an mmpos positional encoding (PEConfig / DyPEConfig) on the transformer, or removes it."

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return [ComponentSpec("transformer")]

    @property
    def inputs(self) -> list[InputParam]:
        return [InputParam("pe_config", default=None, description="an mmpos PEConfig or DyPEConfig (None: stock)")]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        install(components.transformer, block_state.pe_config)
        self.set_block_state(state, block_state)
        return components, state


def install(transformer, config) -> None:
    """Make ``transformer`` run ``config`` (``None``: stock); an equal config already installed is kept."""
    hook = installed_hook(transformer)
    if config is None:
        if hook is not None:
            remove_pe(transformer)
        return
    if isinstance(config, DyPEConfig):
        if config.shift is not None:
            raise ValueError(
                "pe_config: a DyPEConfig in a modular pipeline needs shift=None (the timesteps block reads the "
                "scheduler's own shift; set it in the pipeline's scheduler component)"
            )
        if hook is None or getattr(hook, "dype_config", None) != config:
            apply_dype(transformer, config)
            installed_hook(transformer).dype_config = config
        return
    if not isinstance(config, PEConfig):
        raise TypeError(f"pe_config must be a PEConfig, a DyPEConfig or None, got {type(config).__name__}")
    if hook is None or getattr(hook, "dype_config", None) is not None or hook.config != config:
        apply_pe(transformer, config)


def insert_pe_step(blocks: SequentialPipelineBlocks, before: str = "denoise") -> SequentialPipelineBlocks:
    """``blocks`` with a :class:`PEStep` named ``"mmpos_pe"`` inserted before its ``before`` block (in place;
    returned for chaining)."""
    if not isinstance(blocks, SequentialPipelineBlocks):
        raise TypeError(f"blocks must be SequentialPipelineBlocks, got {type(blocks).__name__}")
    names = list(blocks.sub_blocks)
    if before not in names:
        raise ValueError(f"before={before!r} is not a block of {type(blocks).__name__}; its blocks: {names}")
    if PE_STEP in names:
        raise ValueError(f"{type(blocks).__name__} already has a {PE_STEP!r} block")
    blocks.sub_blocks.insert(PE_STEP, PEStep(), names.index(before))
    return blocks
