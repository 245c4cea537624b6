"""torch.compile traces the rotary operator (real-arithmetic path) on attention-style views."""

import pytest
import torch

import mmpos
from mmpos.coords import image_grid


def test_compiled_rotation_matches_eager_on_views_with_prefix_and_backward():
    pe = mmpos.create_pe("rope_axial", head_dim=16, axes_dims=(6, 6), num_prefix_tokens=1)
    grid = image_grid(4, 4)
    qkv = torch.randn(1, 17, 3, 2, 16).permute(2, 0, 3, 1, 4)  # [3, B, H, L, D] views, as inside attention
    q = qkv[0].clone().requires_grad_(True)  # same strides pattern as the view, but a leaf for the gradient
    compiled = torch.compile(lambda t: pe(t, t, grid)[0])
    out = compiled(qkv[0])
    torch.testing.assert_close(out, pe(qkv[0], qkv[0], grid)[0], rtol=0, atol=1e-6)
    assert torch.equal(out[:, :, 0], qkv[0][:, :, 0])  # the prefix token is untouched
    (compiled(q) * torch.arange(16.0)).sum().backward()
    eager = q.detach().clone().requires_grad_(True)
    (pe(eager, eager, grid)[0] * torch.arange(16.0)).sum().backward()
    torch.testing.assert_close(q.grad, eager.grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["rope_axial", "rope_mixed", "comrope_ap", "comrope_ld", "harope"])
def test_converted_timm_vit_traces_without_graph_breaks_and_matches_eager(name):
    """Dynamo traces a converted ViT's training forward in one graph (no breaks in tables, caches, validation
    or the learned encodings), and the compiled step's loss and encoding gradients equal eager's."""
    import timm

    from mmpos.integrations.timm import convert

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = convert(timm.create_model("vit_tiny_patch16_224", img_size=32, depth=1, num_classes=4), pe=name).train()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(("u_skew", "v_skew", "sigma")):
                p.normal_(std=0.05)  # HARoPE away from M = I
    images = torch.randn(2, 3, 32, 32)
    pe_params = [p for n, p in model.named_parameters() if ".pe." in n]
    _assert_one_graph_and_compiled_equals_eager(model, pe_params, lambda out: out.square().mean(), images)


def _assert_one_graph_and_compiled_equals_eager(model, params, loss_of, *args, **kwargs):
    """No graph break in ``model(*args, **kwargs)``, and a fullgraph compile gives eager's loss and ``params``'
    gradients."""
    explanation = torch._dynamo.explain(model)(*args, **kwargs)
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]

    def step(forward):
        for p in model.parameters():
            p.grad = None
        loss = loss_of(forward(*args, **kwargs))
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in params]

    eager_loss, eager_grads = step(model)
    compiled_loss, compiled_grads = step(torch.compile(model, backend="eager", fullgraph=True))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["rope_axial", "harope"])
def test_dynamic_compile_takes_new_image_sizes_without_recompiling(name):
    """``torch.compile(dynamic=True)`` of a converted ViT (timm's ``dynamic_img_pad=True``: its unpadded patch
    embedding formats the size into an assertion message, which pins it) compiles one graph for three image
    sizes: no size-dependent guard in the positions, tables, checks or HARoPE's folding choice."""
    import timm

    from mmpos.integrations.timm import convert

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", img_size=64, depth=1, num_classes=4, dynamic_img_size=True, dynamic_img_pad=True
    )
    compiled = torch.compile(convert(model, pe=name).train(), dynamic=True, backend="eager")
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for size in (64, 96, 128):
        compiled(torch.randn(2, 3, size, size)).square().mean().backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 1


@pytest.mark.parametrize(
    "name,options",
    [
        ("rope_axial", {}),
        ("rope_mixed", dict(per_layer=True)),
        ("comrope_ap", dict(per_layer=True, coord_axes=(1, 2))),
        ("comrope_ld", dict(per_layer=True)),
        ("harope", dict(per_layer=True)),
    ],
)
def test_set_pe_flux_traces_in_one_graph_and_matches_eager(name, options):
    """A diffusers Flux with an mmpos encoding (``set_pe``) traces without graph breaks (the position module's
    table count is not kept while tracing), and the compiled forward and encoding gradients equal eager's."""
    from mmpos.integrations.diffusers import pe_parameters, set_pe
    from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs

    torch._dynamo.reset()
    model = set_pe(tiny_flux(), name, **options)

    def loss_of(output):  # a fixed projection of the output
        return (output.sample * torch.linspace(-1, 1, output.sample.numel()).view_as(output.sample)).sum()

    _assert_one_graph_and_compiled_equals_eager(model, list(pe_parameters(model)), loss_of, **tiny_flux_inputs())
