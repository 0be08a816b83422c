"""Keyframes (first-last and any-frame conditioning) and long videos in chunks.

Keyframes: the locked latents and the assembled reference follow vLLM-Omni's FL2V recipe arithmetic, and a keyframes
run equals diffusers 0.42.1's video-to-video run given that reference and those indexes. Long videos: the first chunk
is a plain run of its length, a later chunk the video-to-video run on the decoded tail of the one before with the same
noise, the stitched length is exact, and a cancelled run leaves nothing behind.
"""

import numpy as np
import pytest
import torch
from conftest import require
from PIL import Image

import cosmos3_runtime
from cosmos3_runtime import InputError
from cosmos3_runtime import pipeline as pipeline_module
from cosmos3_runtime.geometry import latent_span
from cosmos3_runtime.keyframes import locked, place, reference

SIZE = dict(width=64, height=48)
RUN = dict(**SIZE, steps=2, seed=4, cache="off", negative_prompt="blurry", guidance_scale=4.0)


def still(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)


def clip(seed: int, frames: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, 48, 64, 3), dtype=np.uint8)


@pytest.mark.parametrize("given, expected", [
    ({0: still(1), -1: still(2)}, (0, 47)),  # the recipe's frame + frame at 189 frames
    ({0: clip(1, 9), -1: clip(2, 9)}, (0, 1, 2, 45, 46, 47)),  # 9-frame boundary clips
    ({0: still(1), -1: clip(2, 9)}, (0, 45, 46, 47)),  # mixed
    ({0: clip(1, 9), -1: still(2)}, (0, 1, 2, 47)),
    ({0: still(1), 94: still(3), 188: still(2)}, (0, 24, 47)),  # any frame: 94 is in latent 24 (frames 93-96)
])
def test_locked_latents_follow_the_recipe(given, expected):
    assert locked(place(given, 189)) == expected


def test_the_reference_clip_holds_each_keyframe_over_its_latents():
    start, end, middle = still(1), clip(2, 9), still(3)
    placed = place({0: start, 10: middle, -1: end}, 33)
    assert locked(placed) == (0, 3, 6, 7, 8)  # frame 10 is in latent 3 (frames 9-12); frames 24-32 in latents 6-8
    ref = reference(placed, 48, 64)
    assert ref.shape == (1, 3, 33, 48, 64)  # up to the last locked latent's last frame
    pixels = lambda image: torch.from_numpy(image).permute(2, 0, 1).float() / 127.5 - 1.0  # noqa: E731
    assert torch.equal(ref[0, :, 0], pixels(start))
    for t in range(1, 13):  # latents 1-2 are filler (the next keyframe), latent 3 the middle still: frames 9-12
        assert torch.equal(ref[0, :, t], pixels(middle)), t
    for t in range(13, 24):  # filler up to the end clip: its first frame
        assert torch.equal(ref[0, :, t], pixels(end[0])), t
    for i, t in enumerate(range(24, 33)):
        assert torch.equal(ref[0, :, t], pixels(end[i]))
    assert list(latent_span(3)) == [9, 10, 11, 12] and list(latent_span(0)) == [0]


@pytest.mark.parametrize("given, frames, message", [
    ({0: still(1)}, 190, "exact frame count, 1 \\+ 4k.*use 189 or 193"),
    ({1: still(1), 3: still(2)}, 17, "share latent frame 1 \\(frames 1-4\\)"),
    ({-1: clip(1, 20)}, 17, "does not fit in 17 frames"),
    ({"last": still(1)}, 17, "must be a whole frame number"),
    ({}, 17, "non-empty dict"),
])
def test_bad_keyframes_are_named(given, frames, message):
    with pytest.raises(InputError, match=message):
        place(given, frames)


@pytest.fixture(scope="module")
def pipe(tiny_gated):
    return cosmos3_runtime.load(tiny_gated, dtype=torch.float32)


def test_keyframes_refuse_other_conditioning_before_loading_anything():
    with pytest.raises(InputError, match="do not combine with image"):
        cosmos3_runtime.Request(keyframes={0: still(1)}, image=still(2))


@pytest.mark.parametrize("schedule", [pytest.param("checkpoint", marks=pytest.mark.slow), "unipc"])
def test_a_keyframes_run_equals_diffusers_video_to_video_on_the_reference(tiny_gated, pipe, schedule):
    require("diffusers", minversion="0.42.1")
    import diffusers_reference as ref

    given = {0: still(1), 8: still(3), -1: clip(2, 5)}
    placed = place(given, 17)
    indexes = locked(placed)
    frames = ((reference(placed, 48, 64)[0].permute(1, 2, 3, 0) + 1) * 127.5).round().to(torch.uint8).numpy()
    common = dict(prompt="A robot arm stacks two cubes.", negative_prompt="blurry, static", num_frames=17, fps=16.0,
                  **SIZE)
    with torch.no_grad():
        expected = ref.omni_pipeline(tiny_gated, schedule)(
            **common, video=[Image.fromarray(f) for f in frames], condition_frame_indexes_vision=list(indexes),
            num_inference_steps=3, guidance_scale=4.0, generator=torch.Generator("cpu").manual_seed(5),
            output_type="latent").video
    got = pipe.generate(**common, keyframes=given, steps=3, guidance_scale=4.0, seed=5, schedule=schedule,
                        flow_shift=10.0, guidance_interval=None, json_captions=False, output="latents", cache="off")
    assert got.settings.mode == "keyframes" and got.settings.condition_frames == indexes == (0, 2, 3, 4)
    torch.testing.assert_close(got.latents, expected.float(), atol=1e-4, rtol=0)


@pytest.mark.slow  # three runs of a chunk's length and a long video of two
def test_long_video_chunks_are_a_plain_run_then_continuations(pipe, monkeypatch):
    noises = []
    real = torch.randn

    def recorded(*args, **kwargs):
        noises.append(real(*args, **kwargs))
        return noises[-1]

    monkeypatch.setattr(pipeline_module.torch, "randn", recorded)
    long = pipe.generate("a cat runs", num_frames=21, chunk_frames=13, chunk_overlap_frames=1, **RUN)
    assert long.settings.kind.chunks.count == 2 and long.frames.shape == (21, 48, 64, 3)  # 13 + 12 - 4 cut: exact length
    assert long.latents.shape[2] == long.settings.latent_frames == 6
    monkeypatch.setattr(pipeline_module.torch, "randn", real)

    plain = pipe.generate("a cat runs", num_frames=13, **RUN)  # chunk 1: the same seed's first draw
    torch.testing.assert_close(long.frames[:13], plain.frames, atol=1e-6, rtol=0)

    second = iter([noises[1]])  # chunk 2: video-to-video on chunk 1's last frame, with the long run's noise
    monkeypatch.setattr(pipeline_module.torch, "randn", lambda *a, **k: next(second))
    tail = long.frames[12:13]
    v2v = pipe.generate("a cat runs", num_frames=13, video=tail, condition_frame_indexes=(0,), **RUN)
    torch.testing.assert_close(long.frames[13:21], v2v.frames[1:9], atol=1e-4, rtol=0)
    torch.testing.assert_close(long.latents[:, :, 4:], v2v.latents[:, :, 1:3], atol=1e-4, rtol=0)


def test_long_video_takes_a_prompt_per_chunk_and_reports_each_chunk(pipe):
    stages, texts = [], []
    original = pipe.denoiser.text_kv

    def spy(ids):
        texts.append(pipe.planner.tokenizer.tokenizer.decode(ids))
        return original(ids)

    pipe.denoiser.text_kv = spy
    try:
        result = pipe.generate('["a red ball rolls", "the ball stops at a wall"]', num_frames=17, chunk_frames=9,
                               progress=lambda *stage: stages.append(stage), **RUN)
    finally:
        del pipe.denoiser.text_kv
    assert result.frames.shape[0] == 17 and len(result.settings.kind.prompt_ids) == 2
    assert [s for s in stages if s[0] == "chunk"] == [("chunk", 1, 2), ("chunk", 2, 2)]
    assert any("red ball rolls" in t for t in texts) and any("stops at a wall" in t for t in texts)
    with pytest.raises(InputError, match="3 prompts were given for 2 chunks"):
        pipe.generate('["a", "b", "c"]', num_frames=17, chunk_frames=9, **RUN)
    with pytest.raises(InputError, match="2 prompts were given for one window"):
        pipe.generate(["a", "b"], num_frames=9, **RUN)


@pytest.mark.parametrize("options, message", [
    (dict(sound=True), "sound is made in one window"),
    (dict(keyframes={0: still(1)}), "keyframes is made in one window"),
    (dict(chunk_overlap_frames=2), "chunk_overlap_frames must be 1 \\+ 4k.*use 1"),
])
def test_what_long_videos_cannot_do_is_refused_by_name(tiny_factory, options, message):
    sound = cosmos3_runtime.load(tiny_factory(kind="gated", sound=True), dtype=torch.float32)  # sound-capable
    with pytest.raises(InputError, match=message):
        sound.generate("a cat", num_frames=17, chunk_frames=9, **RUN, **options)


def test_cancel_mid_long_video_leaves_nothing_behind(pipe):
    class Stop(Exception):
        pass

    def cancel(step, total, denoised):
        if step == total // 2 + 1:  # inside the second chunk
            raise Stop

    with pytest.raises(Stop):
        pipe.generate("a cat", num_frames=17, chunk_frames=9, callback=cancel, **RUN)
    again = pipe.generate("a cat", num_frames=17, chunk_frames=9, **RUN)
    fresh = cosmos3_runtime.load(pipe.checkpoint.root, dtype=torch.float32).generate("a cat", num_frames=17,
                                                                                      chunk_frames=9, **RUN)
    assert torch.equal(again.frames, fresh.frames)
