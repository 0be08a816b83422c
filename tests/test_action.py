"""Action generation against diffusers 0.42.1 (`Cosmos3OmniPipeline` with `CosmosActionCondition`), fp32 CPU.

Policy, forward dynamics and inverse dynamics on tiny gated and Edge checkpoints with action heads:
actions, final latents and the action prompt's token ids. Inputs whose aspect ratio needs padding
and chunk sizes other than 16.
"""

import numpy as np
import pytest
import torch
from conftest import require
from PIL import Image

import cosmos3_runtime
from cosmos3_runtime import InputError
from cosmos3_runtime.action import ActionRequest, action_prompt, canvas_size

require("diffusers", minversion="0.42.1")
import diffusers_reference as ref  # noqa: E402
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition  # noqa: E402

TOL = 1e-4


def picture(seed, height=200, width=280):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module", params=["gated", "edge"])
def checkpoint(request, tiny_factory):
    return tiny_factory(kind=request.param, action=True)


@pytest.fixture(scope="module")
def ours(checkpoint):
    return cosmos3_runtime.load(checkpoint, dtype=torch.float32)


CASES = {
    "policy-droid": dict(mode="policy", chunk_size=8, domain="droid_lerobot", image=picture(1)),
    "forward-agibot": dict(mode="forward_dynamics", chunk_size=4, domain="agibotworld", image=picture(3, 240, 180),
                           actions=torch.randn(3, 29, generator=torch.Generator().manual_seed(2))),  # repeats the last
    "inverse-pusht": dict(mode="inverse_dynamics", chunk_size=4, domain="pusht",
                          video=[picture(10 + i, 176, 320) for i in range(5)]),
}


@pytest.mark.parametrize("case", CASES)
def test_action_generation_matches_diffusers(checkpoint, ours, case):
    options = CASES[case]
    request = ActionRequest(resolution_tier=256, view_point="ego_view", preset="diffusers", **options)
    reference = ref.omni_pipeline(checkpoint)
    condition = CosmosActionCondition(mode=options["mode"], chunk_size=options["chunk_size"],
                                      domain_name=options["domain"], resolution_tier=256,
                                      raw_actions=options.get("actions"), image=options.get("image"),
                                      video=options.get("video"), view_point="ego_view")
    with torch.no_grad():
        expected = reference("Pick up the red cube", negative_prompt="blurry", action=condition, fps=15.0,
                             num_inference_steps=3, guidance_scale=3.0, generator=torch.Generator("cpu").manual_seed(4),
                             output_type="latent")
    got = ours.generate("Pick up the red cube", negative_prompt="blurry", action=request, fps=15.0, steps=3,
                        guidance_scale=3.0, seed=4, schedule="checkpoint", output="latents", cache="off")
    assert got.settings.mode == options["mode"]
    torch.testing.assert_close(got.latents, expected.video.float(), atol=TOL, rtol=0)
    if options["mode"] == "forward_dynamics":
        assert got.actions is None and expected.action is None
    else:
        assert got.actions.shape == (options["chunk_size"], request.width)
        torch.testing.assert_close(got.actions, expected.action[0].float(), atol=TOL, rtol=0)


def test_action_prompt_token_ids_match_diffusers(checkpoint, ours):
    reference = ref.omni_pipeline(checkpoint)
    request = ActionRequest(mode="policy", chunk_size=8, domain="droid_lerobot", resolution_tier=480,
                            image=picture(1, 300, 400), view_point="wrist_view", preset="diffusers")
    height, width = canvas_size(request.clip(), 480)
    expected = reference.tokenize_prompt("Stack the cups", "low quality", num_frames=9, height=height, width=width,
                                         fps=15.0, action_mode="policy", action_view_point="wrist_view")
    _, cond, uncond = ours.planner.prepare("Stack the cups", cosmos3_runtime.Request(action=request, fps=15.0,
                                                                               negative_prompt="low quality"))
    assert (cond, uncond) == tuple(list(ids) for ids in expected)


def test_action_prompt_rules():
    caption = action_prompt("  Déplace le cube ", "unknown_view", num_frames=33, fps=15.0, height=480, width=832)
    assert caption == ('{"actions": [{"time": "0:00-0:02", "description": "D\\u00e9place le cube."}], '
                       '"duration": "2s", "fps": 15.0, "resolution": {"H": 480, "W": 832}, "aspect_ratio": "16,9"}')
    assert '"time": "0:00-0:02"' in action_prompt("Go!", "ego_view", 37, 15.0, 640, 640)  # 2.47 s: rounds to 2
    assert '"0:00-0:04", "description": "Go!"' in action_prompt("Go!", "ego_view", 67, 15.0, 640, 640)  # 4.47 -> 4
    assert '"0:00-0:02"' in action_prompt("x", "ego_view", 5, 2.0, 640, 640)  # 2.5 s: half to even


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(domain="mars_rover", image=picture(0)), "unknown action domain 'mars_rover'"),
        (dict(domain="libero", image=picture(0)), "has no fixed action width"),
        (dict(domain="no_action", image=picture(0)), "has no fixed action width"),
        (dict(chunk_size=0, image=picture(0)), "chunk_size must be at least 1"),
        (dict(mode="inverse_dynamics", image=picture(0)), "inverse_dynamics needs a video"),
        (dict(image=picture(0), video=[picture(1)]), "either an image or a video"),
        (dict(mode="forward_dynamics", image=picture(0), domain="pusht", actions=torch.zeros(4, 3)),
         r"must be \[T, 2\]"),
        (dict(image=picture(0), preset="droid-server"), "needs the robot state"),
        (dict(image=picture(0), preset="fast"), "unknown action preset 'fast'"),
    ],
)
def test_bad_action_requests(fields, message):
    with pytest.raises(InputError, match=message):
        ActionRequest(**fields).resolved("framework")


def test_action_is_refused_where_it_cannot_run(tiny_gated, tiny_factory):
    request = ActionRequest(image=picture(0), chunk_size=4, resolution_tier=256)
    with pytest.raises(InputError, match="no action head"):
        cosmos3_runtime.load(tiny_gated, dtype="fp32").generate("x", action=request, steps=1)
    distilled = cosmos3_runtime.load(tiny_factory(kind="gated", distilled=True, action=True), dtype="fp32")
    with pytest.raises(InputError, match="distilled checkpoints do not generate actions"):
        distilled.generate("x", action=request, steps=1)


PRESET_TABLE = [
    # preset, expected settings (steps, guidance, shift, schedule, fps, system prompt, interval), chunk, tier
    ("framework", (30, 1.0, 10.0, "unipc", 15.0, False, None), 16, 256),  # droid_lerobot: 15 fps
    ("droid-server", (4, 3.0, 5.0, "unipc", 15.0, False, None), 32, 480),
    ("sglang", (35, 1.0, 10.0, "unipc", 5.0, False, None), 16, 480),
    ("diffusers", (35, 6.0, None, "checkpoint", 24.0, True, None), 16, 480),
]


@pytest.mark.parametrize("preset, expected, chunk, tier", PRESET_TABLE, ids=[p[0] for p in PRESET_TABLE])
def test_action_presets(tiny_factory, preset, expected, chunk, tier):
    from cosmos3_runtime.checkpoint import detect_variant
    from cosmos3_runtime.settings import resolve

    variant = detect_variant(tiny_factory(kind="edge", action=True))
    action = ActionRequest(image=picture(0), preset=preset, state=[0.1] * 8)
    s = resolve(variant, cosmos3_runtime.Request(action=action))
    got = (s.steps, s.guidance_scale, s.flow_shift, s.schedule, s.fps, s.use_system_prompt, s.guidance_interval)
    assert got == expected and s.num_frames == chunk + 1 and f"action preset '{preset}'" in s.notes[0]
    assert (s.height, s.width) == canvas_size(action.clip(), tier)
    explicit = resolve(variant, cosmos3_runtime.Request(action=action, steps=7, guidance_scale=2.0, fps=10.0))
    assert (explicit.steps, explicit.guidance_scale, explicit.fps) == (7, 2.0, 10.0)  # explicit values win


def test_the_preset_is_reported_at_info_and_what_is_ignored_as_a_warning(tiny_factory, caplog):
    """A robot loop runs the same request many times: the preset line must not be a warning each time."""
    import logging

    from cosmos3_runtime.checkpoint import detect_variant
    from cosmos3_runtime.settings import log_notes, resolve

    variant = detect_variant(tiny_factory(kind="edge", action=True))
    with caplog.at_level(logging.INFO, logger="cosmos3_runtime"):
        s = resolve(variant, cosmos3_runtime.Request(action=ActionRequest(image=picture(0), preset="sglang"),
                                                     num_frames=9))
        assert not caplog.records  # resolving logs nothing: the run logs its notes once
        log_notes(s)
    levels = {r.getMessage(): r.levelname for r in caplog.records}
    assert levels[s.notes[0]] == "INFO" and s.notes[0].startswith("action preset 'sglang'")
    assert levels[s.notes[1]] == "WARNING" and "num_frames 9 ignored" in s.notes[1]


def test_the_default_preset_follows_the_checkpoint_name(tiny_factory, tmp_path):
    import shutil

    from cosmos3_runtime.checkpoint import detect_variant

    root = tiny_factory(kind="edge", action=True)
    assert detect_variant(root).default_action_preset == "framework"
    droid = shutil.copytree(root, tmp_path / "models--nvidia--Cosmos3-Edge-Policy-DROID" / "snapshot")
    assert detect_variant(droid).default_action_preset == "droid-server"


def test_droid_server_layout(tiny_factory):
    """A clean robot-state row at action position 0; the output drops it and inverts the gripper."""
    pipe = cosmos3_runtime.load(tiny_factory(kind="edge", action=True), dtype="fp32")
    state = torch.tensor([0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, 0.25])
    request = ActionRequest(image=picture(0), preset="droid-server", chunk_size=4, resolution_tier=256, state=state)
    seen = []
    original = type(pipe.transformer).forward

    def forward(model, latents, timestep, text, noisy_frames, fps, tracks, **kwargs):
        (action,) = tracks
        seen.append((action.start_frame, list(action.noisy), action.latents.clone()))
        return original(model, latents, timestep, text, noisy_frames, fps, tracks, **kwargs)

    type(pipe.transformer).forward = forward
    try:
        result = pipe.generate("Pick up the cup", action=request, steps=2, output="latents")
    finally:
        type(pipe.transformer).forward = original
    start, noisy, latents = seen[-1]
    assert start == 0 and noisy == [1, 2, 3, 4] and torch.equal(latents[0, :8], state) and not latents[0, 8:].any()
    assert result.actions.shape == (4, 8)
    from cosmos3_runtime.tracks import ActionTrack
    from cosmos3_runtime.schedulers import unipc_schedule

    track = ActionTrack(request.resolved("droid-server"), 64, torch.Generator().manual_seed(0), "cpu",
                        unipc_schedule(2, 5.0))
    track.latents = torch.arange(5 * 64, dtype=torch.float32).reshape(5, 64) / 1000
    out = track.actions()  # rows 1.. (the prediction), 8 wide, gripper as 1 - g
    assert torch.equal(out[:, :7], track.latents[1:, :7]) and torch.equal(out[:, 7], 1 - track.latents[1:, 7])


def test_action_statistics():
    from cosmos3_runtime.action import denormalize, normalize

    actions = torch.tensor([[-1.0, 0.0], [1.0, 0.5]])
    quantile = {"q01": [0.0, 10.0], "q99": [2.0, 20.0]}
    assert torch.equal(denormalize(actions, quantile), torch.tensor([[0.0, 15.0], [2.0, 17.5]]))
    assert torch.equal(denormalize(actions, {"mean": [1.0, 1.0], "std": [2.0, 4.0]}), torch.tensor([[-1.0, 1.0], [3.0, 3.0]]))
    assert torch.allclose(normalize(denormalize(actions, quantile), quantile), actions)
    assert torch.equal(normalize(torch.tensor([[5.0, 100.0]]), quantile), torch.tensor([[1.0, 1.0]]))  # clamped
    with pytest.raises(InputError, match="need q01 and q99"):
        ActionRequest(image=picture(0), stats={"p5": [0]})


def test_a_default_action_run_uses_the_checkpoint_preset(tiny_factory):
    pipe = cosmos3_runtime.load(tiny_factory(kind="gated", action=True), dtype="fp32")
    result = pipe.generate("Open the drawer", action=ActionRequest(image=picture(0), domain="fractal"), steps=1,
                           output="latents")
    assert "action preset 'framework'" in result.settings.notes[0]
    assert result.actions.shape == (16, 10) and result.settings.num_frames == 17


def test_sound_together_with_action_matches_diffusers(tiny_factory):
    """Both heads: the sound track and the action track beside the video in one loop (noise: video, sound, action)."""
    root = tiny_factory(kind="gated", action=True, sound=True)
    options = dict(mode="policy", chunk_size=8, domain="droid_lerobot", image=picture(5))
    reference = ref.omni_pipeline(root)
    seen = {}
    decode_sound = reference.decode_sound
    reference.decode_sound = lambda latents: seen.setdefault("sound", latents.clone()) is not None and decode_sound(
        latents
    )
    condition = CosmosActionCondition(mode="policy", chunk_size=8, domain_name="droid_lerobot", resolution_tier=256,
                                      image=options["image"], view_point="ego_view")
    with torch.no_grad():
        expected = reference("Ring the bell", negative_prompt="", action=condition, fps=15.0, num_inference_steps=3,
                             guidance_scale=3.0, enable_sound=True, generator=torch.Generator("cpu").manual_seed(6),
                             output_type="latent")
    ours = cosmos3_runtime.load(root, dtype=torch.float32)
    got = ours.generate("Ring the bell", negative_prompt="", fps=15.0, steps=3, guidance_scale=3.0, seed=6,
                        schedule="checkpoint", sound=True, output="latents", cache="off",
                        action=ActionRequest(resolution_tier=256, view_point="ego_view", preset="diffusers", **options))
    torch.testing.assert_close(got.latents, expected.video.float(), atol=TOL, rtol=0)
    torch.testing.assert_close(got.actions, expected.action[0].float(), atol=TOL, rtol=0)
    torch.testing.assert_close(got.sound_latents, seen["sound"].float(), atol=TOL, rtol=0)
