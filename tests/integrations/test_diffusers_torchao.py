"""A torchao int8 weight-only transformer (``torchao.quantization.quantize_(model, Int8WeightOnlyConfig())``, what
diffusers' ``TorchAoConfig`` applies when loading) with ``set_pe``, in either order, on the tiny FLUX.1, FLUX.2,
Qwen-Image, Z-Image and Wan transformers, on the CPU. Properties: ``"native"`` on the quantised model is the quantised
stock model bit for bit (quantised before or after ``set_pe``), ``restore`` gives it back bit for bit, and an encoding
on the quantised model moves from the same encoding unquantised by at most twice what quantising moves the stock model.

torchao is not a dependency: installed, it makes every ``import diffusers`` print to stderr (with torch 2.14.1:
torchao 0.18.0 and 0.17.0 three lines, two ``register_constant() on Enum subclasses is deprecated`` from
``torch/utils/_pytree.py`` and diffusers' ``Unable to import `torchao` Tensor objects``; 0.16.0 and 0.15.0 one,
``Skipping import of cpp extensions due to incompatible torch version``; int8 weight-only runs on the CPU with 0.16.0
and 0.18.0). So the measurement runs in a subprocess, and the test is skipped unless torchao is importable there:
installed in the environment, or in a folder named by ``MMPOS_TORCHAO_SITE`` (``pip install --no-deps --target DIR
torchao``), which only that subprocess puts on its path.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FAMILIES = ["flux", "flux2", "qwen", "z_image", "wan"]
ROOT = Path(__file__).resolve().parents[2]


def measure() -> dict:
    """Per family: the measurements the test asserts on (run in the subprocess)."""
    import torch
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from mmpos.integrations.diffusers import restore, set_pe
    from mmpos.integrations.diffusers.families.tiny import CASES, output

    torch.set_num_threads(1)

    def run(model, inputs):
        with torch.no_grad():
            return output(model(**inputs, return_dict=False))

    def quantized(model):
        quantize_(model, Int8WeightOnlyConfig())
        return model

    def diff(a, b):
        return float((a - b).abs().max())

    results = {}
    for family in FAMILIES:
        case = CASES[family]
        inputs = case.inputs(*case.grid)
        stock, stock_q = run(case.model(), inputs), run(quantized(case.model()), inputs)
        weight_types = {
            type(m.weight).__name__ for m in quantized(case.model()).modules() if type(m).__name__ == "Linear"
        }
        native_q_first = quantized(case.model())
        set_pe(native_q_first, "native")
        native_pe_first = quantized(set_pe(case.model(), "native"))
        encoding = run(set_pe(case.model(), "rope_axial", theta=300.0), inputs)
        encoding_q = quantized(case.model())
        set_pe(encoding_q, "rope_axial", theta=300.0)
        encoding_q_out = run(encoding_q, inputs)
        restore(encoding_q)
        results[family] = {
            "weight_types": sorted(weight_types),
            "quantization_error": diff(stock_q, stock),
            "native_quantized_first": diff(run(native_q_first, inputs), stock_q),
            "native_set_pe_first": diff(run(native_pe_first, inputs), stock_q),
            "encoding_error": diff(encoding_q_out, encoding),
            "encoding_effect": diff(encoding, stock),
            "quantized_encoding_effect": diff(encoding_q_out, stock_q),
            "restored": diff(run(encoding_q, inputs), stock_q),
        }
    return results


def _environment():
    site = os.environ.get("MMPOS_TORCHAO_SITE")
    if site is None and importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao is not installed (pip install --no-deps --target DIR torchao; MMPOS_TORCHAO_SITE=DIR)")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    paths = [str(ROOT)] + ([site] if site else []) + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


@pytest.fixture(scope="module")
def measured() -> dict:
    env = _environment()
    command = [sys.executable, "-m", "tests.integrations.test_diffusers_torchao"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("family", FAMILIES)
def test_set_pe_on_a_torchao_int8_weight_only_transformer(measured, family):
    m = measured[family]
    assert "Int8Tensor" in m["weight_types"] or any("AffineQuantized" in t for t in m["weight_types"])
    assert m["quantization_error"] > 0  # the weights were rounded
    assert m["native_quantized_first"] == 0 and m["native_set_pe_first"] == 0 and m["restored"] == 0
    assert m["encoding_effect"] > 1e-4 and m["quantized_encoding_effect"] > 1e-4  # the encoding runs quantised too
    assert 0 < m["encoding_error"] <= 2 * m["quantization_error"]  # on the quantised weights


if __name__ == "__main__":
    print(json.dumps(measure()))
