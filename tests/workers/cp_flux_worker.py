"""One rank of test_context_parallel's 2-process runs (torchrun, gloo): a tiny Flux with ``set_pe`` and a
scheduled extrapolation preset, run in one process and then under diffusers' ``enable_parallelism`` (Ulysses and
ring); writes ``rank{R}.json``: per case, the largest difference between the two outputs.

The diffusers CPU limitations patched (and only those): see :mod:`cp_patches`.
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `tests` is a package


from mmpos.integrations.diffusers import model_extrapolation, set_pe  # noqa: E402
from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs  # noqa: E402
from tests.workers import cp_patches  # noqa: E402
from tests.workers.ending import end_process_group  # noqa: E402

out_dir, cases = Path(sys.argv[1]), json.loads(sys.argv[2])  # [[preset, mode, height, width, text], ...]
cp_patches.start()

differences = {}
for preset, mode, height, width, text in cases:
    model = tiny_flux(torch.float64)
    model.set_attention_backend("native")
    set_pe(model, "native", extrapolation=model_extrapolation(model, preset, trained_grid=(4, 4)))
    inputs = tiny_flux_inputs(torch.float64, height=height, width=width, text=text)
    with torch.no_grad():
        alone = model(**inputs, return_dict=False)[0]
        anything = (height * width) % 2 or text % 2
        model.enable_parallelism(config=cp_patches.parallel_config(mode, bool(anything)))
        parallel = model(**inputs, return_dict=False)[0]
    differences[f"{preset}/{mode}/{height}x{width}+{text}"] = float((parallel - alone).abs().max())
(out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(differences))
end_process_group()
