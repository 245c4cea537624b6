"""One rank of test_context_parallel_refusal's 2-process case (torchrun, gloo): a family without a verified plan
(Chroma, which diffusers gives no ``_cp_plan``) under FLUX.1's plan passed as the caller's ``cp_plan`` (Ulysses,
degree 2; Chroma's forward takes FLUX.1's arguments, so the plan applies as is).

Writes ``rank{R}.json``: whether the stock model runs under the plan (its output's shape, and its largest
difference to one process); the error of a forward with ``set_pe`` under the plan and of ``set_pe`` after
``enable_parallelism``; and, with the refusal bypassed (Chroma marked verified for this process only), the
largest difference to one process of ``set_pe`` native and with DyPE at twice the training grid: what the
refusal keeps from the caller. The diffusers CPU limitations patched: see :mod:`cp_patches`.
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests` is a package

from diffusers import ChromaTransformer2DModel, FluxTransformer2DModel  # noqa: E402

from mmpos.integrations.diffusers import model_extrapolation, set_pe  # noqa: E402
from mmpos.integrations.diffusers.families import FAMILIES, get_family  # noqa: E402
from mmpos.integrations.diffusers.families.tiny import CHROMA_CONFIG, chroma_inputs, output  # noqa: E402
from tests.workers import cp_patches  # noqa: E402
from tests.workers.ending import end_process_group  # noqa: E402

INPUTS = chroma_inputs(8, 8, text=4)  # 64 image + 4 text tokens: even shards; trained grid 4 x 4


def chroma(preset=None, install=False):
    """The seeded tiny Chroma (SDPA), with ``set_pe("native")`` (and ``preset``) when ``install``."""
    torch.manual_seed(0)
    model = ChromaTransformer2DModel(**CHROMA_CONFIG).eval()
    model.set_attention_backend("native")
    if install:
        options = {} if preset is None else {"extrapolation": model_extrapolation(model, preset, trained_grid=(4, 4))}
        set_pe(model, "native", **options)
    return model


def parallel(model):
    model.enable_parallelism(
        config=cp_patches.parallel_config("ulysses", False), cp_plan=FluxTransformer2DModel._cp_plan
    )
    return model


def forward(model):
    with torch.no_grad():
        return output(model(**INPUTS, return_dict=False))


def refusal(call) -> dict:
    try:
        call()
    except RuntimeError as error:
        return dict(error=str(error))
    return dict(ran=True)


def bypassed(preset) -> float:
    """Largest difference to one process with Chroma marked verified (the refusal off)."""
    family = get_family("chroma")
    FAMILIES["chroma"] = dataclasses.replace(family, context_parallel=True)
    try:
        alone = forward(chroma(preset, install=True))
        return float((forward(parallel(chroma(preset, install=True))) - alone).abs().max())
    finally:
        FAMILIES["chroma"] = family


cp_patches.start()
stock_alone = forward(chroma())
stock = forward(parallel(chroma()))
results = dict(
    stock_runs=True,
    stock_shape=list(stock.shape),
    one_process_shape=list(stock_alone.shape),
    stock_difference=float((stock - stock_alone).abs().max()),
    forward=refusal(lambda: forward(parallel(chroma(install=True)))),
    set_pe=refusal(lambda: set_pe(parallel(chroma()), "native")),
    bypassed={str(preset): bypassed(preset) for preset in (None, "dype")},
)
(Path(sys.argv[1]) / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
end_process_group()
