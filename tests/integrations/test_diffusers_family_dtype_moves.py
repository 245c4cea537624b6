"""A dtype move after ``set_pe``: every registered diffusers family (tiny configs of ``fixtures.families``), native
installed in float32 and then ``model.to(torch.bfloat16)``, gives the stock bfloat16 model's output bit for bit,
and so does :func:`restore` after the move (issue 41: Kandinsky 6 differed by 0.0078, its tables following the
dtype of a stock module that the move did not reach)."""

import pytest
import torch

from mmpos.integrations.diffusers import restore, set_pe
from mmpos.integrations.diffusers.families import builtin_families
from tests.fixtures.families import CASES
from tests.integrations.test_diffusers_families import cast, run


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("family", builtin_families())
def test_native_then_a_dtype_move_is_the_stock_model_in_that_dtype(family):
    torch.set_num_threads(1)
    case = CASES[family]
    inputs = cast(case.inputs(*case.grid), torch.bfloat16)
    stock = run(case.model().to(torch.bfloat16), inputs)
    model = case.model()
    set_pe(model, "native")
    run(model, cast(case.inputs(*case.grid), torch.float32))  # a float32 forward first: nothing cached survives
    model.to(torch.bfloat16)
    assert torch.equal(run(model, inputs), stock)
    restore(model)
    assert torch.equal(run(model, inputs), stock)
