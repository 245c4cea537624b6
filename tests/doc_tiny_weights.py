"""Tiny offline stand-ins for downloaded weights, for the docs' ``needs-weights`` blocks (``tests/doc_blocks.py``).

Inside :func:`tiny_offline_weights`:

- ``DiffusionPipeline.from_pretrained`` (every Flux / Fill / Kontext / Wan pipeline and the mmpos pipelines built on
  them) returns the class built on tiny random components (``tests/fixtures/tiny_models.py``,
  ``mmpos.models.tiny_wan``) with tiny text encoders, so prompts are strings; Flux pipelines default to 32 px;
- ``WanTransformer3DModel.from_pretrained`` returns the tiny Wan transformer with 48-channel heads (as the Wan
  text-to-video pipelines get);
- ``CameraAdapter.from_pretrained`` returns a zero-initialised ``ucpe`` adapter for that transformer;
- ``timm.create_model(..., pretrained=True)`` builds the architecture with random weights;
- ``from_pretrained`` of transformers' Qwen2-VL / Qwen2.5-VL / Qwen3-VL models returns the tiny models of
  ``tests/tiny_qwen_vl.py``; ``AutoProcessor.from_pretrained`` a processor whose ``apply_chat_template`` returns
  their fixed text-image-video input;
- ``.to("cuda")`` and dtype casts of a pipeline are ignored when no GPU is present (tiny parts: fp32, CPU).
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

FLUX_SAMPLE_SIZE = 4  # default height = width = 4 x the tiny VAE's scale 8 = 32 px (2 x 2 tokens)


def _tiny_pipeline(cls, *args, **kwargs):
    from diffusers import FluxFillPipeline, FluxKontextPipeline, FluxPipeline, WanImageToVideoPipeline, WanPipeline
    from fixtures.tiny_models import components, tiny_text_components

    from mmpos.models.tiny_wan import tiny_wan_components

    if issubclass(cls, WanImageToVideoPipeline):
        return cls(**tiny_wan_components(image_to_video=True))
    if issubclass(cls, WanPipeline):
        return cls(**{**tiny_wan_components(), "transformer": _tiny_wan_transformer(None)})
    kind = next(
        (
            name
            for base, name in ((FluxFillPipeline, "fill"), (FluxKontextPipeline, "kontext"), (FluxPipeline, "flux"))
            if issubclass(cls, base)
        ),
        None,
    )
    if kind is None:
        raise NotImplementedError(f"no tiny offline components for {cls.__name__}")
    pipe = cls(**{**components(kind), **tiny_text_components()})
    pipe.default_sample_size = FLUX_SAMPLE_SIZE
    return pipe


def _tiny_wan_transformer(cls, *args, **kwargs):
    """The tiny Wan transformer with 48-channel heads: 8 rotary pairs on the time axis (RIFLEx's k=4 fits)."""
    from diffusers import WanTransformer3DModel

    from mmpos.models.tiny_wan import tiny_wan_transformer

    return WanTransformer3DModel.from_config({**tiny_wan_transformer().config, "attention_head_dim": 48}).eval()


def _tiny_camera_adapter(cls, *args, **kwargs):
    """A zero-initialised ``ucpe`` adapter sized for the tiny Wan transformer above."""
    return cls.for_transformer(_tiny_wan_transformer(None), "ucpe")


def _tiny_qwen_vl(cls, *args, **kwargs):
    import tiny_qwen_vl

    kind = {"Qwen2VL": "qwen2_vl", "Qwen2_5_VL": "qwen2_5_vl", "Qwen3VL": "qwen3_vl"}
    found = next((value for key, value in kind.items() if cls.__name__.startswith(key)), None)
    if found is None:
        raise NotImplementedError(f"no tiny offline model for {cls.__name__}")
    return tiny_qwen_vl.build(found)


class _TinyProcessor:
    """Answers ``apply_chat_template`` with the tiny models' text-image-video input (any messages)."""

    def __init__(self, kind: str = "qwen3_vl"):
        self.kind = kind

    def apply_chat_template(self, *args, **kwargs):
        import tiny_qwen_vl

        return tiny_qwen_vl.mixed_inputs(self.kind)

    def batch_decode(self, ids, **kwargs):
        return [" ".join(map(str, row.tolist())) for row in ids]


def _create_model(create):
    def create_with_random_weights(*args, pretrained=False, **kwargs):
        return create(*args, pretrained=False, **kwargs)

    return create_with_random_weights


def _to_without_gpu(to):
    def to_available_device(self, *args, **kwargs):
        if not torch.cuda.is_available():
            args = tuple("cpu" if isinstance(a, str) and a.startswith("cuda") else a for a in args)
            if isinstance(kwargs.get("device"), str) and kwargs["device"].startswith("cuda"):
                kwargs["device"] = "cpu"
            args = tuple(a for a in args if not isinstance(a, torch.dtype))  # tiny parts stay fp32 on the CPU
            kwargs.pop("dtype", None)
        return to(self, *args, **kwargs)

    return to_available_device


@contextlib.contextmanager
def tiny_offline_weights():
    import diffusers
    import timm
    import transformers

    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter

    qwen_classes = [
        getattr(transformers, name)
        for name in (
            "Qwen2VLForConditionalGeneration",
            "Qwen2_5_VLForConditionalGeneration",
            "Qwen3VLForConditionalGeneration",
        )
    ]
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            mock.patch.object(diffusers.DiffusionPipeline, "from_pretrained", classmethod(_tiny_pipeline))
        )
        stack.enter_context(
            mock.patch.object(diffusers.DiffusionPipeline, "to", _to_without_gpu(diffusers.DiffusionPipeline.to))
        )
        stack.enter_context(mock.patch.object(timm, "create_model", _create_model(timm.create_model)))
        stack.enter_context(
            mock.patch.object(diffusers.WanTransformer3DModel, "from_pretrained", classmethod(_tiny_wan_transformer))
        )
        stack.enter_context(mock.patch.object(CameraAdapter, "from_pretrained", classmethod(_tiny_camera_adapter)))
        for cls in qwen_classes:
            stack.enter_context(mock.patch.object(cls, "from_pretrained", classmethod(_tiny_qwen_vl)))
        stack.enter_context(
            mock.patch.object(transformers.AutoProcessor, "from_pretrained", lambda *args, **kwargs: _TinyProcessor())
        )
        yield
