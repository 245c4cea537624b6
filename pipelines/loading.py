"""Load editing pipelines from a path or hub id; components missing from a saved pipeline are passed as None."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from mmpos._validation import check_choice

TEXT_COMPONENTS = ("text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pipeline_class(kind: str):
    from diffusers import FluxPipeline, QwenImagePipeline

    from . import (
        BandModulationFluxPipeline,
        BandModulationKontextPipeline,
        LooseRoPEKontextPipeline,
        PosBridgeFillPipeline,
    )

    classes = {"band": BandModulationFluxPipeline, "band_kontext": BandModulationKontextPipeline,
               "transplant": PosBridgeFillPipeline, "loose": LooseRoPEKontextPipeline, "generate": FluxPipeline,
               "generate_qwen": QwenImagePipeline}
    check_choice("pipeline kind", kind, tuple(classes))
    return classes[kind]


GENERATE_KINDS = {"FluxPipeline": "generate", "QwenImagePipeline": "generate_qwen"}


def generate_kind(path) -> str:
    """``"generate"`` (FluxPipeline) or ``"generate_qwen"`` (QwenImagePipeline), from the saved pipeline's
    ``model_index.json`` (a local folder, or the hub's file: only that file is fetched)."""
    from diffusers import DiffusionPipeline

    try:
        class_name = DiffusionPipeline.load_config(path).get("_class_name")
    except OSError as err:
        raise ValueError(f"--model {path}: no diffusers pipeline there ({err})") from None
    if class_name not in GENERATE_KINDS:
        raise ValueError(f"--model {path}: a {class_name} pipeline; expected one of {sorted(GENERATE_KINDS)}")
    return GENERATE_KINDS[class_name]


def missing_components(path) -> dict:
    """``{name: None}`` for text components a local saved pipeline does not have (e.g. tiny demo models)."""
    index = Path(path) / "model_index.json"
    if not index.is_file():
        return {}
    entries = json.loads(index.read_text())
    return {name: None for name in TEXT_COMPONENTS if entries.get(name, [None, None])[0] is None}


def load_pipeline(kind: str, path, dtype: str = "bfloat16", device: str | None = None):
    """``from_pretrained`` of the pipeline for ``kind`` (band, band_kontext, transplant, loose, generate,
    generate_qwen)."""
    check_choice("dtype", dtype, tuple(DTYPES))
    cls = pipeline_class(kind)
    pipe = cls.from_pretrained(path, **{dtype_keyword(cls): DTYPES[dtype]}, **missing_components(path))
    if device is not None:
        pipe = pipe.to(device)
    return pipe


def dtype_keyword(cls) -> str:
    """``dtype`` in recent diffusers (``torch_dtype`` deprecated there), ``torch_dtype`` before."""
    import inspect

    source = inspect.getsource(cls.from_pretrained)
    return "dtype" if 'kwargs.pop("dtype"' in source else "torch_dtype"
