"""Transfer (control-to-video in chunks) against diffusers 0.42.1's modular Cosmos3OmniBlocks, the only transfer
diffusers has; and its geometry, defaults, guidance passes, progress and refusals.

Tolerance: stitched frames within 1e-4 of diffusers' (fp32, tiny checkpoints; measured about 1.4e-6).
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

import cosmos3_runtime
from conftest import require
from cosmos3_runtime import InputError, Request
from cosmos3_runtime import transfer
from cosmos3_runtime.settings import resolve

require("diffusers", minversion="0.42.1")
import diffusers_reference as ref  # noqa: E402

TOL = 1e-4
PROMPT = '{"temporal_caption": "a robot arm stacks two cubes"}'  # read verbatim: no metadata is injected
NEGATIVE = "blurry, static"


def clip(frames: int, seed: int, height: int = 40, width: int = 56) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def checkpoint(tiny_factory):
    return tiny_factory(kind="gated")


@pytest.fixture(scope="module")
def ours(checkpoint):
    return cosmos3_runtime.load(checkpoint, dtype=torch.float32)


@pytest.fixture(scope="module")
def theirs(checkpoint):
    return ref.transfer_pipeline(checkpoint)


def counted(module) -> list:
    """Count a module's forward calls (the forward passes a run makes)."""
    calls = []
    original = module.forward

    def forward(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    module.forward = forward
    return calls


CASES = {  # controls, num_frames, chunk_frames, guidance, control guidance, forwards per step
    "one control, two chunks, text and control guidance": ({"edge": clip(9, 1)}, None, 5, 3.0, 1.5, 3),
    "two controls in another order, control guidance 1": ({"depth": clip(9, 2), "edge": clip(9, 3)}, None, 5, 3.0,
                                                           1.0, 2),
    "a longer clip, num_frames below it, chunk_frames not 1+4k": ({"seg": clip(13, 4)}, 10, 6, 2.0, 2.0, 3),
}


@pytest.mark.parametrize("case", CASES)
def test_transfer_matches_diffusers(ours, theirs, case):
    controls, frames, chunk, g, cg, per_step = CASES[case]
    steps, fps = 2, 16.0
    references = {h: torch.from_numpy(c).permute(0, 3, 1, 2).float() / 255 for h, c in controls.items()}  # [F, 3, H, W]
    forwards = counted(theirs.transformer)
    try:
        expected = theirs(prompt=PROMPT, negative_prompt=NEGATIVE, control_videos=references, height=48, width=64,
                          num_frames=frames, num_video_frames_per_chunk=chunk, num_conditional_frames=1, fps=fps,
                          num_inference_steps=steps, guidance_scale=g, control_guidance=cg,
                          generator=torch.Generator("cpu").manual_seed(7), output_type="np", output="videos")
    finally:
        del theirs.transformer.forward
    ours_forwards = counted(ours.transformer)
    try:
        got = ours.generate(PROMPT, negative_prompt=NEGATIVE, control_videos=controls, width=64, height=48,
                            num_frames=frames, chunk_frames=chunk, chunk_overlap_frames=1, steps=steps, guidance_scale=g,
                            control_guidance=cg, fps=fps, flow_shift=10.0, schedule="unipc", seed=7, output="frames",
                            cache="off")
    finally:
        del ours.transformer.forward
    plan = got.settings.kind.controls
    assert got.frames.shape == expected.shape == (plan.total, 48, 64, 3)
    assert plan.count == 2 and len(ours_forwards) == len(forwards) == plan.count * steps * per_step
    np.testing.assert_allclose(got.frames.numpy(), expected, atol=TOL, rtol=0)


def test_the_prompt_is_read_verbatim_under_the_transfer_system_prompt(ours, theirs):
    s, cond, uncond = ours.planner.prepare(PROMPT, Request(control_videos={"edge": clip(5, 0)}))
    assert cond == ref.transfer_tokens(theirs, PROMPT) and uncond == ref.transfer_tokens(theirs, "")
    text = ours.planner.tokenizer.tokenizer.decode(cond)
    assert transfer.SYSTEM_PROMPT in text and "resolution" not in text and s.mode == "transfer"
    _, plain, _ = ours.planner.prepare(PROMPT, Request(control_videos={"edge": clip(5, 0)}, use_system_prompt=False))
    assert transfer.SYSTEM_PROMPT not in ours.planner.tokenizer.tokenizer.decode(plain)


@pytest.mark.parametrize("total, chunk_frames, overlap, expected", [
    (121, 121, 1, (121, 121, 1)),  # (chunk, stride, chunks)
    (121, 93, 1, (93, 92, 2)),
    (7, None, 1, (9, 9, 1)),  # one chunk of the clip's own length, rounded up; the output is cut to 7
    (9, 5, 1, (5, 4, 2)),
    (200, None, 1, (93, 92, 3)),  # auto: 93 frames a chunk
    (13, 6, 2, (9, 7, 2)),
    (1, 9, 1, (1, 1, 1)),  # an image
])
def test_chunk_geometry(total, chunk_frames, overlap, expected):
    p = transfer.controls_for({"edge": clip(total, 0, 8, 8)}, None, chunk_frames, overlap, None, None, [])
    assert (p.chunk, p.stride, p.count) == expected and p.total == total


def test_a_world_scenario_map_alone_takes_101_frame_chunks_and_its_own_defaults(ours):
    s = resolve(ours.variant, Request(control_videos={"wsm": clip(120, 0, 8, 8)}))
    assert (s.kind.controls.chunk, s.guidance_scale, s.kind.controls.control_guidance, s.fps) == (101, 1.0, 3.0, 10.0)


def test_reflect_padding():
    frames = torch.arange(3.0).view(1, 1, 3, 1, 1)
    assert transfer.reflect_pad(frames, 5).flatten().tolist() == [0, 1, 2, 2, 1]
    assert transfer.reflect_pad(frames, 9).flatten().tolist() == [0, 1, 2, 2, 1, 1, 2, 2, 1]  # the whole clip mirrored
    assert transfer.reflect_pad(frames[:, :, :1], 3).flatten().tolist() == [0, 0, 0]


@pytest.mark.parametrize("controls, expected", [
    ({"edge": 1}, (3.0, 1.5, 30.0)), ({"seg": 1}, (3.0, 2.0, 30.0)), ({"wsm": 1}, (1.0, 3.0, 10.0)),
    ({"depth": 1, "seg": 1}, (3.0, 1.5, 30.0)),  # several hints: the authors' mixed values
])
def test_defaults_are_the_model_authors(ours, controls, expected):
    s = resolve(ours.variant, Request(control_videos={h: clip(9, 0, 8, 8) for h in controls}))
    assert (s.guidance_scale, s.kind.controls.control_guidance, s.fps) == expected
    assert (s.steps, s.flow_shift, s.schedule, s.guidance_interval, s.use_system_prompt) == (50, 10.0, "unipc", None, True)
    explicit = resolve(ours.variant, Request(control_videos={h: clip(9, 0, 8, 8) for h in controls}, guidance_scale=5.0,
                                             control_guidance=0.0, steps=3, fps=12.0, flow_shift=5.0))
    assert (explicit.guidance_scale, explicit.kind.controls.control_guidance, explicit.steps, explicit.fps,
            explicit.flow_shift) == (5.0, 0.0, 3, 12.0, 5.0)


def test_the_settings_say_what_was_resized_padded_capped_and_rounded(ours):
    s = resolve(ours.variant, Request(control_videos={"edge": clip(6, 0, 40, 56), "depth": clip(12, 0, 48, 64)},
                                      width=64, height=48, num_frames=20, chunk_frames=10))
    notes = "\n".join(s.notes)
    assert "num_frames 20 capped at the control clip's 6 frames" in notes  # the first control (in hint order) sets it
    assert "chunk_frames 10 rounded up to 13" in notes
    assert "control 'edge' has 6 frames, reflect-padded to 13" in notes
    assert "control 'edge' is 56x40, resized to 64x48 (its aspect ratio changes)" in notes
    assert "'depth' is" not in notes  # already the output size


@pytest.mark.parametrize("scales, passes", [((1.0, 1.0), 1), ((3.0, 1.0), 2), ((1.0, 1.5), 2), ((3.0, 1.5), 3),
                                            ((0.5, 1.0), 1), ((1.0, 0.0), 2)])
def test_guidance_runs_only_the_passes_its_scales_need(scales, passes):
    """Text guidance above 1 (not merely != 1), control guidance when not 1 (0: the no-control prediction)."""
    g, cg = scales
    guidance = transfer.Guidance([1], [2], ["control"], g, None, cg, None)
    chosen = guidance.passes(500.0)
    assert len(chosen) == passes and chosen[0] == ([1], ["control"])
    c, n, u = torch.tensor([2.0]), torch.tensor([1.0]), torch.tensor([0.5])
    outputs = {(1, "control"): c, (1,): n, (2, "control"): u}
    combined = guidance.combine(500.0, [[outputs[(ids[0], *context)]] for ids, context in chosen])[0]
    expected = c
    if cg != 1.0:
        expected = n + cg * (c - n)
    if g > 1.0:
        expected = u + g * (expected - u)
    assert torch.equal(combined, expected)


def test_guidance_intervals_are_inclusive():
    guidance = transfer.Guidance([1], [2], ["c"], 3.0, (400.0, 800.0), 1.5, (900.0, 1000.0))
    assert len(guidance.passes(400.0)) == 2 and len(guidance.passes(800.0)) == 2 and len(guidance.passes(399.0)) == 1
    assert len(guidance.passes(900.0)) == 2 and len(guidance.passes(950.0)) == 2 and len(guidance.passes(500.0)) == 2


def test_progress_runs_over_every_step_of_every_chunk_and_cancel_stops_at_once(ours):
    options = dict(control_videos={"edge": clip(9, 1)}, width=64, height=48, chunk_frames=5, steps=2)
    seen = []
    ours.generate("a cat", **options, callback=lambda step, total, latents: seen.append((step, total)))
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]

    def cancel(step, total, latents):
        if step == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ours.generate("a cat", **options, callback=cancel)
    assert ours.generate("a cat", **options).frames.shape == (9, 48, 64, 3)  # still usable


REFUSED = [  # request options, words of the message
    ({"control_videos": {"canny": clip(5, 0)}}, "unknown control hint(s) 'canny'; hints are edge, blur, depth"),
    ({"control_videos": {}}, "control_videos is empty"),
    ({"control_videos": [clip(5, 0)]}, "must be a dict from hint"),
    ({"control_videos": {"edge": "clip.mp4"}}, "control 'edge': video must be"),
    ({"control_videos": {"edge": np.zeros((5, 8, 8), np.uint8)}}, "control 'edge': video must be channels-last"),
    ({"control_videos": {"edge": np.zeros((0, 8, 8, 3), np.uint8)}}, "control 'edge' has no frames"),
    ({"control_videos": {"edge": None}}, "control 'edge' has no clip"),
    ({"control_videos": {"edge": clip(5, 0)}, "sound": True}, "does not combine with sound"),
    ({"control_videos": {"edge": clip(5, 0)}, "video": clip(5, 0)}, "does not combine with video"),
    ({"control_videos": {"edge": clip(5, 0)}, "output": "latents"}, "returns frames, not latents"),
    ({"control_videos": {"edge": clip(5, 0)}, "chunk_frames": 0}, "chunk_frames must be at least 1"),
    ({"control_videos": {"edge": clip(5, 0)}, "chunk_overlap_frames": -1}, "chunk_overlap_frames must be 0 or more"),
    ({"control_videos": {"edge": clip(5, 0)}, "control_guidance": -1.0}, "control_guidance must be 0 or more"),
    ({"control_videos": {"edge": clip(5, 0)}, "control_guidance_interval": "low"}, "control_guidance_interval 'low'"),
    ({"control_guidance": 2.0}, "a transfer option: give control_videos too"),
]


@pytest.mark.parametrize("options, words", REFUSED, ids=[w for _, w in REFUSED])
def test_bad_transfer_requests_are_refused_before_anything_runs(options, words):
    with pytest.raises(InputError) as error:
        Request(**options)
    assert words in str(error.value)


def test_an_overlap_as_long_as_the_chunk_is_refused(ours):
    with pytest.raises(InputError, match="chunk_overlap_frames 5 must be smaller than chunk_frames 5"):
        resolve(ours.variant, Request(control_videos={"edge": clip(9, 0)}, chunk_frames=5, chunk_overlap_frames=5))


@pytest.mark.parametrize("options, words", [(dict(kind="edge"), "Edge is refused, as SGLang refuses it"),
                                            (dict(kind="gated", distilled=True), "distilled checkpoints have no transfer")])
def test_checkpoints_without_transfer_are_refused(tiny_factory, options, words):
    variant = cosmos3_runtime.detect_variant(tiny_factory(**options))
    with pytest.raises(InputError, match=words):
        resolve(variant, Request(control_videos={"edge": clip(5, 0)}))


def test_a_request_too_large_for_memory_is_refused_naming_the_controls(ours, monkeypatch):
    from cosmos3_runtime import budget

    request = Request(control_videos={"edge": clip(9, 0), "depth": clip(9, 1)}, width=64, height=48, chunk_frames=5)
    base = ours.plan("a cat", replace(request, control_videos=None, chunk_frames=None, num_frames=5)).estimate.total
    estimate = ours.plan("a cat", request).estimate
    assert estimate.total > base  # two controls: three items' tokens in the media tower, and the control clips
    needed = estimate.total + estimate.host_total  # on the CPU the stitched output shares its memory
    monkeypatch.setattr(budget, "available_bytes", lambda device: needed - 1)
    with pytest.raises(InputError, match=r"needs at least .* GiB \(.*\) on cpu"):
        ours.generate("a cat", request)
    monkeypatch.setattr(budget, "available_bytes", lambda device: needed)
    assert ours.generate("a cat", replace(request, steps=1)).frames.shape[0] == 9


def test_the_example_clips_are_written_when_a_prompt_names_them_not_at_import(pack, tmp_path, monkeypatch):
    """ComfyUI's on-prompt hook writes the transfer workflows' clips into the input folder only for a prompt that names
    them (importing the pack writes nothing), and never replaces a file."""
    monkeypatch.setenv("COSMOS3_INPUT_DIR", str(tmp_path))
    clips = [tmp_path / name for name in pack.transfer.EXAMPLE_CLIPS]
    other = {"prompt": {"1": {"class_type": "LoadVideo", "inputs": {"file": "mine.mp4"}}}}
    assert pack.transfer.examples_for(other) is other and not any(c.exists() for c in clips)
    named = {"prompt": {"1": {"class_type": "LoadVideo", "inputs": {"file": clips[0].name}}}}
    assert pack.transfer.examples_for(named) is named and all(c.stat().st_size > 0 for c in clips)
    clips[1].write_bytes(b"mine")
    pack.transfer.examples_for(named)
    assert clips[1].read_bytes() == b"mine"
