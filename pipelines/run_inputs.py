"""Inputs of the ``mmpos edit`` / ``mmpos generate`` runs: the resolved config, prompts or saved prompt
embeddings, images and masks on the pipeline's token grid, seeded generators, the output folder.

Imports of torch/diffusers happen inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

_RUN_FLAG_KEYS = {"model": "model", "device": "device", "dtype": "dtype"}
EDIT_FLAG_KEYS = {**_RUN_FLAG_KEYS, "prompt_text": "prompt"}  # every `mmpos edit METHOD`, then the method's own
# per ``args.method``: option dest -> the (dotted) config key it sets; an option not given keeps the config's value.
# --extrapolate / --train-size set extrapolate.preset / .train_size (:func:`~.extrapolate.extrapolate_setting`).
FLAG_KEYS = {
    "generate": {**_RUN_FLAG_KEYS, "prompt": "prompts", "height": "sampler.height", "width": "sampler.width"},
}


def flag_keys(method: str) -> dict:
    """Option dest -> config key of ``mmpos generate`` or of ``mmpos edit METHOD`` (its EditMethod.flag_keys)."""
    if method in FLAG_KEYS:
        return FLAG_KEYS[method]
    from .edits import get_edit

    return {**EDIT_FLAG_KEYS, **get_edit(method).flag_keys}


def apply_flags(config: dict, args) -> dict:
    """``config`` with each option of :func:`flag_keys` of ``args.method`` that was given set at its own key
    (sections made as needed), nothing else changed."""
    for dest, key in flag_keys(args.method).items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        *sections, leaf = key.split(".")
        node = config
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return config


def resolve_config(args) -> dict:
    """The command's YAML config <- ``--set`` <- the options that name a config key (:func:`flag_keys`); cuda falls
    back to cpu, saying so. A missing or malformed ``--config`` or a bad ``--set`` ends the command: one line, exit
    code 2."""
    from .config import apply_overrides, check_config, check_sampler, default_config_path, load_config

    try:
        config = load_config(args.config or default_config_path(default_config_name(args)))
        config = apply_flags(apply_overrides(config, args.set), args)
        check_prompt_source(args, config)
        check_config(config, args.config_name)
        check_sampler(config)
        check_device(config.get("device"))
    except (FileNotFoundError, KeyError, ValueError) as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else error  # KeyError quotes str()
        print(f"mmpos {args.command}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None
    if config.get("device") == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("CUDA is not available: running on cpu (set --device to silence this)")
            config["device"] = "cpu"
    return config


def check_device(device) -> None:
    """``device`` (the config's, or ``--device``) names a torch device (None: the command's default)."""
    if device is None:
        return
    import torch

    try:
        torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device={device!r}: expected a torch device such as cpu, cuda, cuda:1 or mps") from None


def check_prompt_source(args, config) -> None:
    from .loading import is_world_model

    if getattr(args, "prompt_embeds", None) and is_world_model(config.get("model", "")):
        raise ValueError(
            "--prompt-embeds is for FLUX.1 / Qwen-Image pipelines; the world model encodes --prompt "
            "itself (its tokenizer and text encoder are in the model folder)"
        )


def default_config_name(args) -> str:
    """``<command>_world`` (the shipped world models: CPU, float32, 32 px, seconds) with ``--model world``, a world
    model folder, or no ``--model`` on a machine without CUDA (saying so); else the command's FLUX.1 config."""
    from .loading import is_world_model

    if args.model is None:
        import torch

        if torch.cuda.is_available():
            return args.config_name
        print(
            "no CUDA GPU: running the shipped world models (small Flux-class models, 32 px); pass --model for "
            "another model (e.g. black-forest-labs/FLUX.1-dev)"
        )
        return f"{args.config_name}_world"
    return f"{args.config_name}_world" if is_world_model(args.model) else args.config_name


def world_model_notice(command: str, real_model: str, side: int = 32) -> str:
    """The line a run on a world model prints before it loads: what the world models can and cannot do, and the
    command that runs ``real_model`` instead (``command``: ``mmpos edit transplant``, ``mmpos generate``)."""
    cannot = (
        f"they draw only such scenes ({side} px toy previews, never photographs)"
        if command == "mmpos generate"
        else f"photographs are outside what they know, so a photo comes back as a {side} px toy preview, not a real edit"
    )
    return (
        f"note: the world models are tiny Flux-class models trained only on {side} px synthetic mini-world scenes "
        f"(simple coloured shapes on plain or patterned backgrounds, prompts in the world's words); {cannot}; for "
        f"real images run a real model on a CUDA GPU: {command} --model {real_model} --device cuda (same options)"
    )


def report_prompts(args, parts) -> None:
    """Print, in one line, the prompts a run encodes and where each came from; ``parts``: ``(name, prompts,
    option, given)`` each (``given``: the option was on the command line; else the config's, default or set)."""
    if getattr(args, "prompt_embeds", None):
        print(f"prompt used: the embeddings in {args.prompt_embeds} (--prompt-embeds)")
        return
    described, count = [], 0
    for name, prompts, option, given in parts:
        prompts = [prompts or ""] if prompts is None or isinstance(prompts, str) else list(prompts)
        count += len(prompts)
        where = f"from {option}" if given else f"the config's; {option} sets it"
        text = ", ".join(json.dumps(p) for p in prompts)
        described.append(f"{name + ' ' if name else ''}{text} ({where})")
    print(f"prompt{'s' if count > 1 else ''} used: " + "; ".join(described))


EMBED_KEYS = ("prompt_embeds", "pooled_prompt_embeds", "prompt_embeds_mask")


def load_prompt_embeds(path, required=("prompt_embeds", "pooled_prompt_embeds"), optional=()) -> dict:
    """The ``required`` tensors (and those of ``optional`` present) of a safetensors/pt file (read without
    unpickling objects: :mod:`mmpos._safe_state`), each of its shape (:data:`EMBED_DIMS`) and one batch; else a
    ValueError naming ``--prompt-embeds`` and the file."""
    import torch

    from mmpos._safe_state import load_torch_file, read_tensors

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--prompt-embeds {path}: no such file; expected a safetensors or .pt file of tensors")
    try:
        tensors = read_tensors(path) if path.suffix == ".safetensors" else load_torch_file(path)
    except ValueError as error:
        raise ValueError(f"--prompt-embeds {error}; expected a safetensors or .pt file of tensors") from None
    if not isinstance(tensors, dict):
        raise ValueError(f"--prompt-embeds {path} holds a {type(tensors).__name__}; expected a dict of tensors")
    missing = set(required) - set(tensors)
    if missing:
        raise ValueError(f"--prompt-embeds {path} lacks {sorted(missing)}; expected {' and '.join(required)}")
    embeds = {k: tensors[k] for k in (*required, *optional) if k in tensors}
    for key, value in embeds.items():
        shape = tuple(getattr(value, "shape", ()))
        if not isinstance(value, torch.Tensor) or len(shape) != len(EMBED_DIMS[key]) or 0 in shape:
            expected = f"[{', '.join(EMBED_DIMS[key])}]"
            raise ValueError(f"--prompt-embeds {path}: {key} has shape {shape}; expected {expected}")
    if len({v.shape[0] for v in embeds.values()}) > 1:
        shapes = {k: tuple(v.shape) for k, v in embeds.items()}
        raise ValueError(f"--prompt-embeds {path}: {shapes} differ in the batch size B; expected one B")
    return embeds


EMBED_DIMS = {"prompt_embeds": ("B", "L", "D"), "pooled_prompt_embeds": ("B", "D"), "prompt_embeds_mask": ("B", "L")}


def prompt_kwargs(args, prompts, pipe, guidance=None) -> dict:
    """``prompt`` strings, or the ``--prompt-embeds`` tensors the pipeline takes: Flux ``prompt_embeds`` and
    ``pooled_prompt_embeds``; Qwen-Image ``prompt_embeds`` and, if saved, ``prompt_embeds_mask`` [B, L].
    A world model gets its prompts with its sampling ``guidance`` (:func:`mmpos.models.world.image.conditioning`)."""
    if args.prompt_embeds:
        accepted = [k for k in EMBED_KEYS if k in stock_call_parameters(pipe)]
        required = [k for k in accepted if k != "prompt_embeds_mask"]
        embeds = load_prompt_embeds(args.prompt_embeds, required, [k for k in accepted if k not in required])
        check_embeds_fit(embeds, pipe.transformer.config, args.prompt_embeds)
        dtype = pipe.transformer.dtype
        return {k: v.to(pipe.device, dtype if v.is_floating_point() else v.dtype) for k, v in embeds.items()}
    if is_world_pipeline(pipe):
        from mmpos.models.world.image import conditioning

        return conditioning(pipe, [prompts] if isinstance(prompts, str) else list(prompts), guidance)
    return {"prompt": prompts}


def check_embeds_fit(embeds: dict, config, path) -> None:
    """The embeddings' widths are the transformer's (``joint_attention_dim``, ``pooled_projection_dim``)."""
    widths = {"prompt_embeds": "joint_attention_dim", "pooled_prompt_embeds": "pooled_projection_dim"}
    for key, name in widths.items():
        expected = getattr(config, name, None)
        if key in embeds and expected is not None and embeds[key].shape[-1] != expected:
            raise ValueError(
                f"--prompt-embeds {path}: {key} has shape {tuple(embeds[key].shape)}; expected width D = {expected} "
                f"(the transformer's {name}: embeddings of another model?)"
            )


def is_world_pipeline(pipe) -> bool:
    from mmpos.models.world.text import WorldTextEncoder

    return isinstance(getattr(pipe, "text_encoder", None), WorldTextEncoder)


def stock_call_parameters(pipe):
    """The parameters of the first ``__call__`` along the pipeline's MRO that names ``prompt_embeds`` (the stock
    diffusers one under an mmpos subclass taking ``*args, **kwargs``)."""
    import inspect

    for cls in type(pipe).__mro__:
        call = cls.__dict__.get("__call__")
        if call is not None and "prompt_embeds" in inspect.signature(call).parameters:
            return inspect.signature(call).parameters
    raise TypeError(f"{type(pipe).__name__}.__call__ takes no prompt_embeds")


def load_placed_image(path, what: str, token_pixels: int, side: int | None = None):
    """``(image [1, 3, H', W'], placement)``: the image file as the pipeline gets it, saying how it was placed.
    With ``side`` (a world model's training size) fitted into ``side x side``, aspect kept and padded
    (:func:`~mmpos.pipelines.placement.fit_square`); without, resized down to the token grid
    (:func:`~mmpos.pipelines.placement.on_token_grid`)."""
    from .images import load_image
    from .placement import fit_square, on_token_grid

    image = load_image(path, "--" + what.replace(" ", "-"))  # its option: --background, --reference-image
    source = tuple(image.shape[-2:])
    placement = fit_square(source, side) if side is not None else on_token_grid(source, token_pixels)
    message = placement.describe(what)
    if message and placement.canvas == placement.content:  # resized only: to what
        message += " (the world model's size)" if side is not None else f" (the {token_pixels}-pixel token grid)"
    if message:
        print(message)
    return placement.place_image(image), placement


def load_placed_mask(path, placement, what: str = "the image"):
    """A ``[H', W']`` bool mask of the model input: the mask file (in the image file's pixels; another size is
    stretched to it, nearest, saying so) placed like the image (:meth:`Placement.place_mask`)."""
    from PIL import Image

    from .images import as_mask, read_mask_pil

    mask = read_mask_pil(path, "--mask")
    (height, width), (h, w), canvas = placement.source, placement.content, placement.canvas
    size, stretched = f"{mask.height}x{mask.width}", (mask.height, mask.width) != (height, width)
    if stretched:
        size += f" (not {what}'s {height}x{width}: stretched)"
        mask = mask.resize((width, height), Image.NEAREST)
    if placement.changed or stretched:
        padded = f", padded like {what} to {canvas[0]}x{canvas[1]}" if canvas != (h, w) else ""
        print(f"mask {path}: resized {size} to {h}x{w} (nearest){padded}")
    placed = placement.place_mask(as_mask(str(path), mask, (height, width)))
    if not bool(placed.any()):
        raise ValueError(
            f"mask {path} selects no pixel of the {placed.shape[0]}x{placed.shape[1]} model input; expected a "
            "larger region"
        )
    return placed


def image_side(config, kind: str) -> int | None:
    """The side inputs are resized to: the config's ``image_size`` (``auto``: the world model card's), None for
    configs without one (FLUX.1: the image's own size on the token grid)."""
    side = config.get("image_size")
    if side == "auto":
        from .loading import model_path, world_image_size

        return world_image_size(model_path(kind, config["model"]))
    return None if side is None else int(side)


def load_cli_pipeline(command: str, kind: str, config):
    """:func:`~mmpos.pipelines.loading.load_pipeline` of ``config["model"]`` for a command, saying which model,
    device and dtype first; a model that cannot be loaded ends the command (one line, exit code 2)."""
    from .loading import load_pipeline, model_path, pipeline_class

    try:
        path = model_path(kind, config["model"])
        print(f"model: {path} ({pipeline_class(kind).__name__}), device {config['device']}, dtype {config['dtype']}")
        return load_pipeline(kind, path, config["dtype"], config["device"])
    except ValueError as error:
        print(f"mmpos {command}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


def rescale_box(box, from_size, to_size) -> tuple[int, int, int, int]:
    """``(left, top, right, bottom)`` pixels of a ``from_size`` (H, W) image -> the same region of the image
    resized to ``to_size``, rounded outwards; a box outside the image raises ValueError naming ``--box``
    (:func:`mmpos.pipelines.placement.rescale_box`)."""
    from .placement import rescale_box as rescale

    return rescale(box, from_size, to_size)


def load_mask(path, size):
    """A [H, W] mask of ``size`` (resized nearest, saying so)."""
    from PIL import Image

    from .images import as_mask, read_mask_pil

    mask = read_mask_pil(path, "--mask")
    if (mask.height, mask.width) != tuple(size):
        print(f"mask {path}: resized {mask.height}x{mask.width} to {size[0]}x{size[1]} (nearest)")
        mask = mask.resize((size[1], size[0]), Image.NEAREST)
    return as_mask(str(path), mask, size)


def sampler_options(config, pipe=None) -> dict:
    """The config's ``sampler`` section as pipeline call arguments; with ``pipe``, those its stock ``__call__``
    takes (a FLUX.1 config's ``guidance_scale`` on Qwen-Image 2.1, which has none: left out, saying so)."""
    options = dict(config.get("sampler", {}))
    if pipe is None:
        return options
    accepted = stock_call_parameters(pipe)
    dropped = [key for key in options if key not in accepted]
    if dropped:
        print(f"sampler: {type(pipe).__name__} takes no {', '.join(dropped)} (left out)")
    return {key: value for key, value in options.items() if key in accepted}


def output_folder(args, default: Path) -> Path:
    """Where a run writes: a named ``--out`` that holds files is refused (one line, exit 2) unless ``--overwrite``;
    without ``--out``, ``default`` or the next free ``default-2``, ``default-3``, ... (never an earlier run)."""
    if not args.out:
        return fresh_folder(default)
    out = Path(args.out)
    existing = next((p for p in (out, *out.parents) if p.exists()), Path("."))  # the nearest folder that exists
    if out.exists() and not out.is_dir():
        message = f"--out {out} is a file; expected a folder"
    elif out.is_dir() and any(out.iterdir()) and not getattr(args, "overwrite", False):
        message = f"--out {out} already holds files; choose another folder or pass --overwrite"
    elif not existing.is_dir():
        message = f"--out {out} cannot be created: {existing} is a file"
    elif not os.access(existing, os.W_OK | os.X_OK):
        message = f"--out {out} cannot be created: {existing} is not writable"
    else:
        return out
    print(f"mmpos {args.command}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def fresh_folder(default: Path) -> Path:
    """``default`` if absent or empty, else ``default-2``, ``default-3``, ...: an unnamed output never overwrites
    an earlier run."""
    candidate, index = default, 1
    while candidate.exists() and any(candidate.iterdir()):
        index += 1
        candidate = default.with_name(f"{default.name}-{index}")
    return candidate


def report_written(paths, out: Path) -> None:
    """Print every file a command wrote (names inside ``out``)."""
    print(f"wrote {len(paths)} files to {out.resolve()}:", *(Path(p).name for p in paths), sep="\n  ")
