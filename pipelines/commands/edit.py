"""``mmpos edit METHOD``: config-driven training-free PE edits, one sub-command per registered edit method
(:mod:`mmpos.pipelines.edits`: band, transplant, loose, ...), that save images, the resolved config, a comparison
figure (inputs, edited, strength sweep) and a method diagnostic. The model's pipeline class follows
``--model`` (its ``model_index.json``). torch and diffusers are imported when the command runs."""

from __future__ import annotations

import sys
from pathlib import Path

from mmpos._arguments import positive_int_arg

from ..edits import get_edit, list_edits
from ._options import add_run_options

OUTPUTS = (
    "Writes edited_N.png (the model's output over the input picture; a world model's padding cropped off) and, "
    "when the input was resized or padded for the model, edited_N_fullsize.png at the input file's size; then "
    "config.yaml, comparison.png, diagnostic.png and summary.json. On the world models (32 px synthetic scenes) "
    "a photo is fitted with its aspect kept and the output is a toy preview."
)
METHODS = tuple(list_edits())  # the shipped methods; `mmpos edit` lists those registered when it is built


def register(subparsers) -> None:
    """Register ``edit`` and one sub-command per registered edit method on the root parser's subparsers."""
    names = list_edits()
    edit = subparsers.add_parser(
        "edit",
        help=f"training-free PE edits (FLUX.1, FLUX.2 / Klein, Qwen-Image, Z-Image): {' | '.join(names)}",
        description=f"Run a training-free PE edit from a YAML config (configs/edit_*.yaml). {OUTPUTS}",
    )
    edit.set_defaults(func=run)
    methods = edit.add_subparsers(dest="method", required=True, metavar="{" + ",".join(names) + "}")
    for name in names:
        method = get_edit(name)
        sub = methods.add_parser(name, help=method.help, description=f"{method.help}. {OUTPUTS}")
        method.add_options(sub)
        sub.add_argument("--prompt", dest="prompt_text", help=method.prompt_help)
        sub.add_argument(
            "--extrapolate",
            help="edit above the training size: the RoPE extrapolation of "
            "`mmpos generate --extrapolate` (dype, ntk, yarn, pi, ..., or row=dype,col=ntk) under the "
            "edit (default: the config's extrapolate.preset, none)",
        )
        sub.add_argument(
            "--train-size",
            type=positive_int_arg,
            help="training resolution in pixels for --extrapolate "
            "(default: the config's extrapolate.train_size, else 1024 for FLUX.1; 32 world)",
        )
        add_run_options(sub, f"edit_{name}")


def run(args) -> int:
    """Run ``mmpos edit METHOD``: resolve the config, run the method, save images, config, figures and summary."""
    import json

    from tqdm.auto import tqdm

    from mmpos._atomic import written_atomically

    from ..images import save_image
    from ..loading import edit_model_ref, load_edit_pipeline
    from ._config import check_prompt_source, save_config
    from ._options import output_folder, report_written

    method = get_edit(args.method)
    config = edit_config(args)  # config errors (one line, exit 2) before diffusers is imported
    model = edit_model_ref(method, config)  # --model resolved once
    try:
        check_prompt_source(args, model)
    except ValueError as error:
        print(f"mmpos edit {args.method}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    out = output_folder(args, Path(f"outputs/edit_{args.method}"))
    print_world_notice(method, config, model)
    try:  # unreadable inputs, a box outside the image, a model the method does not run on, unknown words
        result = method.cli_run(args, config, model, lambda: load_edit_pipeline(method, config, model), tqdm)
    except (OSError, ValueError) as error:
        print(f"mmpos edit {args.method}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    placement = result.get("placement")  # where the user's image sits in the model input (None: new images)
    crop = (lambda image: image) if placement is None else placement.crop
    edited = {name: crop(image) for name, image in result["edited"].items()}
    out.mkdir(parents=True, exist_ok=True)  # after the work: a failed run leaves no folder behind
    written = [save_image(image, out / f"edited_{i}.png") for i, image in enumerate(edited.values())]
    if placement is not None and placement.changed:  # beside each: the edit at the input file's size
        written += [
            save_image(placement.to_source(image), out / f"edited_{i}_fullsize.png")
            for i, image in enumerate(result["edited"].values())
        ]
    written.append(save_config(config, out / "config.yaml"))
    if not args.no_figures:
        from ..edits.figures import comparison_figure

        sweep = {name: crop(image) for name, image in result["sweep"].items()}
        written.append(
            comparison_figure(
                result["inputs"], edited, sweep, out / "comparison.png", result["title"], result.get("overlays")
            )
        )
        if result.get("diagnostic") is not None:  # a method without a diagnostic figure gives None
            written.append(result["diagnostic"](out / "diagnostic.png"))
    summary = {
        "method": args.method,
        "outputs": [str(p) for p in written if p.suffix == ".png"],
        "config": str(out / "config.yaml"),
        **result.get("summary", {}),  # the method's measurements (band: reference_effect; transplant: repainted)
    }
    with written_atomically(out / "summary.json") as temporary:
        temporary.write_text(json.dumps(summary, indent=2))
    report_written(written + [out / "summary.json"], out)
    return 0


def print_world_notice(method, config, model) -> None:
    """On a world ``model`` (a :class:`~mmpos.pipelines.loading.ModelRef`), say before it loads what it can and
    cannot do and which command runs a real model."""
    if not model.is_world:
        return
    from ..inputs import world_model_notice
    from ..loading import input_side, world_task
    from ..world.sources import HUB_FLUX

    side = input_side(config, model) or 32
    print(world_model_notice(f"mmpos edit {method.name}", HUB_FLUX[world_task(method, config)], side))


def edit_config(args) -> dict:
    """The config a ``mmpos edit METHOD`` run uses (saved as its ``config.yaml``): the YAML config, ``--set``, then
    each option naming a key (``--prompt`` prompt, ``--target`` targets, ``--extrapolate`` extrapolate.preset, ...)
    over its own key only (:func:`mmpos.pipelines.commands._config.flag_keys`)."""
    from ..extrapolate import extrapolate_setting
    from ._config import resolve_config

    config = resolve_config(args)
    extrapolate_setting(config, args.extrapolate, args.train_size, "mmpos edit", default_train_size=1024)
    try:
        check_options(get_edit(args.method), config)
    except ValueError as error:
        print(f"mmpos edit {args.method}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return config


def check_options(method, config: dict) -> None:
    """The config's ``METHOD:`` section is a mapping that builds the method's options dataclass (known keys, typed
    and checked values), before any model loads: a ValueError naming ``METHOD.key`` if not."""
    import dataclasses

    section = config.get(method.name)
    if not isinstance(section, dict):
        raise ValueError(
            f"config has no {method.name}: section (a mapping of the method's options, as in "
            f"configs/edit_{method.name}.yaml); got {section!r}"
        )
    options = method.options_class()
    if not dataclasses.is_dataclass(options):  # a method taking a plain mapping (``config_class=dict``)
        return
    known = {field.name for field in dataclasses.fields(options)}
    unknown = sorted(set(section) - known)
    if unknown:
        raise ValueError(f"config {method.name}: unknown key(s) {unknown}; expected some of {sorted(known)}")
    try:
        options(**section)
    except (TypeError, ValueError) as error:
        raise ValueError(f"config {method.name}: {error}") from None
