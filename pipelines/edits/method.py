"""What an edit method is (:class:`EditMethod`) and the one runner every caller uses (:func:`run_edit`).

An edit method is a training-free PE edit run by an mmpos pipeline subclass: ``pipe(<name>=options, ...)``. The
command line (``mmpos edit NAME``), the world demo and ``scripts/eval_editing.py`` differ only in how they load
the pipeline and build the calls' inputs; all of them run the calls through :func:`run_edit`. Light: nothing here
imports torch or diffusers at module level (``mmpos edit --help`` reads the registry).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Callable, Mapping, Optional


def seeded_generator(seed):
    """A CPU generator (the same noise on every device)."""
    import torch

    return torch.Generator("cpu").manual_seed(int(seed))


@dataclass(frozen=True)
class Variant:
    """A named mode of a method chosen by its config's ``variant`` key: which of the method's ``pipelines`` it
    runs and which world model (``t2i``, ``fill``, ``kontext``) it runs on with ``--model world``."""

    pipeline: str  # a key of EditMethod.pipelines
    world_task: str


@dataclass(frozen=True)
class EditMethod:
    """A registered edit method (:func:`~mmpos.pipelines.edits.register_edit`).

    Attributes:
        name: ``mmpos edit NAME``, the config ``configs/edit_NAME[_world].yaml`` and the keyword of the pipeline
            call that takes its options (``pipe(band={...})``).
        help: one line for ``mmpos edit --help``.
        config_class: ``"module:Class"`` (imported when used; or the class itself) of the options dataclass (``BandConfig``); its fields are the config's
            ``NAME:`` section.
        pipelines: pipeline key -> ``"module:Class"`` (or the class) of the pipeline that runs the method on it. A key is
            a stock pipeline class name (``"FluxFillPipeline"``: that pipeline only) or a diffusers family name
            (``"flux2"``: any pipeline of the family, :mod:`mmpos.integrations.diffusers.families`); the class
            name is looked up first. Adding a family is one line here.
        world_task: the shipped world model the method runs on (``--model world``, the demo, the evaluation).
        add_options: ``add_options(parser)`` adds the method's own options to ``mmpos edit NAME``.
        flag_keys: option dest -> the (dotted) config key it sets (an option not given keeps the config's value).
        collect: ``collect(result, call) -> {"outputs": images, ...}``: the images of one pipeline call that the
            method made (``"raw"`` and ``"references"`` optional, see :class:`EditRun`).
        cli_run: ``cli_run(args, config, model, load, tqdm) -> dict`` (``model``: the resolved ``--model``,
            :class:`~mmpos.pipelines.loading.ModelRef`) of ``inputs``, ``edited``, ``sweep`` (name ->
            ``[3, H, W]`` image each), ``diagnostic`` (a function of the figure path, or None), ``title`` and,
            optionally, ``placement`` (the :class:`~mmpos.pipelines.placement.Placement` of the input the edited
            images are edits of: they are cropped back to it and also written at the input file's size): checks
            the inputs, ``pipe = load()``, then :func:`run_edit` on the CLI's inputs.
        demo_section: ``demo_section(source, steps, count, out_dir) -> Section`` of the world demo, or None.
        variants: config ``variant`` value -> :class:`Variant` (band: ``flux``, ``kontext``); ``auto`` (or no
            variant) follows the model.
        demo_order: where the demo section goes among the edit sections (lower first).
        prompt_help: the help of ``mmpos edit NAME --prompt`` (what the prompt is to this method).
    """

    name: str
    help: str
    config_class: str
    pipelines: Mapping[str, str]
    world_task: str
    add_options: Callable
    flag_keys: Mapping[str, str]
    collect: Callable
    cli_run: Callable
    demo_section: Optional[Callable] = None
    variants: Mapping[str, Variant] = field(default_factory=dict)
    demo_order: int = 100
    prompt_help: str = "prompt (default: the config's prompt)"

    def options_class(self):
        """The options dataclass (imported now)."""
        return load_object(self.config_class)

    def pipeline_class(self, key: str):
        """The pipeline class for pipeline key ``key`` (imported now); a KeyError names the known keys."""
        if key not in self.pipelines:
            raise KeyError(f"edit method {self.name!r} has no pipeline for {key!r}; known: {sorted(self.pipelines)}")
        return load_object(self.pipelines[key])

    def variant(self, name) -> Optional[Variant]:
        """The :class:`Variant` named ``name``; None for ``None`` / ``"auto"`` (follow the model)."""
        if name in (None, "auto"):
            return None
        if name not in self.variants:
            raise ValueError(
                f"config key variant={name!r}: expected auto or one of {sorted(self.variants)} "
                f"(edit method {self.name})"
            )
        return self.variants[name]

    def world_task_for(self, variant=None) -> str:
        chosen = self.variant(variant)
        return self.world_task if chosen is None else chosen.world_task


def load_object(spec):
    """``"package.module:Name"`` -> the object (the module imported now); anything else (a class) as it is."""
    if not isinstance(spec, str):
        return spec
    module, sep, name = spec.partition(":")
    if not sep:
        raise ValueError(f"{spec!r}: expected 'module:Name'")
    return getattr(import_module(module), name)


@dataclass
class EditRun:
    """What :func:`run_edit` returns: one entry per example (pipeline call) in order, each call's own images.

    ``outputs``: the edited images (``uint8=True``: uint8 ``[N, H, W, 3]``; else a list of the pipeline's
    images, ``[3, H, W]`` tensors with ``output_type="pt"``); ``last``: the last call's pipeline output (maps,
    canvas, ids, for the diagnostics); ``raw``: transplant, the scene part of each canvas output before
    compositing; ``references``: band, the reference image generated in each set's batch."""

    outputs: Any
    last: Any
    raw: Any = None
    references: Any = None


def run_edit(
    method: EditMethod,
    pipe,
    calls,
    options,
    seed: int = 0,
    output_type: str = "np",
    uint8: bool = True,
    progress: str | None = None,
) -> EditRun:
    """Run ``pipe(<method.name>=options, generator=seed + i, output_type=..., **calls[i])`` for each example ``i``
    and gather what each call made (``method.collect``). ``options``: the method's config dataclass or dict
    (``enabled=False`` or strength 0: the stock pipeline, the baseline). ``progress``: a progress bar title."""
    calls = list(calls)
    if progress is not None:
        from tqdm.auto import tqdm

        calls = tqdm(calls, desc=progress, unit="example", leave=False)
    gathered, result = {}, None
    for index, call in enumerate(calls):
        result = pipe(
            **{method.name: options}, generator=seeded_generator(seed + index), output_type=output_type, **call
        )
        for key, images in method.collect(result, call).items():
            gathered.setdefault(key, []).extend(images)
    if uint8:
        import numpy as np

        from mmpos.world.images import to_uint8

        gathered = {key: np.stack([to_uint8(image[None])[0] for image in images]) for key, images in gathered.items()}
    return EditRun(gathered.get("outputs"), result, gathered.get("raw"), gathered.get("references"))
