"""Issue 35, round two: what the re-run of the issue's cases found not yet covered by a test, one test each.

Each test is fast (tiny configs, in-process CLI calls) and asserts the behaviour the issue asks for: a one-line
error naming the argument (CLI: exit 2, no traceback), nothing run from a pickle, nothing replaced unasked.
"""

import pytest
import torch

import mmpos

pytestmark = pytest.mark.usefixtures("one_thread")


# --- meta-device q/k on the camera encodings (the rotary ones had the check) ----------------------------------


def _camera_inputs():
    from test_camera_contract import GRID, IMAGE, B, C, P, fisheye_rays, random_c2w, random_k

    from mmpos.camera import Cameras

    rays, valid = fisheye_rays()
    cameras = Cameras(c2w=random_c2w(0), grid=GRID, image_size=IMAGE, intrinsics=random_k(1), rays=rays, valid=valid)
    return cameras, B, C * P


@pytest.mark.parametrize("name", [n for n in mmpos.list_pes("camera") if not mmpos.pe_capabilities(n).additive])
def test_meta_device_q_on_a_camera_encoding_is_a_named_error(name):
    cameras, batch, tokens = _camera_inputs()
    pe = mmpos.pe_class(name).for_head_dim(24).double()
    geometry = pe.prepare(cameras)
    q = torch.empty(batch, 2, tokens, 24, dtype=torch.float64, device="meta")
    depth = {"depth_q": torch.zeros(batch, tokens, 2, dtype=torch.float64)} if pe.capabilities.predicts_depth else {}
    for call in (lambda: pe.attention(q, q, q, geometry, **depth), lambda: pe.logits(q, q, geometry, **depth)):
        with pytest.raises(ValueError, match=r"^q(/k/v)? is on the meta device: .*materialise the model") as error:
            call()
        assert "\n" not in str(error.value)


def test_cameras_on_the_meta_device_are_a_named_error():
    from test_camera_contract import GRID, IMAGE, random_c2w

    from mmpos.camera import Cameras

    with pytest.raises(ValueError, match=r"^c2w is on the meta device"):
        Cameras(c2w=random_c2w(0).to("meta"), grid=GRID, image_size=IMAGE)


# --- pipe.camera_adapter = adapter: checked at assignment, as at load -------------------------------------------


def test_a_mismatched_camera_adapter_fails_at_assignment_with_the_load_message(tmp_path):
    from mmpos.integrations.diffusers.camera_adapter import CameraAdapter
    from mmpos.pipelines import CameraControlWanPipeline, load_camera_adapter
    from mmpos.pipelines.tiny_wan import tiny_wan_components

    pipe = CameraControlWanPipeline(**tiny_wan_components())
    fitting = CameraAdapter.for_transformer(pipe.transformer, "plucker")
    pipe.camera_adapter = fitting
    wrong = CameraAdapter(kind="plucker", dim=fitting.config.dim, num_layers=len(fitting.layers) + 1)
    with pytest.raises(ValueError) as at_assignment:
        pipe.camera_adapter = wrong
    assert pipe.camera_adapter is fitting  # the pipeline keeps its adapter
    wrong.save_pretrained(tmp_path / "wrong")
    with pytest.raises(ValueError) as at_load:
        load_camera_adapter(pipe, tmp_path / "wrong")
    assert str(at_assignment.value) == str(at_load.value) and "layers" in str(at_load.value)
    assert "\n" not in str(at_load.value)
    with pytest.raises(TypeError, match="camera_adapter must be a CameraAdapter"):
        pipe.camera_adapter = str(tmp_path / "wrong")
    pipe.camera_adapter = None
    assert pipe.camera_adapter is None
