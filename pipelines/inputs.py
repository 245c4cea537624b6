"""Inputs of the ``mmpos edit`` / ``mmpos generate`` runs: the resolved config, prompts or saved prompt
embeddings, images and masks on the pipeline's token grid, seeded generators, the output folder.

Imports of torch/diffusers happen inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


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


EMBED_KEYS = ("prompt_embeds", "pooled_prompt_embeds", "prompt_embeds_mask", "prompt_attention_mask")
MASK_KEYS = ("prompt_embeds_mask", "prompt_attention_mask")  # optional where the pipeline takes them


def read_embeds_file(path) -> dict:
    """The tensors of a ``--prompt-embeds`` safetensors / .pt file by name (read without unpickling objects:
    :mod:`mmpos._safe_state`); else a ValueError naming ``--prompt-embeds`` and the file."""
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
    others = sorted(name for name, value in tensors.items() if not isinstance(value, torch.Tensor))
    if others:
        raise ValueError(f"--prompt-embeds {path}: {others} are not tensors; expected a dict of tensors")
    return tensors


def load_prompt_embeds(path, required=("prompt_embeds", "pooled_prompt_embeds"), optional=()) -> dict:
    """The ``required`` tensors (and those of ``optional`` present) of a ``--prompt-embeds`` file
    (:func:`read_embeds_file`), each of its shape (:data:`EMBED_DIMS`) and one batch; else a ValueError naming
    ``--prompt-embeds`` and the file."""
    tensors = read_embeds_file(path)
    missing = set(required) - set(tensors)
    if missing:
        raise ValueError(f"--prompt-embeds {path} lacks {sorted(missing)}; expected {' and '.join(required)}")
    embeds = {k: tensors[k] for k in (*required, *optional) if k in tensors}
    for key, value in embeds.items():
        shape = tuple(getattr(value, "shape", ()))
        if len(shape) != len(EMBED_DIMS[key]) or 0 in shape:
            expected = f"[{', '.join(EMBED_DIMS[key])}]"
            raise ValueError(f"--prompt-embeds {path}: {key} has shape {shape}; expected {expected}")
    if len({v.shape[0] for v in embeds.values()}) > 1:
        shapes = {k: tuple(v.shape) for k, v in embeds.items()}
        raise ValueError(f"--prompt-embeds {path}: {shapes} differ in the batch size B; expected one B")
    return embeds


EMBED_DIMS = {
    "prompt_embeds": ("B", "L", "D"),
    "pooled_prompt_embeds": ("B", "D"),
    "prompt_embeds_mask": ("B", "L"),
    "prompt_attention_mask": ("B", "L"),
}


def prompt_kwargs(args, prompts, pipe, guidance=None) -> dict:
    """``prompt`` strings, or the ``--prompt-embeds`` tensors the pipeline takes: Flux ``prompt_embeds`` and
    ``pooled_prompt_embeds``; Qwen-Image ``prompt_embeds`` and, if saved, ``prompt_embeds_mask`` [B, L] (Chroma:
    ``prompt_attention_mask``).
    A world model gets its prompts with its sampling ``guidance`` (:func:`mmpos.models.world.image.conditioning`)."""
    if args.prompt_embeds:
        accepted = [k for k in EMBED_KEYS if k in stock_call_parameters(pipe)]
        required = [k for k in accepted if k not in MASK_KEYS]
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


def load_placed_image(path, what: str, token_pixels: int, side: int | None = None, outputs_follow: bool = True):
    """``(image [1, 3, H', W'], placement)``: the image file as the pipeline gets it, saying how it was placed
    (``outputs_follow``: the outputs are edits of this image, cropped back to it and written at its size).
    With ``side`` (a world model's training size) fitted into ``side x side``, aspect kept and padded
    (:func:`~mmpos.pipelines.placement.fit_square`); without, resized down to the token grid
    (:func:`~mmpos.pipelines.placement.on_token_grid`)."""
    from .images import load_image
    from .placement import fit_square, on_token_grid

    image = load_image(path, "--" + what.replace(" ", "-"))  # its option: --background, --reference-image
    source = tuple(image.shape[-2:])
    placement = fit_square(source, side) if side is not None else on_token_grid(source, token_pixels)
    message = placement.describe(what, outputs_follow)
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
