"""End to end against diffusers 0.42.1: same checkpoint, prompt, seed and settings, same latents and frames.

Tolerance: final latents and decoded frames within 1e-4 (fp32). Sources of difference: float rounding
in the transformer (about 3e-6 per forward) compounded over the steps, and our re-pinning of
conditioned frames after every step (diffusers' base pipeline lets them drift by about 1e-6).
"""

import numpy as np
import pytest
from conftest import require, use_flow_match_scheduler
import torch
from PIL import Image

import cosmos3_runtime

require("diffusers", minversion="0.42.1")
import diffusers_reference as ref  # noqa: E402

TOL = 1e-4
SIZE = dict(height=48, width=64)
STEPS = 4


def picture(seed, height=48, width=64):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


MODES = {
    # mode: (num_frames, extra inputs for both pipelines)
    "t2i": (1, {}),
    "t2v": (9, {}),
    "i2v": (9, {"image": picture(1, 40, 72)}),  # not the target size: exercises resize and crop
    "v2v": (13, {"video": [picture(10 + i) for i in range(6)]}),  # 6 frames for 5 needed: keep first 5
}
# the modes as parameters, video-to-video (the longest) with the slow tests
MODE_PARAMS = [pytest.param(mode, marks=pytest.mark.slow) if mode == "v2v" else mode for mode in MODES]


@pytest.fixture(scope="module", params=["gated", "edge"])
def checkpoint(request, tiny_factory):
    return tiny_factory(kind=request.param)


@pytest.fixture(scope="module")
def ours(checkpoint):
    return cosmos3_runtime.load(checkpoint, dtype=torch.float32)


@pytest.mark.parametrize("schedule", ["checkpoint", "unipc"])
@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_generation_matches_diffusers(checkpoint, ours, mode, schedule):
    frames, extra = MODES[mode]
    common = dict(prompt="A robot arm stacks two cubes.", negative_prompt="blurry, static", num_frames=frames,
                  fps=16.0, **SIZE, **extra)
    pipe = ref.omni_pipeline(checkpoint, schedule)
    with torch.no_grad():
        expected = pipe(**common, num_inference_steps=STEPS, guidance_scale=4.0,
                        generator=torch.Generator("cpu").manual_seed(5), output_type="latent").video
    got = ours.generate(**common, steps=STEPS, guidance_scale=4.0, seed=5, schedule=schedule, flow_shift=10.0,
                        guidance_interval=None, json_captions=False, output="latents", cache="off")
    assert got.settings.mode == mode
    assert got.latents.shape == expected.shape
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(got.latents, expected.float(), atol=TOL, rtol=0)


def test_decoded_frames_match_diffusers(checkpoint, ours):
    common = dict(prompt="A red ball rolls.", num_frames=5, **SIZE)
    pipe = ref.omni_pipeline(checkpoint)
    with torch.no_grad():
        expected = pipe(**common, num_inference_steps=3, guidance_scale=3.0,
                        generator=torch.Generator("cpu").manual_seed(2), output_type="np").video
    got = ours.generate(**common, steps=3, guidance_scale=3.0, seed=2, schedule="checkpoint", json_captions=False,
                        cache="off")
    assert got.frames.shape == expected.shape == (5, 48, 64, 3)
    torch.testing.assert_close(got.frames, torch.from_numpy(expected), atol=TOL, rtol=0)


@pytest.mark.parametrize("mode", MODE_PARAMS)
def test_distilled_matches_the_distilled_modular_pipeline(tiny_factory, mode):
    root = tiny_factory(kind="gated", distilled=True)
    frames, extra = MODES[mode]
    common = dict(prompt="A cat on a sofa.", num_frames=frames, **SIZE, **extra)
    pipe = ref.distilled_pipeline(root)
    expected = pipe(**common, generator=torch.Generator("cpu").manual_seed(3), output="latents")
    got = cosmos3_runtime.load(root, dtype=torch.float32).generate(**common, seed=3, json_captions=False,
                                                                    output="latents", cache="off")
    assert got.settings.schedule == "distilled" and got.settings.steps == 4
    torch.testing.assert_close(got.latents, expected.float(), atol=TOL, rtol=0)


@pytest.mark.parametrize(
    "prompt, negative, frames, system",
    [
        ("A cat. ", "", 9, True),
        ("Wow!", "low quality.", 1, True),
        ('{"temporal_caption": "a dog"}', None, 9, False),
        ("", "", 13, True),
    ],
)
def test_token_ids_match_diffusers(checkpoint, ours, prompt, negative, frames, system):
    pipe = ref.omni_pipeline(checkpoint)
    options = dict(num_frames=frames, height=480, width=832, fps=24.0, use_system_prompt=system)
    expected = pipe.tokenize_prompt(prompt, negative, **options)
    request = cosmos3_runtime.Request(num_frames=frames, width=832, height=480, negative_prompt=negative,
                                      use_system_prompt=system, json_captions=False)
    _, cond, uncond = ours.planner.prepare(prompt, request)
    assert (cond, uncond) == tuple(list(ids) for ids in expected)


def test_multi_step_flow_match_checkpoint_matches_diffusers(tiny_gated, tmp_path):
    """A FlowMatch Euler scheduler without a fixed sigma list: multi-step, run as diffusers' task pipeline runs it."""
    import shutil

    root = use_flow_match_scheduler(shutil.copytree(tiny_gated, tmp_path / "flow-match"))
    common = dict(prompt="A robot arm stacks two cubes.", negative_prompt="blurry", num_frames=9, **SIZE)
    with torch.no_grad():
        expected = ref.omni_pipeline(root)(**common, num_inference_steps=STEPS, guidance_scale=4.0,
                                           generator=torch.Generator("cpu").manual_seed(5), output_type="latent").video
    got = cosmos3_runtime.load(root, dtype=torch.float32).generate(
        **common, steps=STEPS, guidance_scale=4.0, seed=5, schedule="checkpoint", json_captions=False, output="latents",
        cache="off",
    )
    assert "FlowMatchEulerDiscreteScheduler" in got.settings.notes[0]
    torch.testing.assert_close(got.latents, expected.float(), atol=TOL, rtol=0)
