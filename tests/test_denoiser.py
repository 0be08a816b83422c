"""The denoiser below the runs: the prompts' text K/V computed once and kept for the last two, a run's first
latents, and the schedule each kind of checkpoint samples with."""

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime.conditioning import Held
from cosmos3_runtime.denoiser import TEXT_CACHE_SIZE, Denoiser
from cosmos3_runtime.settings import resolve
from cosmos3_runtime.request import Request


@pytest.fixture(scope="module")
def denoiser(tiny_gated) -> Denoiser:
    return cosmos3_runtime.load(tiny_gated, dtype="fp32", load_vae_weights=False).denoiser


def test_text_kv_is_computed_once_per_prompt_and_kept_for_the_last_two(denoiser, monkeypatch):
    encoded = []
    real = denoiser.transformer.encode_text
    monkeypatch.setattr(denoiser.transformer, "encode_text", lambda ids, device: encoded.append(ids.tolist()) or
                        real(ids, device))
    denoiser.text_cache.clear()
    a, b, c = [1, 2, 3], [4, 5], [6]
    first = denoiser.text_kv(a)
    assert denoiser.text_kv(a) is first and encoded == [a]
    denoiser.text_kv(b)
    denoiser.text_kv(a)  # used again: now the newest
    denoiser.text_kv(c)  # evicts b, the oldest
    assert len(denoiser.text_cache) == TEXT_CACHE_SIZE == 2
    denoiser.text_kv(a)
    denoiser.text_kv(b)
    assert encoded == [a, b, c, b]


def test_encode_prompts_skips_the_negative_prompt_without_guidance(denoiser):
    heard = []
    denoiser.text_cache.clear()
    s = resolve(denoiser.checkpoint.variant, Request(width=32, height=32, num_frames=5, guidance_scale=1.0))
    denoiser.encode_prompts([1, 2], [3], s, None, lambda *a: heard.append(a))
    assert heard == [("text", 1, 1)] and list(denoiser.text_cache) == [denoiser.text_key([1, 2])]


def test_start_latents_are_the_generators_noise_with_held_frames_in_place(denoiser):
    shape = (1, 48, 3, 2, 2)
    clean = torch.full(shape, 7.0)
    mask = torch.tensor([1.0, 0.0, 1.0]).view(3, 1, 1)
    latents = denoiser.start_latents(shape, torch.Generator().manual_seed(3), Held(clean, mask))
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    assert torch.equal(latents[:, :, [0, 2]], clean[:, :, [0, 2]]) and torch.equal(latents[:, :, 1], noise[:, :, 1])


def test_the_latent_shape_follows_the_settings(denoiser):
    s = resolve(denoiser.checkpoint.variant, Request(width=64, height=32, num_frames=9))
    assert denoiser.latent_shape(s) == (1, 48, 3, 2, 4)


def test_each_schedule_has_its_steps(denoiser):
    variant = denoiser.checkpoint.variant
    for schedule in ("unipc", "checkpoint"):
        s = resolve(variant, Request(width=32, height=32, num_frames=5, steps=6, schedule=schedule))
        assert len(denoiser.schedule_for(s).timesteps) == 6
