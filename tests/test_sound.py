"""Sound: the audio tokenizer and joint audio-video generation against diffusers 0.42.1 (fp32, tiny checkpoints).

Tolerance as for video: sound latents, waveforms, video latents and frames within 1e-4.
"""

import json
import shutil

import numpy as np
import pytest
import torch
from conftest import require
from PIL import Image

import cosmos3_runtime
from cosmos3_runtime import CheckpointError, InputError
from cosmos3_runtime.sound import load_sound_tokenizer, samples_for

require("diffusers", minversion="0.42.1")
import diffusers_reference as ref  # noqa: E402
from diffusers.models.autoencoders.autoencoder_cosmos3_audio import Cosmos3AVAEAudioTokenizer  # noqa: E402

TOL = 1e-4
SIZE = dict(height=48, width=64)


@pytest.fixture(scope="module")
def nano(tiny_factory):
    return tiny_factory(kind="gated", sound=True)


@pytest.fixture(scope="module")
def pipe(nano):
    return cosmos3_runtime.load(nano, dtype=torch.float32)


def reference_tokenizer(folder):
    return Cosmos3AVAEAudioTokenizer.from_pretrained(str(folder), torch_dtype=torch.float32).eval()


def test_tokenizer_decode_and_encode_match_diffusers(nano):
    ours = load_sound_tokenizer(nano / "sound_tokenizer", torch.device("cpu"), torch.float32)
    theirs = reference_tokenizer(nano / "sound_tokenizer")
    latents = torch.randn(16, 37, generator=torch.Generator().manual_seed(0))
    waveform = ours.decode(latents)
    assert waveform.shape == (2, 37 * 320)
    assert 0.01 < (waveform.abs() < 1).float().mean()  # not all clamped: the comparison means something
    torch.testing.assert_close(waveform, theirs.decode(latents), atol=1e-5, rtol=0)
    audio = torch.rand(2, 3000, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with torch.no_grad():
        expected = theirs.encode(audio.unsqueeze(0)).latent_dist.mode()[0]
    torch.testing.assert_close(ours.encode(audio), expected, atol=1e-5, rtol=0)


def test_decoder_only_tokenizer_loads_and_decodes(tiny_factory):
    root = tiny_factory(kind="gated", sound=True, sound_encoder=False)
    ours = load_sound_tokenizer(root / "sound_tokenizer", torch.device("cpu"), torch.float32)
    assert ours.encoder is None
    latents = torch.randn(16, 10)
    torch.testing.assert_close(ours.decode(latents), reference_tokenizer(root / "sound_tokenizer").decode(latents),
                               atol=1e-5, rtol=0)
    with pytest.raises(InputError, match="decoder-only"):
        ours.encode(torch.zeros(2, 640))


def test_missing_or_corrupt_tokenizer_is_a_clear_error(nano, tmp_path):
    root = shutil.copytree(nano, tmp_path / "missing")
    shutil.rmtree(root / "sound_tokenizer")
    with pytest.raises(CheckpointError, match="declares a sound_tokenizer but .*sound_tokenizer is missing"):
        cosmos3_runtime.load(root)
    root = shutil.copytree(nano, tmp_path / "corrupt")
    weights = root / "sound_tokenizer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="corrupt"):
        cosmos3_runtime.load(root)


def picture(seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (40, 72, 3), dtype=np.uint8))


@pytest.mark.parametrize(
    "frames, fps, extra",
    [(9, 24.0, {}), (13, 16.0, {}), (9, 25.0, {"image": picture(3)}),
     (13, 24.0, {"video": [picture(10 + i) for i in range(6)]})],  # 3000 / 6500 / 2880 / 4333 samples at 8 kHz
    ids=["t2v-partial-sound-frame", "t2v-16fps", "i2v", "v2v"],  # 3000 samples: 9.375 sound frames of 320
)
def test_generation_with_sound_matches_diffusers(nano, pipe, frames, fps, extra):
    common = dict(prompt="Rain on a tin roof.", negative_prompt="silence", num_frames=frames, fps=fps, **SIZE,
                  **extra)
    reference = ref.omni_pipeline(nano)
    seen = {}
    decode_sound = reference.decode_sound
    reference.decode_sound = lambda latents: seen.setdefault("latents", latents.clone()) is not None and decode_sound(
        latents
    )
    with torch.no_grad():
        expected = reference(**common, num_inference_steps=3, guidance_scale=4.0, enable_sound=True,
                             generator=torch.Generator("cpu").manual_seed(5), output_type="np")
    got = pipe.generate(**common, steps=3, guidance_scale=4.0, seed=5, schedule="checkpoint", json_captions=False,
                        sound=True, sound_trim=False, cache="off")
    torch.testing.assert_close(got.sound_latents, seen["latents"].float(), atol=TOL, rtol=0)
    torch.testing.assert_close(got.sound, expected.sound.float(), atol=TOL, rtol=0)
    torch.testing.assert_close(got.frames, torch.from_numpy(expected.video), atol=TOL, rtol=0)
    assert got.sample_rate == 8000 and got.sound.shape[1] == got.sound_latents.shape[1] * 320
    assert got.sound.abs().max() > 0.01
    trimmed = pipe.generate(**common, steps=3, guidance_scale=4.0, seed=5, schedule="checkpoint", json_captions=False,
                            sound=True, cache="off")
    assert trimmed.sound.shape == (2, samples_for(frames, fps, 8000)) == (2, int(frames / fps * 8000))
    assert torch.equal(trimmed.sound, got.sound[:, : trimmed.sound.shape[1]])


def test_sound_is_refused_where_it_cannot_work(tiny_gated, tiny_factory, nano, tmp_path):
    plain = cosmos3_runtime.load(tiny_gated, dtype=torch.float32)
    with pytest.raises(InputError, match="no sound head"):
        plain.generate("a cat", sound=True, num_frames=5, **SIZE)
    distilled = cosmos3_runtime.load(tiny_factory(kind="gated", distilled=True, sound=True), dtype=torch.float32)
    with pytest.raises(InputError, match="distilled checkpoints do not generate sound"):
        distilled.generate("a cat", sound=True, num_frames=5, **SIZE)
    with pytest.raises(InputError, match="sound needs a video"):
        cosmos3_runtime.load(nano, dtype=torch.float32).generate("a cat", sound=True, num_frames=1, **SIZE)
    root = shutil.copytree(nano, tmp_path / "no-tokenizer")
    index = json.loads((root / "model_index.json").read_text())
    index["sound_tokenizer"] = [None, None]
    (root / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(InputError, match="no sound_tokenizer in model_index.json"):
        cosmos3_runtime.load(root, dtype=torch.float32).generate("a cat", sound=True, num_frames=5, **SIZE)
