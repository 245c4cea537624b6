"""mmpos encodings in diffusers' Flux and Wan transformers (tiny configs from diffusers' own tests, no downloads)."""

import copy

import pytest
import torch

from mmpos.integrations.diffusers import (
    cast_keeping_pe_fp32,
    pe_parameters,
    position_module,
    restore,
    set_pe,
    shard_like_context_parallel,
    train_only_pe,
)
from mmpos.integrations.diffusers.positions import LayerTables, unpack_table
from tests.fixtures.tiny_models import tiny_flux, tiny_wan
from tests.fixtures.tiny_models import tiny_flux_inputs as flux_inputs
from tests.fixtures.tiny_models import tiny_wan_inputs as wan_inputs

pytestmark = pytest.mark.usefixtures("one_thread")


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs).sample


MODELS = {"flux": (tiny_flux, flux_inputs), "wan": (tiny_wan, wan_inputs)}


# ---------------------------------------------------------------- pe="native" is the stock model, bit for bit


@pytest.mark.parametrize("family", ["flux", "wan"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_is_bit_identical_to_stock(family, dtype):
    make, inputs_of = MODELS[family]
    model = make(dtype)
    inputs = inputs_of(dtype, batch=2) if family == "flux" else inputs_of(dtype)
    stock = run(model, inputs)
    set_pe(model, "native")
    assert torch.equal(run(model, inputs), stock)
    assert torch.equal(run(model, inputs), stock)  # the cached table gives the same bits


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_native_is_bit_identical_with_fused_qkv_projections(family):
    make, inputs_of = MODELS[family]
    model, inputs = make(), inputs_of()
    model.fuse_qkv_projections()
    stock = run(model, inputs)
    set_pe(model, "native")
    assert torch.equal(run(model, inputs), stock)


def test_native_follows_a_cast_after_set_pe_like_the_stock_buffers():
    stock, ours = tiny_wan(), tiny_wan()
    set_pe(ours, "native")
    stock.to(torch.bfloat16), ours.to(torch.bfloat16)  # casts the stock fp32 rope buffers to bf16
    inputs = wan_inputs(torch.bfloat16)
    assert torch.equal(run(ours, inputs), run(stock, inputs))


def test_native_wan_from_pretrained_bf16_keeps_fp32_tables(tmp_path):
    from diffusers import WanTransformer3DModel

    tiny_wan().save_pretrained(tmp_path)
    stock = WanTransformer3DModel.from_pretrained(tmp_path, torch_dtype=torch.bfloat16)
    ours = WanTransformer3DModel.from_pretrained(tmp_path, torch_dtype=torch.bfloat16)
    set_pe(ours, "native")
    assert ours.rope.native_dtype_probe.dtype == torch.float32  # _keep_in_fp32_modules = ["rope", ...]
    inputs = wan_inputs(torch.bfloat16)
    assert torch.equal(run(ours, inputs), run(stock, inputs))


def test_native_wan_image_to_video_branch():
    model = tiny_wan(image_dim=8, added_kv_proj_dim=24)
    gen = torch.Generator().manual_seed(2)
    inputs = wan_inputs(text=512)  # the stock processor hardcodes 512 text tokens
    inputs["encoder_hidden_states_image"] = torch.randn(1, 3, 8, generator=gen)
    stock = run(model, inputs)
    set_pe(model, "native")
    assert torch.equal(run(model, inputs), stock)


def tiny_flux_pipeline(transformer):
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline

    torch.manual_seed(0)
    vae = AutoencoderKL(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        shift_factor=0.0609,
        scaling_factor=1.5035,
    )
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=transformer,
    )


def sample(pipe, steps):
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randn(1, 8, 32, generator=gen)
    pooled = torch.randn(1, 32, generator=gen)
    pipe.set_progress_bar_config(disable=True)
    return pipe(
        prompt_embeds=prompt,
        pooled_prompt_embeds=pooled,
        height=8,
        width=8,
        num_inference_steps=steps,
        guidance_scale=3.5,
        generator=torch.Generator().manual_seed(3),
        output_type="pt",
    ).images


def test_flux_pipeline_native_is_bit_identical_and_builds_one_table_in_28_steps():
    pipe = tiny_flux_pipeline(tiny_flux())
    stock = sample(pipe, 28)
    set_pe(pipe.transformer, "native")
    ours = sample(pipe, 28)
    assert torch.equal(ours, stock)
    seam = position_module(pipe.transformer)
    assert seam.forwards == 28
    assert seam.table_builds == 1


# ---------------------------------------------------------------- restore


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_restore_puts_the_stock_modules_back(family):
    make, inputs_of = MODELS[family]
    model, inputs = make(), inputs_of()
    stock_out = run(model, inputs)
    processors = dict(model.attn_processors)
    position = model.pos_embed if family == "flux" else model.rope
    set_pe(model, "rope_mixed")
    assert not torch.equal(run(model, inputs), stock_out)
    set_pe(model, "rope_axial", extrapolation={"type": "ntk", "factor": 2.0})  # replaces the first
    restore(model)
    assert all(model.attn_processors[k] is p for k, p in processors.items())
    assert (model.pos_embed if family == "flux" else model.rope) is position
    assert not any(n.startswith(("pos_embed.encodings", "rope.encodings")) for n, _ in model.named_parameters())
    assert torch.equal(run(model, inputs), stock_out)
    with pytest.raises(ValueError, match="no mmpos encoding installed"):
        restore(model)


def test_restore_after_a_cast_gives_the_stock_model_cast_the_same_way():
    stock, ours = tiny_wan(), tiny_wan()
    set_pe(ours, "rope_mixed")
    ours.to(torch.bfloat16)
    restore(ours)
    stock.to(torch.bfloat16)
    inputs = wan_inputs(torch.bfloat16)
    assert torch.equal(run(ours, inputs), run(stock, inputs))


# ---------------------------------------------------------------- other encodings


@pytest.mark.parametrize("family", ["flux", "wan"])
@pytest.mark.parametrize(
    "pe,options",
    [
        ("rope_axial", {"allocation": "interleaved", "axes_dims": (8, 4, 4)}),  # MRoPE-I-style (Wan: (4, 4, 4))
        ("rope_mixed", {}),
        ("rope_axial", {"extrapolation": {"type": "ntk", "factor": 3.0}}),
        ("native", {"extrapolation": [None, {"type": "yarn", "factor": 2.0, "original_length": 2}, None]}),
    ],
)
def test_other_encodings_run_and_change_the_output(family, pe, options):
    make, inputs_of = MODELS[family]
    model, inputs = make(), inputs_of()
    stock = run(model, inputs)
    if family == "wan" and "axes_dims" in options:
        options = dict(options, axes_dims=(4, 4, 4))
    set_pe(model, pe, **options)
    out = run(model, inputs)
    assert torch.isfinite(out).all()
    assert (out - stock).abs().max() > 1e-4


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_rope_axial_with_model_defaults_is_the_native_encoding(family):
    make, inputs_of = MODELS[family]
    model, inputs = make(), inputs_of()
    stock = run(model, inputs)
    set_pe(model, "rope_axial")  # mmpos' operator: same rotation up to fp32 rounding
    encoding = position_module(model).encodings[0]
    assert encoding.axes_dims == ((4, 4, 8) if family == "flux" else (4, 4, 4))
    torch.testing.assert_close(run(model, inputs), stock, rtol=1e-5, atol=1e-5)


def test_nope_equals_stock_when_every_position_is_zero():
    model, inputs = tiny_flux(), flux_inputs()
    inputs.update(img_ids=torch.zeros_like(inputs["img_ids"]), txt_ids=torch.zeros_like(inputs["txt_ids"]))
    stock = run(model, inputs)
    set_pe(model, "nope")
    assert torch.equal(run(model, inputs), stock)
    assert pe_parameters(model) == []


@pytest.mark.parametrize("pe,options", [("native", {}), ("rope_mixed", {}), ("rope_axial", {"coord_axes": (1, 2)})])
def test_flux_output_is_invariant_to_a_global_shift_of_positions(pe, options):
    """Relative property end to end (fp64): moving every token by the same offset changes nothing."""
    model, inputs = tiny_flux(torch.float64), flux_inputs(torch.float64)
    set_pe(model, pe, **options)
    shifted = dict(
        inputs,
        img_ids=inputs["img_ids"] + torch.tensor([3.0, -5.0, 7.0]),
        txt_ids=inputs["txt_ids"] + torch.tensor([3.0, -5.0, 7.0]),
    )
    tolerance = 1e-5 if pe == "native" else 1e-10  # native keeps the stock fp32 cos/sin tables
    torch.testing.assert_close(run(model, shifted), run(model, inputs), rtol=0, atol=tolerance)
    moved_image_only = dict(inputs, img_ids=inputs["img_ids"] + torch.tensor([0.0, 4.0, 0.0]))
    assert (run(model, moved_image_only) - run(model, inputs)).abs().max() > 1e-6


def test_riflex_on_wan_time_axis_changes_only_its_pair():
    model = tiny_wan()
    set_pe(model, "native")
    cos_native, _ = model.rope(wan_inputs(frames=6)["hidden_states"])
    riflex = {"type": "riflex", "k": 2, "target_length": 6}
    set_pe(model, "native", extrapolation=[riflex, None, None])
    cos_riflex, _ = model.rope(wan_inputs(frames=6)["hidden_states"])
    changed = (cos_native != cos_riflex).any(dim=1).flatten()  # per channel
    assert changed.nonzero().flatten().tolist() == [2, 3]  # time pair k=2 -> channels 2, 3; no other channel


# ---------------------------------------------------------------- tables: once per forward, cached across steps


def count_table_calls(encoding):
    calls = []
    original = encoding.table

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    encoding.table = counted
    return calls


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_one_table_per_forward_and_cached_across_steps(family):
    make, inputs_of = MODELS[family]
    model, inputs = make(), inputs_of()
    set_pe(model, "rope_axial")
    seam = position_module(model)
    calls = count_table_calls(seam.encodings[0])
    for _ in range(3):
        run(model, inputs)
    layers = len(model.attn_processors)
    assert layers >= 2 and len(calls) == 3  # one table request per forward, whatever the depth
    assert seam.table_builds == 1 and seam.forwards == 3
    run(model, inputs_of(height=8) if family == "flux" else inputs_of(frames=3))
    assert seam.table_builds == 2  # a new shape builds a new table


def test_wan_reuses_its_grid_coordinates_across_steps(monkeypatch):
    model, inputs = MODELS["wan"][0](), MODELS["wan"][1]()
    set_pe(model, "rope_axial")
    run(model, inputs)
    compared = []
    original = torch.equal
    monkeypatch.setattr(torch, "equal", lambda a, b: compared.append(1) or original(a, b))
    run(model, inputs)  # table cache hit by identity: no value comparison (a device sync on GPUs)
    assert not compared and position_module(model).table_builds == 1


def test_learned_encoding_rebuilds_its_table_once_per_training_forward():
    model, inputs = tiny_flux(), flux_inputs()
    set_pe(model, "rope_mixed")
    train_only_pe(model)
    seam = position_module(model)
    for _ in range(2):
        model(**inputs).sample.sum().backward()
    assert seam.table_builds == 2 and seam.forwards == 2


# ---------------------------------------------------------------- training only the PE


@pytest.mark.parametrize("family,per_layer", [("flux", False), ("wan", True)])
def test_gradients_reach_only_pe_parameters(family, per_layer):
    make, inputs_of = MODELS[family]
    model, inputs = make(), inputs_of()
    set_pe(model, "rope_mixed", per_layer=per_layer)
    trainable = train_only_pe(model)
    assert len(trainable) == (len(model.blocks) if per_layer else 1)
    model.train()
    model(**inputs).sample.square().mean().backward()
    pe_ids = {id(p) for p in trainable}
    for name, p in model.named_parameters():
        if id(p) in pe_ids:
            assert p.requires_grad and p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert not p.requires_grad and p.grad is None, name


def test_cast_keeping_pe_fp32_keeps_learned_frequencies_exact():
    model = tiny_flux()
    set_pe(model, "rope_mixed")
    (freqs,) = pe_parameters(model)
    before = freqs.detach().clone()
    cast_keeping_pe_fp32(model, torch.bfloat16)
    (freqs,) = pe_parameters(model)
    assert freqs.dtype == torch.float32 and torch.equal(freqs, before)
    assert model.transformer_blocks[0].attn.to_q.weight.dtype == torch.bfloat16
    assert torch.isfinite(run(model, flux_inputs(torch.bfloat16))).all()


@pytest.mark.parametrize("family", ["flux", "wan"])
def test_per_layer_encodings_with_equal_parameters_match_the_shared_one(family):
    tiny, inputs_of = MODELS[family]
    shared, per_layer, inputs = tiny(torch.float64), tiny(torch.float64), inputs_of(torch.float64)
    set_pe(shared, "rope_mixed", seed=0)
    set_pe(per_layer, "rope_mixed", per_layer=True)
    source = position_module(shared).encodings[0].freqs
    with torch.no_grad():
        for encoding in position_module(per_layer).encodings:
            encoding.freqs.copy_(source)
    assert torch.equal(run(per_layer, inputs), run(shared, inputs))


def test_seeded_per_layer_encodings_get_distinct_seeds():
    from mmpos import create_pe

    model = MODELS["flux"][0](torch.float32)
    set_pe(model, "rope_mixed", per_layer=True, seed=7)
    encodings = position_module(model).encodings
    assert len(encodings) > 1
    for index, encoding in enumerate(encodings):  # seed + layer index, as create_block_pes seeds timm/DiT blocks
        expected = create_pe(
            "rope_mixed", head_dim=encoding.head_dim, num_heads=encoding.num_heads, num_axes=3, seed=7 + index
        ).freqs
        assert torch.equal(encoding.freqs.detach().cpu(), expected.detach())


def test_gradient_checkpointing_gives_the_same_pe_gradients():
    grads = []
    for checkpointing in (False, True):
        model, inputs = tiny_flux(), flux_inputs()
        set_pe(model, "rope_mixed", seed=0)
        (freqs,) = train_only_pe(model)
        model.train()
        if checkpointing:
            model.enable_gradient_checkpointing()
        model(**inputs).sample.square().mean().backward()
        grads.append(freqs.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- attention backends


def test_attention_backend_option_reaches_every_processor():
    from diffusers.models.attention_dispatch import AttentionBackendName

    model, inputs = tiny_flux(), flux_inputs()
    stock = run(model, inputs)
    set_pe(model, "native", attention_backend="_native_math")
    assert all(p._attention_backend == AttentionBackendName("_native_math") for p in model.attn_processors.values())
    torch.testing.assert_close(run(model, inputs), stock, rtol=1e-5, atol=1e-5)
    set_pe(model, "native", attention_backend="auto")  # no CUDA here: SDPA
    assert all(p._attention_backend == AttentionBackendName("native") for p in model.attn_processors.values())
    model.reset_attention_backend()


def test_processors_keep_a_backend_set_before_set_pe():
    from diffusers.models.attention_dispatch import AttentionBackendName

    model = tiny_wan()
    model.set_attention_backend("_native_math")
    set_pe(model, "rope_axial")
    assert all(p._attention_backend == AttentionBackendName("_native_math") for p in model.attn_processors.values())
    model.reset_attention_backend()


# ---------------------------------------------------------------- context parallelism (single-process replay)


@pytest.mark.parametrize("pe", ["rope_axial", "rope_mixed"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_wan_sharded_tables_match_tables_of_the_sharded_grid(pe, world_size):
    from mmpos.coords import video_grid

    model = tiny_wan()
    set_pe(model, pe)
    seam, rotation = position_module(model), model.blocks[0].attn1.processor.rotation
    packed, coords = model.rope(wan_inputs(frames=2, height=8, width=8)["hidden_states"])  # 32 tokens
    full_coords = video_grid(2, 4, 4)
    assert torch.equal(coords[0, :, 0], full_coords)
    q = torch.randn(1, 32, 2, 12)
    q_full = rotation(q, q, (packed, coords), 0)[0]
    for rank in range(world_size):
        shard = tuple(shard_like_context_parallel(t, 1, world_size, rank) for t in (packed, coords))
        own = seam.encodings[0].table(shard_like_context_parallel(full_coords, 0, world_size, rank))
        torch.testing.assert_close(
            unpack_table(shard[0], 0, rotation.group_sizes[0]).cis,
            own.cis.reshape(unpack_table(shard[0], 0, rotation.group_sizes[0]).cis.shape),
            rtol=0,
            atol=0,
        )
        q_rank = shard_like_context_parallel(q, 1, world_size, rank)
        assert torch.equal(
            rotation(q_rank, q_rank, shard, 0)[0], shard_like_context_parallel(q_full, 1, world_size, rank)
        )


def test_flux_ranks_rotate_their_tokens_with_their_global_ids_and_attention_matches():
    """Replays Flux's plan: each rank gets [txt shard, img shard] ids and tokens; after gathering the rotated keys
    (ring/Ulysses see rotated k), every rank's attention output equals the unsharded one (fp64)."""
    model, inputs = tiny_flux(torch.float64), flux_inputs(torch.float64, height=4, width=4, text=8)
    set_pe(model, "rope_mixed")
    rotation = model.transformer_blocks[0].attn.processor.rotation
    txt, img = inputs["txt_ids"].double(), inputs["img_ids"].double()
    world_size, heads, head_dim = 2, 2, 16
    q, k, v = (torch.randn(1, 24, heads, head_dim, dtype=torch.float64) for _ in range(3))

    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)

    q_rot, k_rot = rotation(q, k, model.pos_embed(torch.cat([txt, img])), 0)
    full = attend(q_rot, k_rot, v)

    def rank_rows(rank):  # token indices of rank's [txt shard, img shard] in the joint sequence
        rows = torch.arange(24)
        return torch.cat(
            [
                shard_like_context_parallel(rows[:8], 0, world_size, rank),
                shard_like_context_parallel(rows[8:], 0, world_size, rank),
            ]
        )

    local = []
    for rank in range(world_size):
        ids = torch.cat(
            [
                shard_like_context_parallel(txt, 0, world_size, rank),
                shard_like_context_parallel(img, 0, world_size, rank),
            ]
        )
        rows = rank_rows(rank)
        local.append((rows, *rotation(q[:, rows], k[:, rows], model.pos_embed(ids), 0), v[:, rows]))
    keys, values = torch.cat([r[2] for r in local], dim=1), torch.cat([r[3] for r in local], dim=1)
    for rows, q_rank, _, _ in local:
        torch.testing.assert_close(attend(q_rank, keys, values), full[:, rows], rtol=0, atol=1e-12)


def capture_first_rotation(model):
    """Record (q, k) as rotated by the first attention layer."""
    processor = next(iter(model.attn_processors.values()))
    captured, rotation = [], processor.rotation

    def capturing(query, key, rotary_emb, layer):
        captured.append(rotation(query, key, rotary_emb, layer))
        return captured[-1]

    processor.rotation = capturing
    return captured


def replay_context_parallel_plan(model, world_size, rank, monkeypatch):
    """Install diffusers' own ``_cp_plan`` hooks as rank ``rank`` would, with the collectives replaced by local
    slicing (no process group): inputs are sharded exactly as under ``enable_parallelism``; attention stays local."""
    import types

    from diffusers.hooks import context_parallel as cp

    monkeypatch.setattr(
        cp.EquipartitionSharder,
        "shard",
        classmethod(lambda cls, t, dim, mesh: shard_like_context_parallel(t, dim, world_size, rank)),
    )
    monkeypatch.setattr(cp.EquipartitionSharder, "unshard", classmethod(lambda cls, t, dim, mesh: t))
    config = types.SimpleNamespace(ulysses_anything=False, ring_anything=False, _flattened_mesh=None, _mesh=None)
    cp.apply_context_parallel(model, config, model._cp_plan)


@pytest.mark.parametrize(
    "family,pe", [("wan", "rope_mixed"), ("wan", "native"), ("flux", "rope_mixed"), ("flux", "native")]
)
def test_diffusers_cp_plan_shards_tables_with_their_tokens(family, pe, monkeypatch):
    """Under the model's real ``_cp_plan`` hooks, each rank's first-layer q and k are rotated exactly like its rows
    of the unsharded sequence: coordinates are global and tables are sharded with the tokens."""
    tiny, inputs_of = MODELS[family]
    world_size = 2
    inputs = (
        inputs_of(torch.float64, height=4, width=4, text=8)
        if family == "flux"
        else inputs_of(torch.float64, frames=2, height=8, width=8)
    )
    model = tiny(torch.float64)
    set_pe(model, pe)
    captured = capture_first_rotation(model)
    run(model, inputs)
    q_full, k_full = captured[0]
    rows = torch.arange(q_full.shape[1])
    for rank in range(world_size):
        ranked = copy.deepcopy(model)
        captured = capture_first_rotation(ranked)
        replay_context_parallel_plan(ranked, world_size, rank, monkeypatch)
        with torch.no_grad():
            ranked(**inputs, return_dict=False)  # as pipelines call it (the plan's hooks need tuples)
        if family == "flux":  # the joint sequence of rank r is [text shard r, image shard r]
            own = torch.cat(
                [
                    shard_like_context_parallel(rows[:8], 0, world_size, rank),
                    shard_like_context_parallel(rows[8:], 0, world_size, rank),
                ]
            )
        else:
            own = shard_like_context_parallel(rows, 0, world_size, rank)
        q_rank, k_rank = captured[0]
        assert q_rank.shape[1] == len(own)
        torch.testing.assert_close(q_rank, q_full[:, own], rtol=0, atol=1e-12)
        torch.testing.assert_close(k_rank, k_full[:, own], rtol=0, atol=1e-12)


def test_set_pe_after_enable_parallelism_on_wan_is_refused():
    model = tiny_wan()
    model._parallel_config = object()  # what enable_parallelism records
    with pytest.raises(RuntimeError, match="before enable_parallelism"):
        set_pe(model, "rope_axial")


def test_shard_like_context_parallel_mirrors_diffusers_sharders():
    x = torch.arange(10)
    assert shard_like_context_parallel(x, 0, 2, 1).tolist() == [5, 6, 7, 8, 9]
    assert shard_like_context_parallel(x, 0, 3, 2, anything=True).tolist() == [7, 8, 9]
    with pytest.raises(ValueError, match="not divisible by world_size=3"):
        shard_like_context_parallel(x, 0, 3, 0)
    with pytest.raises(ValueError, match="rank=2"):
        shard_like_context_parallel(x, 0, 2, 2)


# ---------------------------------------------------------------- bad input


def test_unknown_model_class_is_refused():
    with pytest.raises(
        TypeError,
        match=r"supports the diffusers families .*FluxTransformer2DModel.*WanTransformer3DModel.*; got Linear",
    ):
        set_pe(torch.nn.Linear(2, 2), "native")


@pytest.mark.parametrize(
    "pe,options,error,match",
    [
        ("rope_axial", {"head_dim": 32}, ValueError, "head_dim=32.*attention_head_dim=16"),
        ("rope_axial", {"num_axes": 2}, ValueError, r"reads 2 coordinate axes.*gives 3 \('index', 'row', 'col'\)"),
        ("rope_axial", {"axes_dims": (8, 8, 8)}, ValueError, "exceed head_dim=16"),
        ("rope_mixed", {"num_heads": 3}, ValueError, "one per head"),
        ("ape_sincos", {}, TypeError, "'absolute' encoding"),
        ("rope_axial", {"seq_dim": -2}, ValueError, "seq_dim=-3"),
        ("native", {"allocation": "interleaved"}, TypeError, "pe='rope_axial'"),
        ("rope_axial", {"coord_axes": (0, 3)}, ValueError, "coord_axes"),
        ("rope_axial", {"colour": 1}, TypeError, r"unknown option\(s\) \['colour'\]"),
        ("no_such_pe", {}, ValueError, "unknown encoding"),
    ],
)
def test_encodings_that_do_not_fit_flux_are_refused(pe, options, error, match):
    model = tiny_flux()
    with pytest.raises(error, match=match):
        set_pe(model, pe, **options)
    assert getattr(model, "_mmpos_installed", None) is None  # nothing half-installed


def test_processors_with_extra_behaviour_are_not_replaced():
    """A processor mmpos does not know (a user's own) is refused by name; the IP-Adapter's one composes
    (tests/integrations/test_ip_adapter_with_set_pe.py)."""
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor

    class LoggingProcessor(FluxAttnProcessor):  # extra behaviour set_pe would silently drop
        pass

    model = tiny_flux()
    model.transformer_blocks[0].attn.set_processor(LoggingProcessor())
    with pytest.raises(TypeError, match="transformer_blocks.0.attn uses LoggingProcessor"):
        set_pe(model, "native")


def test_flux_ids_that_do_not_match_the_tokens_are_refused():
    model, inputs = tiny_flux(), flux_inputs()
    set_pe(model, "native")
    with pytest.raises(ValueError, match=r"img_ids has shape \(15, 3\).*hidden_states has 16 tokens"):
        run(model, dict(inputs, img_ids=inputs["img_ids"][:15]))
    big = torch.full_like(inputs["img_ids"], 300.0).to(torch.bfloat16)
    with pytest.raises(ValueError, match="img_ids is torch.bfloat16 with positions above 256"):
        run(model, dict(inputs, img_ids=big))


def test_wan_latents_not_divisible_by_the_patch_are_refused():
    model = tiny_wan()
    set_pe(model, "rope_axial")
    with pytest.raises(ValueError, match=r"\(2, 8, 7\), not divisible by the patch size \(1, 2, 2\)"):
        run(model, wan_inputs(width=7))


def test_unknown_attention_backend_is_refused():
    with pytest.raises(ValueError, match="must be one of"):
        set_pe(tiny_flux(), "native", attention_backend="no_such_backend")


def test_xformers_backend_without_xformers_is_a_clear_error():
    try:
        import xformers.ops  # noqa: F401

        pytest.skip("xformers is installed here")
    except ImportError:
        pass
    model = tiny_flux()
    with pytest.raises(RuntimeError, match="xformers"):
        set_pe(model, "native", attention_backend="xformers")
    assert getattr(model, "_mmpos_installed", None) is None


def test_train_only_pe_needs_parameters():
    model = tiny_flux()
    set_pe(model, "native")
    with pytest.raises(ValueError, match="no parameters to train"):
        train_only_pe(model)


def test_layer_tables_is_what_flux_processors_receive():
    model = tiny_flux()
    set_pe(model, "rope_axial")
    tables = model.pos_embed(flux_inputs()["txt_ids"])
    assert isinstance(tables, LayerTables) and len(tables) == 1 and tables[0].cis.shape == (8, 8)


def test_deepcopy_keeps_an_independent_working_install():
    model, inputs = tiny_flux(), flux_inputs()
    set_pe(model, "rope_mixed")
    clone = copy.deepcopy(model)
    mixed = run(model, inputs)
    torch.testing.assert_close(run(clone, inputs), mixed, rtol=0, atol=0)
    restore(clone)
    assert model._mmpos_installed is not None and len(model._forward_pre_hooks) == 1
    torch.testing.assert_close(run(model, inputs), mixed, rtol=0, atol=0)
    assert not torch.equal(run(clone, inputs), mixed)


def test_harope_on_flux_takes_the_model_axes_and_starts_at_stock():
    """A wrapping encoding gets the model's spectrum in its base_options; at init it is the stock model."""
    from tests.fixtures.tiny_models import tiny_flux, tiny_flux_inputs

    transformer, inputs = tiny_flux(), tiny_flux_inputs()
    stock = transformer(**inputs).sample
    set_pe(transformer, "harope", per_layer=True)
    torch.testing.assert_close(transformer(**inputs).sample, stock, rtol=0, atol=1e-6)
    trainable = train_only_pe(transformer)
    transformer.train()  # HARoPE caches U, V in eval mode
    transformer(**inputs).sample.square().mean().backward()
    with_grad = {id(p) for p in transformer.parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad == {id(p) for p in trainable} == {id(p) for p in pe_parameters(transformer)}
    assert len(trainable) == 3 * len(transformer.transformer_blocks + transformer.single_transformer_blocks)


def test_set_pe_refuses_coordinate_jitter_it_would_ignore():
    transformer = tiny_flux()
    with pytest.raises(ValueError, match="perturbation"):
        set_pe(transformer, "comrope_ap", coord_axes=(1, 2), block_size=2, perturbation=0.5, grid_size=(4, 4))
