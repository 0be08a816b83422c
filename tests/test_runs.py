"""The run layer: which kind of run a plan is, what each kind's windows hold, the conditioning sources, and the one
window loop (its order of noise draws, prompts and steps). End-to-end numbers are the parity tests' (test_generate,
test_transfer, test_keyframes, test_sound, test_action)."""

import dataclasses
import typing

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime import runs, sources
from cosmos3_runtime.errors import InputError
from cosmos3_runtime.kinds import Single
from cosmos3_runtime.request import Request
from cosmos3_runtime.windows import CFG

SMALL = dict(width=32, height=32, steps=1)


@pytest.fixture(scope="module")
def pipe(tiny_gated):
    return cosmos3_runtime.load(tiny_gated, dtype="fp32")


def run_for(pipe, prompt="a cat", parallel=None, **options):
    plan = pipe.plan(prompt, **SMALL, **options)
    return runs.for_plan(pipe.parts, plan.settings, plan.request, plan.cond_ids, plan.uncond_ids, parallel), plan


def clip(frames: int) -> torch.Tensor:
    return torch.rand(frames, 32, 32, 3, generator=torch.Generator().manual_seed(frames))


@pytest.mark.parametrize("options, kind", [
    (dict(num_frames=1), runs.Single),
    (dict(num_frames=5, image=torch.rand(32, 32, 3)), runs.Single),
    (dict(num_frames=9, chunk_frames=5), runs.Continued),
    (dict(control_videos={"edge": clip(9)}), runs.Controlled),
])
def test_a_plan_is_one_kind_of_run(pipe, options, kind):
    run, _ = run_for(pipe, **options)
    assert type(run) is kind
    assert run.count == (1 if kind is runs.Single else run.chunks.count)


def test_settings_are_frozen_once_resolved(pipe):
    s = pipe.plan("a cat", **SMALL, num_frames=5).settings
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.num_frames = 9
    assert not [f.name for f in dataclasses.fields(s) if f.type is typing.Any]


def test_a_long_videos_later_windows_continue_from_the_frames_before(pipe):
    run, plan = run_for(pipe, num_frames=13, chunk_frames=9, chunk_overlap_frames=5)
    first = run.window(0)
    assert first.held is None and first.settings.num_frames == 9 and isinstance(first.settings.kind, Single)
    run.previous = torch.rand(1, 3, 5, 32, 32) * 2 - 1  # what chunk 0's decode leaves for chunk 1
    second = run.window(1)
    assert second.settings.condition_frames == (0, 1)  # 5 frames carried: latent frames 0 and 1
    assert second.held.mask.flatten().tolist() == [1.0, 1.0, 0.0]
    assert second.guidance.cond == plan.cond_ids


def test_a_transfer_window_holds_its_controls_beside_the_video(pipe):
    run, plan = run_for(pipe, control_videos={"edge": clip(9), "depth": clip(9)})
    w = run.window(0)
    assert w.held is None and len(w.guidance.controls) == 2
    assert tuple(w.guidance.controls[0].latents.shape) == pipe.denoiser.latent_shape(w.settings)


def test_a_transfer_refuses_cfg_parallelism_before_any_step(pipe):
    group = type("Group", (), {"cfg": object(), "sp": None})()
    with pytest.raises(InputError, match="CFG parallelism"):
        run_for(pipe, parallel=group, control_videos={"edge": clip(9)})


@pytest.mark.parametrize("options, source", [
    (dict(num_frames=5, image=torch.rand(32, 32, 3)), sources.image),
    (dict(num_frames=9, video=torch.rand(9, 32, 32, 3)), sources.clip),
    (dict(num_frames=9, condition_latents=torch.rand(1, 48, 3, 2, 2)), sources.given_latents),
    (dict(num_frames=9, keyframes={0: torch.rand(32, 32, 3), -1: torch.rand(32, 32, 3)}), sources.keyframe_clip),
])
def test_each_request_is_held_by_its_own_source_alone(pipe, options, source):
    plan = pipe.plan("a cat", **SMALL, **options)
    s, r = plan.settings, plan.request
    shape = pipe.denoiser.latent_shape(s)
    answered = [f for f in sources.SOURCES if f(pipe.codec, s, r, shape) is not None]
    assert answered == [source]
    held = sources.held_for(pipe.codec, s, r, shape)
    assert tuple(held.clean.shape) == shape
    assert held.mask.flatten().nonzero().flatten().tolist() == list(s.condition_frames)


def test_text_to_video_starts_from_noise_alone(pipe):
    plan = pipe.plan("a cat", **SMALL, num_frames=5)
    assert sources.held_for(pipe.codec, plan.settings, plan.request, pipe.denoiser.latent_shape(plan.settings)) is None


class Recorder:
    """A denoiser standing in for the real one: records what the loop asks of it, in order."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def latent_shape(self, s):
        return self.real.latent_shape(s)

    def start_latents(self, shape, generator, held):
        self.calls.append(("start", torch.randn(1, generator=generator).item()))
        return torch.zeros(shape)

    def encode_prompts(self, cond, uncond, s, parallel, progress):
        self.calls.append(("prompts", tuple(cond)))

    def denoise(self, latents, s, guidance, held, generator, callback, parallel, tracks, cache, inputs, step_noise):
        self.calls.append(("denoise", s.num_frames, len(tracks)))
        if callback is not None:
            callback(1, 1, latents)
        return latents


def test_the_window_loop_draws_noise_encodes_prompts_and_steps_each_window_in_order(pipe):
    recorder = Recorder(pipe.denoiser)
    parts = runs.Parts(recorder, pipe.codec)
    plan = pipe.plan('["a cat", "a dog"]', **SMALL, num_frames=9, chunk_frames=5, chunk_overlap_frames=1,
                     output="latents")
    run = runs.for_plan(parts, plan.settings, plan.request, plan.cond_ids, plan.uncond_ids, None)
    heard, steps = [], []
    result = runs.execute(run, parts, 7, lambda *a: steps.append(a[:2]), None, lambda *a: heard.append(a), None)
    first, second = (("prompts", tuple(ids)) for ids in plan.settings.kind.prompt_ids)
    noise = torch.Generator("cpu").manual_seed(7)
    draws = [torch.randn(1, generator=noise).item() for _ in range(2)]
    assert recorder.calls == [("start", draws[0]), first, ("denoise", 5, 0), ("start", draws[1]), second,
                              ("denoise", 5, 0)]
    assert steps == [(1, 2), (2, 2)]  # each chunk's steps on one count over the run
    assert [h for h in heard if h[0] == "chunk"] == [("chunk", 1, 2), ("chunk", 2, 2)]
    assert result.latents.shape[2] == 3 and result.frames is None and result.cache is None


def test_cfg_runs_the_negative_prompt_only_inside_its_interval():
    guidance = CFG([1], [2], 3.0, (0.0, 500.0))
    assert guidance.passes(700.0) == [([1], [])] and guidance.passes(500.0) == [([1], []), ([2], [])]
    c, u = torch.tensor([2.0]), torch.tensor([1.0])
    assert guidance.combine(400.0, [[c], [u]])[0].item() == 1.0 + 3.0 * (2.0 - 1.0)
    assert guidance.combine(700.0, [[c]])[0] is c
