"""The codec (`cosmos3_runtime.codec`): the VAE and the sound tokenizer behind one object that every run, track and
host encodes and decodes through, refusing by name what a load without them cannot do."""

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime.codec import Codec
from cosmos3_runtime.errors import InputError


@pytest.fixture(scope="module")
def latents_only(tiny_gated):
    return cosmos3_runtime.load(tiny_gated, dtype="fp32", load_vae_weights=False)


@pytest.mark.parametrize("call, what", [
    (lambda pipe: pipe.decode(torch.zeros(1, 48, 1, 2, 2)), "decoding needs the VAE"),
    (lambda pipe: pipe.encode(torch.zeros(1, 32, 32, 3)), "encoding needs the VAE"),
    (lambda pipe: pipe.raw_latents(torch.zeros(1, 48, 1, 2, 2)), "converting latents needs the VAE"),
    (lambda pipe: pipe.decode_sound(torch.zeros(16, 4)), "decoding sound needs the checkpoint's sound tokenizer"),
    (lambda pipe: pipe.generate("a cat", width=32, height=32, num_frames=5, steps=1, image=torch.rand(32, 32, 3),
                                output="latents"), "image and video conditioning needs the VAE"),
    (lambda pipe: pipe.generate("a cat", width=32, height=32, num_frames=9, chunk_frames=5, steps=1,
                                output="latents"), "a long video .* needs the VAE"),
])
def test_a_load_without_the_vae_refuses_by_name_what_needs_it(latents_only, call, what):
    with pytest.raises(InputError, match=what):
        call(latents_only)


def test_the_pipeline_and_its_codec_share_one_vae(tiny_gated):
    pipe = cosmos3_runtime.load(tiny_gated, dtype="fp32")
    assert isinstance(pipe.codec, Codec) and pipe.vae is pipe.codec.vae and pipe.sound_tokenizer is pipe.codec.sound_tokenizer
    frames = torch.rand(5, 32, 32, 3)
    assert torch.equal(pipe.encode(frames), pipe.codec.encode(frames))
    seen = []
    pipe.codec.observe = lambda part, dtype, pixels: seen.append(part)
    pipe.codec.decode(pipe.codec.encode(frames))
    assert seen == ["the VAE decoder"]  # a generation's finite check hears every decode through this
    pipe.device = torch.device("meta")  # what a host does when it moves the pipeline for a node
    assert pipe.codec.device == torch.device("meta")
