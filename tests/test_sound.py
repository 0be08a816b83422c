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
     pytest.param(13, 24.0, {"video": [picture(10 + i) for i in range(6)]}, marks=pytest.mark.slow)],
    # 3000 / 6500 / 2880 / 4333 samples at 8 kHz
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


# --- audio-conditioned video: a soundtrack held as the sound -----------------------------------------------------


def sweep(rate: int, seconds: float, channels: int = 1) -> torch.Tensor:
    """A sine sweep from 100 Hz towards the Nyquist frequency, [channels, samples] float32 (each channel its own
    level)."""
    t = torch.arange(int(seconds * rate), dtype=torch.float64) / rate
    phase = 2 * torch.pi * (100 * t + (rate / 2.2 - 100) * t**2 / (2 * seconds))
    return torch.stack([torch.sin(phase + c) * (0.7 - 0.2 * c) for c in range(channels)]).float()


@pytest.mark.parametrize("source, target", [(44100, 48000), (16000, 48000), (96000, 48000), (22050, 8000),
                                            (48000, 48000)])
def test_resample_equals_scipy_resample_poly(source, target):
    signal = require("scipy.signal")
    from cosmos3_runtime.sound import resample

    wave = sweep(source, 0.25, channels=2).double()
    expected = torch.from_numpy(signal.resample_poly(wave.numpy(), target, source, axis=-1))
    got = resample(wave, source, target)
    assert got.shape == expected.shape == (2, -(-wave.shape[1] * target // source))
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    n = expected.shape[1]  # trimmed and padded: the first samples, then silence
    torch.testing.assert_close(resample(wave, source, target, n // 3), expected[:, : n // 3], atol=1e-12, rtol=0)
    padded = resample(wave, source, target, n + 100)
    assert torch.equal(padded[:, :n], got) and not padded[:, n:].any()


def test_a_soundtrack_is_fitted_as_the_framework_fits_it():
    from cosmos3_runtime.sound import Audio, SoundConfig, fit_soundtrack

    stereo, mono = SoundConfig(sampling_rate=8000), SoundConfig(sampling_rate=8000, stereo=False)
    one = Audio(sweep(8000, 0.5), 8000)
    fitted = fit_soundtrack(one, stereo, 3000)  # trimmed; mono repeated to stereo
    assert fitted.shape == (2, 3000) and torch.equal(fitted[0], fitted[1])
    torch.testing.assert_close(fitted[0], one.waveform[0, :3000], atol=1e-7, rtol=0)
    fitted = fit_soundtrack(one, stereo, 4321)  # padded with silence at the end
    assert fitted.shape == (2, 4321) and not fitted[:, 4000:].any() and fitted[:, 3990:4000].abs().max() > 0
    two = Audio(sweep(8000, 0.5, channels=2), 8000)  # stereo averaged to mono
    torch.testing.assert_close(fit_soundtrack(two, mono, 4000), two.waveform.mean(0, keepdim=True), atol=1e-7, rtol=0)
    with pytest.raises(InputError, match="has 6 channels and the sound tokenizer takes 2: give a mono or stereo"):
        fit_soundtrack(Audio(torch.zeros(6, 100), 8000), stereo, 100)


def test_audio_comes_as_a_file_comfyui_audio_or_a_waveform(tmp_path):
    import av

    from cosmos3_runtime.media import save_wav
    from cosmos3_runtime.sound import as_audio

    wave = sweep(16000, 0.5, channels=2)
    for value in ({"waveform": wave.unsqueeze(0), "sample_rate": 16000}, (wave, 16000), (wave[0].numpy(), 16000.0)):
        audio = as_audio(value)
        assert audio.sample_rate == 16000 and torch.equal(audio.waveform, wave[: audio.waveform.shape[0]])
    save_wav(wave, tmp_path / "a.wav", 16000)
    audio = as_audio(str(tmp_path / "a.wav"))
    assert audio.sample_rate == 16000 and audio.waveform.shape == (2, 8000)
    torch.testing.assert_close(audio.waveform, wave, atol=1.5 / 32767, rtol=0)  # 16-bit PCM, read back as float
    for codec, suffix in (("flac", ".flac"), ("libmp3lame", ".mp3")):
        path = tmp_path / f"a{suffix}"
        with av.open(str(path), "w") as container:
            stream = container.add_stream(codec, rate=16000 if codec == "flac" else 44100, layout="stereo")
            frame = av.AudioFrame.from_ndarray(wave.numpy(), format="fltp", layout="stereo")
            frame.sample_rate = 16000
            for out in av.AudioResampler(stream.format.name, "stereo", stream.rate, stream.frame_size or None).resample(
                    frame) + [None]:
                for packet in stream.encode(out):
                    container.mux(packet)
        audio = as_audio(path)
        assert audio.waveform.shape[0] == 2 and abs(audio.seconds - 0.5) < 0.1 and audio.waveform.abs().max() > 0.3
    save_wav(wave[:, :3], tmp_path / "1hz.wav", 1)
    for value, words in ((tmp_path / "missing.wav", "audio file .*missing.wav does not exist"),
                         (tmp_path / "a.wav.txt", "does not exist"),
                         ({"waveform": wave.expand(2, 2, -1), "sample_rate": 16000}, "a batch of 2 soundtracks"),
                         ((torch.zeros(2, 10, dtype=torch.int16), 16000), "must be floats"),
                         ((torch.full((1, 10), float("nan")), 16000), "NaN or infinite"),
                         ((wave, 0), "sample rate must be a positive whole number"),
                         ((wave, 1), "sample rate 1 Hz is outside what audio is sampled at"),
                         (tmp_path / "1hz.wav", "sample rate 1 Hz is outside"),  # 3 samples: were 3 s of sound
                         ((wave[:, :0], 16000), "empty"), (42, "audio must be a file path")):
        with pytest.raises(InputError, match=words):
            as_audio(value)
    (tmp_path / "not-audio.wav").write_bytes(b"RIFF nonsense")
    with pytest.raises(InputError, match="cannot read audio"):
        as_audio(tmp_path / "not-audio.wav")


@pytest.mark.parametrize(
    "frames, fps, source, channels, extra",
    [(9, 24.0, 16000, 1, {}), pytest.param(9, 25.0, 44100, 2, {"image": picture(3)}, marks=pytest.mark.slow)],
    # 3000 samples at 8 kHz: 9 whole sound latents held, a 10th generated; 2880: all 9 held
    ids=["t2v-last-latent-generated", "i2v-all-held"],
)
def test_audio_conditioned_video_matches_diffusers(nano, pipe, frames, fps, source, channels, extra):
    """diffusers' pipeline has no audio input: it is driven with the soundtrack held as NVIDIA's framework holds it
    (the encoded latents in place under a condition mask, no time embedding on them, their predictions dropped),
    from the soundtrack fitted by scipy's resample_poly and its own encoder."""
    signal = require("scipy.signal")
    wave = sweep(source, 0.5, channels)
    samples, hop = samples_for(frames, fps, 8000), 320
    fitted = torch.from_numpy(signal.resample_poly(wave.double().numpy(), 8000, source, axis=-1)).float()
    fitted = fitted.expand(2, -1)[:, :samples] if channels == 1 else fitted[:, :samples]
    with torch.no_grad():
        clean = reference_tokenizer(nano / "sound_tokenizer").encode(
            torch.nn.functional.pad(fitted, (0, -samples % hop)).unsqueeze(0)).latent_dist.mode()[0]
    held = samples // hop
    reference = ref.omni_pipeline(nano)
    prepare, segment = reference.prepare_latents, reference._prepare_sound_segment

    def prepare_latents(*args, **kwargs):
        out = list(prepare(*args, **kwargs))  # (..., sound latents at 1, ..., the sound condition mask at 6, ...)
        mask = torch.zeros_like(out[6])
        mask[:held] = 1.0
        out[1], out[6] = mask.T * clean + (1 - mask.T) * out[1], mask
        return tuple(out)

    def sound_segment(*args, **kwargs):
        out = segment(*args, **kwargs)
        out["sound_noisy_frame_indexes"] = [torch.arange(held, out["sound_len"])]
        out["sound_mse_loss_indexes"] = out["sound_sequence_indexes"][held:]
        return out

    reference.prepare_latents, reference._prepare_sound_segment = prepare_latents, sound_segment
    seen = {}
    decode_sound = reference.decode_sound
    reference.decode_sound = lambda latents: seen.setdefault("latents", latents.clone()) is not None and decode_sound(
        latents
    )
    common = dict(prompt="A drum solo.", negative_prompt="silence", num_frames=frames, fps=fps, **SIZE, **extra)
    with torch.no_grad():
        expected = reference(**common, num_inference_steps=3, guidance_scale=6.0, enable_sound=True,
                             generator=torch.Generator("cpu").manual_seed(5), output_type="np")
    got = pipe.generate(**common, steps=3, seed=5, schedule="checkpoint", json_captions=False, cache="off",
                        audio=(wave, source))
    assert got.settings.guidance_scale == 6.0 and got.settings.mode == ("i2v" if extra else "t2v")
    assert torch.equal(got.sound_latents[:, :held], clean[:, :held])  # held exactly
    torch.testing.assert_close(got.sound_latents, seen["latents"].float(), atol=TOL, rtol=0)
    torch.testing.assert_close(got.frames, torch.from_numpy(expected.video), atol=TOL, rtol=0)
    assert got.sample_rate == 8000
    torch.testing.assert_close(got.sound, fitted.clamp(-1, 1), atol=1e-6, rtol=0)  # the soundtrack, not a decode
    plain = pipe.generate(**common, steps=3, seed=5, schedule="checkpoint", json_captions=False, cache="off",
                          guidance_scale=6.0)
    assert (plain.frames - got.frames).abs().max() > 0.05  # the soundtrack steers the video


def test_audio_conditioning_defaults_and_notes(nano):
    from cosmos3_runtime.pipeline import planner

    plan = planner(nano, device="cpu").plan("a", audio=(sweep(8000, 3.0), 8000), **SIZE)
    s = plan.settings
    assert (s.num_frames, s.fps, s.steps, s.guidance_scale, s.flow_shift) == (189, 24.0, 35, 6.0, 10.0)
    assert "its 7.88 s held as the sound" in s.notes[0]
    assert "the soundtrack's 3.00 s padded with silence to the video's 7.88 s" in s.notes[1]
    s = planner(nano, device="cpu").plan("a", audio=(sweep(8000, 3.0), 8000), num_frames=49, guidance_scale=3,
                                         **SIZE).settings
    assert (s.num_frames, s.guidance_scale) == (49, 3.0) and "trimmed to the video's 2.04 s" in s.notes[1]


def test_a_long_video_holds_each_chunks_slice_of_the_soundtrack_and_its_sound_is_the_soundtrack(pipe, monkeypatch):
    """Two chunks of 5 frames (the second starts on the first's last frame): each holds the soundtrack from its own
    first frame, so the overlap's sound is the first chunk's there; the run's sound is the input soundtrack."""
    wave = sweep(8000, 0.5, channels=2)  # at the tokenizer's rate and channels: fitted, it is these samples
    encoded, encode = [], pipe.codec.encode_sound
    monkeypatch.setattr(pipe.codec, "encode_sound", lambda soundtrack: encoded.append(soundtrack) or encode(soundtrack))
    out = pipe.generate("a drummer", audio=(wave, 8000), num_frames=9, chunk_frames=5, steps=1, cache="off", **SIZE)
    assert out.settings.kind.chunks.count == 2 and out.sample_rate == 8000
    assert torch.equal(out.sound, wave[:, : samples_for(9, 24.0, 8000)])
    chunk, second = samples_for(5, 24.0, 8000), samples_for(4, 24.0, 8000)  # the second chunk starts at frame 4
    assert [s.shape[1] for s in encoded] == [chunk, chunk]
    assert torch.equal(encoded[0], wave[:, :chunk]) and torch.equal(encoded[1], wave[:, second : second + chunk])


def test_audio_conditioning_is_refused_where_it_cannot_work(tiny_gated, tiny_factory, nano, monkeypatch):
    from cosmos3_runtime.pipeline import planner
    from cosmos3_runtime.weights import files

    audio = (sweep(8000, 0.5), 8000)
    monkeypatch.setattr(files, "_tensors", lambda *a: pytest.fail("a weight was read before the refusal"))
    decoder_only = tiny_factory(kind="gated", sound=True, sound_encoder=False)
    cases = [(tiny_gated, {}, "no sound head .*audio conditioning needs a sound-capable checkpoint"),
             (decoder_only, {}, r"sound_tokenizer \(diffusion_pytorch_model.safetensors\) has no encoder.\* weights"),
             (tiny_factory(kind="gated", distilled=True, sound=True), {}, r"do not generate sound \(audio conditioning"),
             (nano, {"num_frames": 1}, "audio conditioning needs a video"),
             (nano, {"audio": (torch.zeros(3, 4000), 8000)}, "has 3 channels and the sound tokenizer takes 2"),
             (nano, {"audio": None, "sound": True, "num_frames": 301},
              r"sound is made in one window: .* \(a soundtrack given as audio runs in chunks\)")]
    for root, options, words in cases:
        with pytest.raises(InputError, match=words):
            planner(root, device="cpu").plan("a", **{"audio": audio, **SIZE, **options})
    with pytest.raises(InputError, match="transfer .* does not combine with audio"):
        cosmos3_runtime.Request(audio=audio, control_videos={"edge": torch.zeros(5, 48, 64, 3)})
    with pytest.raises(InputError, match=r"audio \(a soundtrack the video follows, .*\) does not combine with sound"):
        cosmos3_runtime.Request(audio=audio, sound=True)  # (the soundtrack won, silently)
