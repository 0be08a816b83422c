"""Our transformer against diffusers' Cosmos3OmniTransformer on the same tiny checkpoints (fp32)."""

import pytest
from conftest import require
import torch

import cosmos3_runtime
from cosmos3_runtime.geometry import TEMPORAL_FACTOR
from cosmos3_runtime.transformer import Segment

require("diffusers", minversion="0.42.1")
import diffusers_reference as ref  # noqa: E402

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
        tracks=[Segment("sound", sound.t(), fps=ours.config.sound_latent_fps),
                Segment("action", action, list(range(1, 8)), base_temporal_factor=TEMPORAL_FACTOR, start_frame=1,
                            domain=8)],
    )
    sound_v, action_v = got.tracks
    for ours_v, theirs_v in zip((got.vision, sound_v.t(), action_v), expected):
        assert theirs_v.abs().max() > 0.1
        torch.testing.assert_close(ours_v, theirs_v, atol=TOL, rtol=0)
    assert torch.count_nonzero(action_v[0]) == 0


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


# --- bit-exact building blocks in bf16 (the released precision) ---------------------------------------
# End-to-end bf16 outputs differ from diffusers by accumulated rounding (about half the values bit-equal,
# max 2 ulps on the tiny models), which cannot tell a rounding-order bug from noise. These module-level
# comparisons can: each must be bit-identical.


def _bf16(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


@pytest.mark.parametrize("nemotron", [False, True])
def test_norms_are_bit_exact_in_bf16(nemotron):
    from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3NemotronRMSNorm

    from cosmos3_runtime.transformer import NemotronRMSNorm, RMSNorm

    ours = (NemotronRMSNorm if nemotron else RMSNorm)(128, 1e-5).to(torch.bfloat16)
    theirs = (Cosmos3NemotronRMSNorm(128, eps=1e-5) if nemotron else DiffusersRMSNorm(128, eps=1e-5)).to(torch.bfloat16)
    weight = 1 + 0.1 * _bf16(128, seed=1)
    ours.weight.data.copy_(weight)
    theirs.weight.data.copy_(weight)
    x = _bf16(64, 8, 128)
    assert torch.equal(ours(x), theirs(x))


def test_edge_activation_is_bit_identical_to_relu_times_relu_for_every_bf16_value(monkeypatch):
    from cosmos3_runtime import transformer

    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = x[torch.isfinite(x)]
    assert torch.equal(transformer.relu_squared(x), torch.relu(x) * torch.relu(x))
    # ... and it is what the Edge MLP applies
    seen = []
    monkeypatch.setattr(transformer, "relu_squared", lambda t: seen.append(t) or torch.relu(t) * torch.relu(t))
    mlp = transformer.MLP(transformer.TransformerConfig(hidden_size=8, intermediate_size=16, hidden_act="relu2"))
    mlp(torch.randn(3, 8))
    assert len(seen) == 1 and seen[0].shape == (3, 16)


def test_rope_tables_are_bit_exact_in_bf16():
    from diffusers.models.transformers.transformer_cosmos3 import Cosmos3VLTextRotaryEmbedding
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
        get_3d_mrope_ids_text_tokens,
        get_3d_mrope_ids_vae_tokens,
    )

    from cosmos3_runtime.rope import inverse_frequencies, media_positions, mrope_cos_sin, text_positions

    text_ids, _ = get_3d_mrope_ids_text_tokens(37, 0, use_float_positions=True)
    media_ids, _ = get_3d_mrope_ids_vae_tokens(5, 23, 40, 37 + 15000, fps=16.0, base_fps=24.0)
    theirs = Cosmos3VLTextRotaryEmbedding(128, 5e6, [24, 20, 20])
    expected = theirs(torch.cat([text_ids, media_ids], dim=1).unsqueeze(1), "cpu", torch.bfloat16)
    positions = torch.cat([text_positions(37), media_positions(5, 23, 40, 37 + 15000, 16.0, 24.0, 4)], dim=1)
    assert torch.equal(positions, torch.cat([text_ids, media_ids], dim=1).float())
    got = mrope_cos_sin(positions, inverse_frequencies(128, 5e6), (24, 20, 20), torch.bfloat16)
    assert torch.equal(got[0], expected[0].squeeze(0)) and torch.equal(got[1], expected[1].squeeze(0))


@pytest.mark.parametrize("timestep", [999, 937, 500, 1, 0])
def test_time_embedding_is_bit_exact(timestep):
    from diffusers.models.embeddings import TimestepEmbedding, Timesteps

    from cosmos3_runtime.transformer import TimestepEmbedder

    torch.manual_seed(0)
    theirs, project = TimestepEmbedding(256, 64), Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)
    ours = TimestepEmbedder(64)
    ours.load_state_dict(theirs.state_dict())
    t = torch.full((3,), timestep)  # int64, as UniPC hands it over
    expected = theirs(project(t * 0.001).to(torch.float32))
    assert torch.equal(ours(t * 0.001), expected)
    # The runtime embeds the timestep once per forward instead of once per token; a one-row matmul
    # rounds differently from a many-row one in the last bit.
    torch.testing.assert_close(ours(t[:1] * 0.001), expected[:1], atol=1e-7, rtol=0)
