"""The transformer's media K/V cache (`MediaKV`): forwards over a history held in the cache equal one forward over the
whole sequence under the matching block-causal mask (fp32), and eviction keeps the right frames at their positions."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import cosmos3_runtime
from cosmos3_runtime.errors import InputError
from cosmos3_runtime.transformer import MediaKV

TOL = 1e-5
FPS = 16.0  # not the base 24: the temporal positions go through fps modulation
H, W = 4, 6  # latent size: a 2 x 3 patch grid, 6 tokens a frame
TOKENS = (H // 2) * (W // 2)


@pytest.fixture(scope="module", params=["gated", "edge"])
def model(request, tiny_factory):
    return cosmos3_runtime.load(tiny_factory(kind=request.param), device="cpu", dtype="fp32").transformer


@pytest.fixture
def inputs(model):
    g = torch.Generator().manual_seed(0)
    return model.encode_text(torch.randint(0, 500, (9,), generator=g)), torch.randn(1, 48, 8, H, W, generator=g)


def masked_attention(visible: torch.Tensor):
    """The media attention with a mask: media row i sees media row j where visible[i, j], and every text row."""

    def attend(q, k, v):  # q [N, A, D], k/v [L + N, K, D] -> [N, A*D]
        text = k.shape[0] - q.shape[0]
        mask = torch.cat([visible.new_ones(q.shape[0], text), visible], dim=1)
        groups = q.shape[1] // k.shape[1]
        q, k, v = (t.transpose(0, 1) for t in (q, k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(0, 1).flatten(1)

    return attend


def masked_forward(model, latents, t, text, noisy, visible_frames):
    """One forward over every frame of `latents`, a row of frame f seeing the rows of frame g where visible_frames(f, g)."""
    frame = torch.arange(latents.shape[2]).repeat_interleave(TOKENS)
    visible = torch.tensor([[visible_frames(f, g) for g in frame.tolist()] for f in frame.tolist()])
    return model(latents, t, text, noisy, FPS, hooks=replace(model.hooks, attention=masked_attention(visible))).vision


def rollout(model, latents, text, chunks, cache):
    """Run each chunk of frames clean (no time embedding, as a causal model commits them) after the chunks before it,
    and hold its K/V."""
    hooks = replace(model.hooks, cache=cache)
    for first, last in chunks:
        model(latents[:, :, first:last], torch.tensor(0), text, [], FPS, hooks=replace(hooks, start_frame=first))
        cache.append()
    return hooks


def test_the_current_frames_after_the_history_equal_one_block_causal_forward(model, inputs):
    """Frames 0..3 held, then frames 4..7 denoised against them: the current frames' velocities equal those of one
    forward over all eight where the history sees only itself and the current frames see everything."""
    text, latents = inputs
    t, history = torch.tensor(700), 4
    cache = MediaKV(model.config, 8 * TOKENS, torch.float32, torch.device("cpu"))
    hooks = rollout(model, latents, text, [(0, history)], cache)
    current = model(latents[:, :, history:], t, text, None, FPS, hooks=replace(hooks, start_frame=history)).vision
    expected = masked_forward(model, latents, t, text, list(range(history, 8)), lambda f, g: g < history or f >= history)
    torch.testing.assert_close(current, expected[:, :, history:], atol=TOL, rtol=0)
    assert cache.held == history * TOKENS  # a forward not appended leaves the history as it was


@pytest.mark.parametrize("sink, window, kept", [(0, 3, [3, 4, 5]), (1, 2, [0, 4, 5]), (2, 0, [0, 1]),
                                                (1, 9, [0, 1, 2, 3, 4, 5])])
def test_eviction_keeps_the_first_and_the_latest_frames_at_their_positions(model, inputs, sink, window, kept):
    """Three chunks of two frames committed one after another, then eviction: the kept frames' keys and values are the
    rows they were written as (their rotary positions too), and the next chunk denoised against them equals one
    forward under the block-causal mask without the evicted frames."""
    text, latents = inputs
    t, chunks = torch.tensor(700), [(0, 2), (2, 4), (4, 6)]
    cache = MediaKV(model.config, 8 * TOKENS, torch.float32, torch.device("cpu"))
    hooks = rollout(model, latents, text, chunks, cache)
    frames, keys, values = cache.frames.clone(), cache.keys[:, : cache.held].clone(), cache.values[:, : cache.held].clone()

    cache.evict(sink, window)
    assert cache.frames.unique().tolist() == kept and cache.held == len(kept) * TOKENS
    for f in kept:
        assert torch.equal(cache.keys[:, : cache.held][:, cache.frames == f], keys[:, frames == f])
        assert torch.equal(cache.values[:, : cache.held][:, cache.frames == f], values[:, frames == f])

    def visible(f, g):  # block-causal by chunk; the current chunk (frames 6, 7) no longer sees the evicted frames
        return g // 2 == f // 2 or g // 2 < f // 2 and (f < 6 or g in kept)

    current = model(latents[:, :, 6:], t, text, None, FPS, hooks=replace(hooks, start_frame=6)).vision
    expected = masked_forward(model, latents, t, text, [6, 7], visible)
    torch.testing.assert_close(current, expected[:, :, 6:], atol=TOL, rtol=0)


def test_a_forward_the_cache_cannot_hold_is_refused(model, inputs):
    text, latents = inputs
    cache = MediaKV(model.config, 3 * TOKENS, torch.float32, torch.device("cpu"))
    hooks = rollout(model, latents, text, [(0, 2)], cache)
    with pytest.raises(InputError, match="evict frames first"):
        model(latents[:, :, 2:4], torch.tensor(700), text, hooks=hooks)
    with pytest.raises(ValueError, match="wrote 0 rows"):
        cache.append()


def test_attention_reads_the_text_and_the_history_in_place(model, inputs):
    """Every layer's attention gets its keys and values as views of the cache's own slab, [text ; held ; this
    forward's], not a concatenated copy; a longer prompt later makes room for its text and keeps the held rows: the
    forward after it equals one over a cache that had the room from the start, bit for bit."""
    text, latents = inputs
    longer = model.encode_text(torch.arange(14) % 500)
    seen = []

    def attend(q, k, v):
        seen.append(all(t.untyped_storage().data_ptr() in slabs for t in (k, v)))
        return cosmos3_runtime.transformer.attention(q, k, v)

    grown = MediaKV(model.config, 8 * TOKENS, torch.float32, torch.device("cpu"))
    hooks = rollout(model, latents, text, [(0, 2), (2, 4)], grown)
    slabs = {t.untyped_storage().data_ptr() for t in grown.slabs}
    model(latents[:, :, 4:], torch.tensor(700), text, None, FPS, hooks=replace(hooks, start_frame=4, attention=attend))
    assert len(seen) == model.config.num_hidden_layers and all(seen)

    roomy = MediaKV(model.config, 8 * TOKENS, torch.float32, torch.device("cpu"))
    model(latents[:, :, :2], torch.tensor(0), longer, [], FPS, hooks=replace(model.hooks, cache=roomy))  # not kept
    rollout(model, latents, text, [(0, 2), (2, 4)], roomy)
    after = [model(latents[:, :, 4:], torch.tensor(700), longer, None, FPS,
                   hooks=replace(model.hooks, cache=cache, start_frame=4)).vision for cache in (grown, roomy)]
    assert grown.text_rows == roomy.text_rows == longer.length and torch.equal(*after)
