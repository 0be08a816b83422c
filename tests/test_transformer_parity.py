"""Our transformer against diffusers' Cosmos3OmniTransformer on the same tiny checkpoints (fp32)."""

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime.transformer import ActionTokens, SoundTokens

ref = pytest.importorskip("diffusers_reference")

TOL = 1e-5

CASES = {
    # name: (latent T, h, w, noisy frames, fps, timestep)
    "t2i-odd": (1, 5, 3, [0], 24.0, 937),
    "video": (3, 4, 6, [0, 1, 2], 24.0, 500),
    "video-odd-conditioned-16fps": (4, 5, 7, [1, 3], 16.0, 812),
    "flowmatch-float-timestep": (2, 4, 4, [0, 1], 24.0, 937.5),
}


def _inputs(T, h, w, seed=0, length=9):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 500, (length,), generator=g)
    latents = torch.randn(1, 48, T, h, w, generator=g)
    return ids, latents


def _timestep(value):
    return torch.tensor(value, dtype=torch.int64 if isinstance(value, int) else torch.float32)


@pytest.fixture(scope="module", params=["gated", "edge"])
def models(request, tiny_factory):
    root = tiny_factory(kind=request.param, action=True, sound=True)
    ours = cosmos3_runtime.load(root, device="cpu", dtype=torch.float32).transformer
    return ours, ref.load_transformer(root)


@pytest.mark.parametrize("case", CASES)
def test_vision_velocity_matches_diffusers(models, case):
    ours, theirs = models
    T, h, w, noisy, fps, t = CASES[case]
    ids, latents = _inputs(T, h, w)
    expected, _, _ = ref.velocity(theirs, ids.tolist(), latents, t, noisy, fps)
    got = ours(latents, _timestep(t), ours.encode_text(ids), noisy_frames=noisy, fps=fps).vision
    assert got.shape == expected.shape == latents.shape
    assert expected.abs().max() > 0.1  # a real signal, not an all-zero comparison
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)
    for frame in range(T):
        if frame not in noisy:
            assert torch.count_nonzero(got[:, :, frame]) == 0


def test_sound_and_action_heads_match_diffusers(models):
    ours, theirs = models
    ids, latents = _inputs(3, 4, 4, seed=1)
    g = torch.Generator().manual_seed(2)
    sound = torch.randn(16, 6, generator=g)
    action = torch.randn(8, 64, generator=g)
    clean_actions = [0]
    expected = ref.velocity(theirs, ids.tolist(), latents, 700, [1, 2], 24.0, sound, (action, 8, clean_actions))
    got = ours(
        latents,
        _timestep(700),
        ours.encode_text(ids),
        noisy_frames=[1, 2],
        sound=SoundTokens(sound),
        action=ActionTokens(action, domain=8, noisy_frames=list(range(1, 8))),
    )
    for ours_v, theirs_v in zip((got.vision, got.sound, got.action), expected):
        assert theirs_v.abs().max() > 0.1
        torch.testing.assert_close(ours_v, theirs_v, atol=TOL, rtol=0)
    assert torch.count_nonzero(got.action[0]) == 0


def test_cached_text_kv_equals_fresh_encoding(models):
    """Reusing a prompt's text K/V across steps gives bit-identical velocities to re-encoding it."""
    ours, theirs = models
    ids, latents = _inputs(2, 4, 4, seed=3)
    cache = ours.encode_text(ids)
    for step, t in enumerate((999, 640, 120)):
        x = latents + step
        cached = ours(x, _timestep(t), cache).vision
        fresh = ours(x, _timestep(t), ours.encode_text(ids)).vision
        assert torch.equal(cached, fresh)
        expected, _, _ = ref.velocity(theirs, ids.tolist(), x, t, [0, 1], 24.0)
        torch.testing.assert_close(cached, expected, atol=TOL, rtol=0)


def test_prompt_lengths_change_media_positions(models):
    """A longer prompt shifts every media position, so velocities differ (the cache is per prompt)."""
    ours, _ = models
    ids, latents = _inputs(2, 4, 4, seed=4, length=6)
    longer = torch.cat([ids, ids[:3]])
    a = ours(latents, _timestep(500), ours.encode_text(ids)).vision
    b = ours(latents, _timestep(500), ours.encode_text(longer)).vision
    assert (a - b).abs().max() > 1e-4
