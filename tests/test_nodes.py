"""Node-level behaviour without ComfyUI: model folders, bad input, interrupts, caching, helper nodes."""

import json
import sys
import logging

import pytest
import torch


@pytest.fixture
def nodes(pack, models_dir):
    pack.loader._loaded.clear()
    return pack


def load(nodes, name="Cosmos3-Edge", **options):
    result = nodes.Cosmos3ModelLoader().load(name, "fp32", "default", **options)
    return result["result"]


def text(nodes, prompt="a cat", negative=""):
    return nodes.Cosmos3TextEncode().encode(prompt, negative, "auto", True, True, True)["result"][0]


def sample(nodes, model, text_bundle, frames=5, guidance=0.0, **extra):
    result = nodes.Cosmos3Sampler().sample(model, text_bundle, 64, 48, frames, 0.0, guidance, "auto", 1, **extra)
    return result["result"][0], result["ui"]["text"]


def test_checkpoint_folders_are_listed_with_their_subfolders(nodes):
    names = nodes.loader.checkpoint_names()
    assert "Cosmos3-Edge" in names and "nvidia/Cosmos3-Edge-Policy-DROID" in names
    assert nodes.Cosmos3ModelLoader.INPUT_TYPES()["required"]["model_name"][0] == names


def test_other_diffusers_models_are_not_listed(nodes, models_dir):
    other = models_dir / "FLUX.1-dev"
    other.mkdir()
    (other / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    (models_dir / "broken").mkdir()
    (models_dir / "broken" / "model_index.json").write_text("{not json")
    names = nodes.loader.checkpoint_names()
    assert "FLUX.1-dev" not in names and "broken" not in names and "Cosmos3-Edge" in names


def test_loader_reports_the_variant(nodes):
    result = nodes.Cosmos3ModelLoader().load("Cosmos3-Super-Text2Image-4Step", "auto", "default")
    info = result["result"][2]
    assert "distilled 4-step (SDE)" in info and result["ui"]["text"] == [info]
    assert "Edge (dense relu2), multi-step, action head" in load(nodes, "nvidia/Cosmos3-Edge-Policy-DROID")[2]


def test_unknown_model_name(nodes):
    with pytest.raises(nodes.loader.CheckpointError, match="'Cosmos3-Ultra' not found in .*models/cosmos3"):
        load(nodes, "Cosmos3-Ultra")


@pytest.mark.parametrize("name", ["../cosmos3/Cosmos3-Edge", "Cosmos3-Edge/../../secret", "/etc", "~/models", "a//b"])
def test_names_escaping_the_model_folders_are_refused(nodes, name):
    with pytest.raises(nodes.loader.CheckpointError, match="is refused"):
        load(nodes, name)


@pytest.mark.parametrize("repo", ["/etc", "../models", "./Cosmos3-Edge", "nvidia/../../etc", "C:\\models", "x"])
def test_repo_id_field_never_takes_a_path(nodes, repo):
    with pytest.raises(nodes.loader.CheckpointError, match="is not a Hugging Face repo id: the form is namespace/name"):
        nodes.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default", hf_repo_id=repo)
    assert "not a Hugging Face repo id" in nodes.Cosmos3ModelLoader.VALIDATE_INPUTS(hf_repo_id=repo)


def test_repo_id_field_reads_the_local_hugging_face_cache(nodes, tiny_edge, monkeypatch, tmp_path):
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "models--nvidia--Cosmos3-Edge"
    (snapshot / "refs").mkdir(parents=True)
    (snapshot / "refs" / "main").write_text("0" * 40)
    import shutil

    shutil.copytree(tiny_edge, snapshot / "snapshots" / ("0" * 40))
    info = nodes.Cosmos3ModelLoader().load("Cosmos3-Nano", "fp32", "default", hf_repo_id="nvidia/Cosmos3-Edge")
    assert info["result"][2].startswith("nvidia/Cosmos3-Edge: Edge")
    with pytest.raises(nodes.loader.CheckpointError, match="not in the local Hugging Face cache"):
        nodes.Cosmos3ModelLoader().load("Cosmos3-Nano", "fp32", "default", hf_repo_id="nvidia/Cosmos3-Absent")


def test_sizes_not_multiple_of_16(nodes):
    model, _, _ = load(nodes)
    with pytest.raises(nodes.vae.InputError, match="multiple of 16"):
        nodes.Cosmos3Sampler().sample(model, text(nodes), 100, 48, 5, 0.0, 0.0, "auto", 0)


def test_sampler_validation_at_queue_time(nodes):
    """What ComfyUI calls when a prompt is queued, before anything runs or loads."""
    validate = nodes.Cosmos3Sampler.VALIDATE_INPUTS
    assert validate(width=0, height=0, guidance_interval="auto") is True
    assert validate(width=832, height=480, guidance_interval="960-1001") is True
    assert validate(width=None, height=480, guidance_interval=None) is True  # linked inputs arrive as None
    assert "width 100 must be a positive multiple of 16" in validate(width=100, height=480, guidance_interval="auto")
    assert "must be 'auto', 'off' or 'LOW,HIGH'" in validate(width=0, height=0, guidance_interval="sometimes")
    assert "latent frame numbers" in nodes.Cosmos3VideoToVideo.VALIDATE_INPUTS(condition_frames="first two")


def test_the_sampler_reports_what_seacache_did_and_can_turn_it_off(nodes):
    model, _, _ = load(nodes)
    on = nodes.Cosmos3Sampler().sample(model, text(nodes), 64, 48, 5, 0.0, 0.0, "auto", 1)
    off = nodes.Cosmos3Sampler().sample(model, text(nodes), 64, 48, 5, 0.0, 0.0, "auto", 1, cache="off")
    assert any(line.startswith("SeaCache: ") for line in on["ui"]["text"])
    assert not any("SeaCache" in line for line in off["ui"]["text"])


def test_node_errors_and_notes_name_the_widgets(nodes):
    """The runtime's words for its arguments (num_frames, guidance_scale) become the node's (frames, guidance)."""
    model, _, _ = load(nodes)
    (image,) = nodes.Cosmos3ImageToVideo().condition(torch.rand(1, 48, 64, 3))
    with pytest.raises(nodes.vae.InputError, match=r"^frames is 1 \(text-to-image\): .*\(frames >= 5\)$"):
        nodes.Cosmos3Sampler().sample(model, text(nodes), 64, 48, 1, 0.0, 0.0, "auto", 0, media=image)
    _, messages = sample(nodes, model, text(nodes), frames=7)
    assert "frames 7 rounded to 5 (frame counts are 1 + 4k)" in messages


def test_malformed_json_caption_is_prose_with_a_warning(nodes, caplog):
    bundle_result = nodes.Cosmos3TextEncode().encode('{"temporal_caption": "a cat"', "", "auto", True, True, True)
    assert bundle_result["ui"]["text"] == ["prompt read as prose"]
    model, _, _ = load(nodes)
    with caplog.at_level(logging.WARNING):
        latent, _ = sample(nodes, model, bundle_result["result"][0])
    assert "not valid JSON; using it as prose" in caplog.text
    assert latent["samples"].shape == (1, 48, 2, 3, 4)
    ok = nodes.Cosmos3TextEncode().encode('{"temporal_caption": "a cat"}', "", "auto", True, True, True)
    assert ok["ui"]["text"] == ["prompt read as JSON caption"]


def test_distilled_checkpoint_given_guidance_7(nodes):
    model, _, _ = load(nodes, "Cosmos3-Super-Image2Video-4Step")
    latent, messages = sample(nodes, model, text(nodes), guidance=7.0)
    assert any("guidance 7.0 forced to 1.0" in m for m in messages)
    assert "4 steps (distilled), guidance 1" in messages[1]


def test_interrupt_during_sampling_then_a_successful_run(nodes, monkeypatch):
    model, vae, _ = load(nodes)

    class Interrupted(BaseException):  # ComfyUI's InterruptProcessingException is a BaseException too
        pass

    calls = []

    def interrupt_on_second_step():
        calls.append(1)
        if len(calls) == 2:
            raise Interrupted

    monkeypatch.setattr(nodes.services.progress, "check_interrupt", interrupt_on_second_step)
    with pytest.raises(Interrupted):
        sample(nodes, model, text(nodes))
    monkeypatch.undo()
    first, _ = sample(nodes, model, text(nodes))
    again, _ = sample(nodes, model, text(nodes))
    assert torch.equal(first["samples"], again["samples"])
    images, fps = nodes.Cosmos3VAEDecode().decode(vae, first, False, 32, 8)
    assert images.shape == (5, 48, 64, 3) and fps == 24.0


def test_switching_checkpoints_frees_the_previous_one(nodes):
    import weakref

    edge, _, _ = load(nodes, "Cosmos3-Edge")
    first = weakref.ref(edge.pipeline)
    nano, _, _ = load(nodes, "Cosmos3-Nano")  # the old handle is still cached (by ComfyUI), its pipeline is not
    assert first() is None and list(nodes.loader._loaded.values()) == [nano.pipeline]
    assert edge.pipeline.variant.is_edge  # an old handle reloads when used


def test_the_pack_holds_no_pipeline_that_comfyui_dropped(nodes):
    """ComfyUI's cache owns what it loaded: once it drops the handles (/free, cache eviction), the weights go."""
    import gc
    import weakref

    model, vae, _ = load(nodes, "Cosmos3-Edge")
    pipe = weakref.ref(model.pipeline)
    first, _ = sample(nodes, model, text(nodes))
    del model, vae
    gc.collect()
    assert pipe() is None and len(nodes.loader._loaded) == 0
    model, _, _ = load(nodes, "Cosmos3-Edge")  # the next run reloads and gives the same latents
    again, _ = sample(nodes, model, text(nodes))
    assert torch.equal(first["samples"], again["samples"])


def test_offload_mode_moves_to_the_compute_device_only_while_a_node_runs(nodes, monkeypatch):
    """A stand-in compute device distinct from the offload device (CPU): every move is recorded, in order."""
    compute = torch.device("cuda", 3)
    monkeypatch.setattr(nodes.services.memory, "torch_device", lambda: compute)
    model, vae, info = nodes.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "offload")["result"]
    pipe = model.pipeline
    assert "offload" in info and pipe.device.type == "cpu"  # loaded at home, not on the compute device
    events, real_to = [], type(pipe).to

    inside = []

    def recording_to(self, device):
        events.append(("to", torch.device(device)))
        inside.append(True)
        try:
            return real_to(self, "cpu")  # the stand-in device has no memory: stay on the CPU, keep the record
        finally:
            inside.pop()

    real_vae_to = type(pipe.vae).to

    def recording_vae_to(self, device):
        if not inside:  # (the pipeline's own move moves its VAE too)
            events.append(("vae to", torch.device(device)))
        return real_vae_to(self, "cpu")

    monkeypatch.setattr(type(pipe), "to", recording_to)
    monkeypatch.setattr(type(pipe.vae), "to", recording_vae_to)
    pipe.transformer.register_forward_pre_hook(lambda *_: events.append(("forward", events[-1][1])))
    pipe.vae.decoder.register_forward_pre_hook(lambda *_: events.append(("decode", events[-1][1])))
    latent, _ = sample(nodes, model, text(nodes))
    nodes.Cosmos3VAEDecode().decode(vae, latent, False, 32, 8)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "to" and events[0][1] == compute and "forward" in kinds
    assert all(device == compute for kind, device in events if kind in ("forward", "decode"))
    moves = [(kind, device) for kind, device in events if kind in ("to", "vae to")]
    cpu = torch.device("cpu")  # the sampler moves the pipeline, the decode node only the VAE
    assert moves == [("to", compute), ("to", cpu), ("vae to", compute), ("vae to", cpu)]
    assert latent["samples"].device.type == "cpu"


def test_image_and_video_conditioning_nodes(nodes):
    model, _, _ = load(nodes)
    (media,) = nodes.Cosmos3ImageToVideo().condition(torch.rand(2, 40, 40, 3))
    latent, messages = sample(nodes, model, text(nodes), frames=9, media=media)
    assert messages[0].startswith("i2v")
    (media,) = nodes.Cosmos3VideoToVideo().condition(torch.rand(6, 48, 64, 3), "0, 1", "first")
    assert media["condition_frame_indexes"] == (0, 1)
    latent, messages = sample(nodes, model, text(nodes), frames=9, media=media)
    assert messages[0].startswith("v2v")
    with pytest.raises(nodes.vae.InputError, match="latent frame numbers"):
        nodes.Cosmos3VideoToVideo().condition(torch.rand(6, 48, 64, 3), "first two", "first")


def test_a_sampler_run_plans_once_and_logs_each_note_once(nodes, caplog):
    """The node plans the run once (its estimate for ComfyUI's memory manager, then generate runs that plan), so
    each note reaches the log once, not once per planning."""
    import logging

    model, _, _ = load(nodes)
    with caplog.at_level(logging.INFO):
        latent, messages = sample(nodes, model, text(nodes), frames=9, chunk_frames=5)  # Edge at 64x48: a note
    logged = [r.getMessage() for r in caplog.records]
    trained = [m for m in logged if m.startswith("Edge was trained at 256p and 480p; 64x48")]
    chunked = [m for m in logged if m.startswith("long video: 9 frames in 2 chunks")]
    assert len(trained) == 1 and len(chunked) == 1, logged
    assert any(m.startswith("Edge was trained") for m in messages)  # and the node shows it


def test_keyframes_node_reports_the_held_latents_and_sets_the_frame_count(nodes):
    model, _, _ = load(nodes)
    start, end = torch.rand(1, 48, 64, 3), torch.rand(5, 48, 64, 3)
    out = nodes.Cosmos3Keyframes().condition(17, start=start, end=end, middle=torch.rand(1, 48, 64, 3), middle_frames="8")
    (media,) = out["result"]
    assert out["ui"]["text"][0] == "17 frames, 5 latent frames; held: 0, 2, 3, 4"
    assert "a 5-frame clip at frames 12-16: latents 3-4" in out["ui"]["text"]
    latent, messages = sample(nodes, model, text(nodes), frames=0, media=media)  # the sampler takes their count
    assert messages[0].startswith("keyframes") and latent["samples"].shape[2] == 5
    with pytest.raises(nodes.vae.InputError, match="frames is 9 and its keyframes are placed in 17"):
        sample(nodes, model, text(nodes), frames=9, media=media)
    with pytest.raises(nodes.vae.InputError, match="2 image\\(s\\) and middle_frames names 1"):
        nodes.Cosmos3Keyframes().condition(17, middle=torch.rand(2, 48, 64, 3), middle_frames="8")
    assert "1 + 4k" in nodes.Cosmos3Keyframes.VALIDATE_INPUTS(18)


def test_scheduler_node_and_guidance_interval_parsing(nodes):
    model, _, _ = load(nodes)
    schedule, _ = nodes.Cosmos3Scheduler().build("checkpoint", 3, 0.0)
    _, messages = sample(nodes, model, text(nodes), schedule=schedule)
    assert "3 steps (checkpoint)" in messages[1]
    parse = sys.modules[nodes.sampling.Request.__module__].parse_guidance_interval  # the pack's copy of the runtime
    assert parse("auto") == "auto" and parse("off") is None and parse("400, 1000") == (400.0, 1000.0)
    assert parse("960-1001") == (960.0, 1001.0)
    with pytest.raises(nodes.vae.InputError, match="'auto', 'off' or 'LOW,HIGH'"):
        parse("sometimes")


def test_vae_encode_node(nodes):
    _, vae, _ = load(nodes)
    (latent,) = nodes.Cosmos3VAEEncode().encode(vae, torch.rand(7, 48, 64, 3))
    assert latent["samples"].shape == (1, 48, 2, 3, 4)
    with pytest.raises(nodes.vae.InputError, match="not a multiple of 16"):
        nodes.Cosmos3VAEEncode().encode(vae, torch.rand(1, 40, 64, 3))
    with pytest.raises(nodes.vae.InputError, match="expected a Cosmos3 latent"):
        nodes.Cosmos3VAEDecode().decode(vae, {"samples": torch.zeros(1, 4, 8, 8)}, False, 32, 8)


def test_json_caption_node(nodes):
    (prompt,) = nodes.Cosmos3JSONCaption().build("A cat jumps.", "cat, sofa", '{"style": "film"}')
    assert json.loads(prompt) == {"temporal_caption": "A cat jumps.", "subjects": ["cat", "sofa"], "style": "film"}
    with pytest.raises(nodes.prompting.InputError, match="extra_json is not valid JSON"):
        nodes.Cosmos3JSONCaption().build("x", "", "{oops")


def test_default_negative_prompt_node(nodes, models_dir):
    model, _, _ = load(nodes, "Cosmos3-Nano")
    assert nodes.Cosmos3DefaultNegativePrompt().read(model) == ("",)
    assets = models_dir / "Cosmos3-Nano" / "assets"
    assets.mkdir()
    (assets / "negative_prompt.json").write_text('{"negative": "blurry, distorted"}\n')
    assert nodes.Cosmos3DefaultNegativePrompt().read(model) == ('{"negative": "blurry, distorted"}',)


def test_cancel_during_vae_decode_and_encode_nodes(nodes, monkeypatch):
    """Every latent frame of a decode (or encode) is an interrupt point with a progress update."""
    _, vae, _ = load(nodes)
    latent = {"samples": torch.randn(1, 48, 4, 3, 4)}
    checks = []

    class Interrupted(BaseException):  # ComfyUI's interrupt derives from BaseException too
        pass

    def interrupt_on_second(*_):
        checks.append(1)
        if len(checks) == 2:
            raise Interrupted

    monkeypatch.setattr(nodes.services.progress, "check_interrupt", interrupt_on_second)
    with pytest.raises(Interrupted):
        nodes.Cosmos3VAEDecode().decode(vae, latent, False, 32, 8)
    assert len(checks) == 2  # stopped after the second of four latent frames
    checks.clear()
    with pytest.raises(Interrupted):
        nodes.Cosmos3VAEEncode().encode(vae, torch.rand(13, 48, 64, 3))
    monkeypatch.undo()
    images, _ = nodes.Cosmos3VAEDecode().decode(vae, latent, False, 32, 8)  # usable right after
    assert images.shape == (13, 48, 64, 3)


def test_sound_through_the_sampler_and_sound_decode(nodes):
    model, vae, _ = load(nodes, "Cosmos3-Nano")
    latent, report = sample(nodes, model, text(nodes), frames=9, sound=True)
    assert latent["cosmos3"]["sound_latents"].shape[0] == 16 and any(line.startswith("sound:") for line in report)
    (audio,) = nodes.Cosmos3SoundDecode().decode(vae, latent, True)
    assert audio["sample_rate"] == 8000 and audio["waveform"].shape == (1, 2, int(9 / 24 * 8000))
    (full,) = nodes.Cosmos3SoundDecode().decode(vae, latent, False)
    assert full["waveform"].shape[2] == latent["cosmos3"]["sound_latents"].shape[1] * 320
    silent, _ = sample(nodes, model, text(nodes), frames=9)
    with pytest.raises(nodes.vae.InputError, match="carries no sound: turn on 'sound'"):
        nodes.Cosmos3SoundDecode().decode(vae, silent, True)
    edge, _, _ = load(nodes, "Cosmos3-Edge")
    with pytest.raises(nodes.vae.InputError, match="no sound head"):
        sample(nodes, edge, text(nodes), frames=9, sound=True)


def test_audio_through_the_sampler_comes_out_of_sound_decode(nodes):
    model, vae, _ = load(nodes, "Cosmos3-Nano")
    t = torch.arange(48000) / 48000  # ComfyUI's AUDIO as Load Audio gives it: 1 s of a mono 440 Hz tone at 48 kHz
    audio = {"waveform": (0.5 * torch.sin(2 * torch.pi * 440 * t)).view(1, 1, -1), "sample_rate": 48000}
    latent, report = sample(nodes, model, text(nodes), frames=9, audio=audio)
    assert any(line.startswith("audio conditioning: the video follows the soundtrack") for line in report)
    assert any("the soundtrack held" in line for line in report) and latent["cosmos3"]["sound_latents"].shape == (16, 10)
    (sound,) = nodes.Cosmos3SoundDecode().decode(vae, latent, True)
    assert sound["sample_rate"] == 8000 and sound["waveform"].shape == (1, 2, int(9 / 24 * 8000))
    # the soundtrack resampled (48 kHz -> 8 kHz) and made stereo, not a decode: a 440 Hz tone at half scale
    assert torch.equal(sound["waveform"][0, 0], sound["waveform"][0, 1])
    torch.testing.assert_close(sound["waveform"][0, 0, 100:-100], audio["waveform"][0, 0, :18000:6][100:-100],
                               atol=1e-3, rtol=0)
    assert "audio" in nodes.Cosmos3Sampler.INPUT_TYPES()["optional"]
    with pytest.raises(nodes.vae.InputError, match="a batch of 2 soundtracks"):
        sample(nodes, model, text(nodes), frames=9, audio={**audio, "waveform": audio["waveform"].expand(2, 1, -1)})
    chunked, report = sample(nodes, model, text(nodes), frames=9, audio=audio, chunk_frames=5)  # a long video
    assert any(line == "sound: at 8000 Hz, the soundtrack held" for line in report)
    (long,) = nodes.Cosmos3SoundDecode().decode(vae, chunked, True)
    assert torch.equal(long["waveform"], sound["waveform"])  # the same soundtrack, fitted to the same clip


def test_latent_holds_raw_vae_latents_like_comfyui(nodes, models_dir):
    """LATENT = the VAE's posterior mean (core ComfyUI's convention); decoding it gives the frames of before."""
    from conftest import require

    require("diffusers", minversion="0.42.1")
    from diffusers import AutoencoderKLWan

    import cosmos3_runtime

    model, vae, _ = load(nodes, "Cosmos3-Nano")
    images = torch.rand(5, 48, 64, 3, generator=torch.Generator().manual_seed(0))
    (encoded,) = nodes.Cosmos3VAEEncode().encode(vae, images)
    reference = AutoencoderKLWan.from_pretrained(str(models_dir / "Cosmos3-Nano" / "vae"), torch_dtype=torch.float32)
    with torch.no_grad():
        mean = reference.encode(images.permute(3, 0, 1, 2).unsqueeze(0) * 2 - 1).latent_dist.mean
    torch.testing.assert_close(encoded["samples"], mean, atol=1e-5, rtol=0)

    latent, _ = sample(nodes, model, text(nodes), frames=9)
    frames, _ = nodes.Cosmos3VAEDecode().decode(vae, latent, False, 32, 8)
    pipe = cosmos3_runtime.load(models_dir / "Cosmos3-Nano", dtype="fp32")
    direct = pipe.generate("a cat", width=64, height=48, num_frames=9, seed=1, negative_prompt="")
    assert torch.equal(frames, direct.frames)  # same frames as decoding the sampler's own latents
    assert torch.equal(latent["samples"], pipe.raw_latents(direct.latents))
    assert not torch.allclose(latent["samples"], direct.latents)  # raw, not the transformer's normalized space


def test_an_encoded_latent_conditions_the_sampler(nodes):
    """A LATENT from a VAE Encode (ours here; core's Wan 2.2 VAE Encode gives the same layout) as video-to-video."""
    model, vae, _ = load(nodes, "Cosmos3-Nano")
    clip = torch.rand(9, 48, 64, 3, generator=torch.Generator().manual_seed(2))
    (encoded,) = nodes.Cosmos3VAEEncode().encode(vae, clip)
    (media,) = nodes.Cosmos3LatentToVideo().condition(encoded, "0,1", "first")
    from_latents, report = sample(nodes, model, text(nodes), frames=13, media=media)
    (pixels_media,) = nodes.Cosmos3VideoToVideo().condition(clip, "0,1", "first")
    from_pixels, _ = sample(nodes, model, text(nodes), frames=13, media=pixels_media)
    assert report[0].startswith("v2v")
    torch.testing.assert_close(from_latents["samples"], from_pixels["samples"], atol=1e-5, rtol=0)
    small, _ = sample(nodes, model, text(nodes), frames=5)
    (media,) = nodes.Cosmos3LatentToVideo().condition(small, "0,1", "first")
    with pytest.raises(nodes.vae.InputError, match="condition frames \\[0, 1\\] need 2 latent frames"):
        sample(nodes, model, text(nodes), frames=13, media={**media, "condition_latents": small["samples"][:, :, :1]})


def test_action_file_nodes(nodes, tmp_path, monkeypatch):
    import numpy as np

    inputs, outputs = tmp_path / "input", tmp_path / "output"
    inputs.mkdir()
    monkeypatch.setenv("COSMOS3_INPUT_DIR", str(inputs))
    monkeypatch.setenv("COSMOS3_OUTPUT_DIR", str(outputs))
    table = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    (inputs / "moves.json").write_text(json.dumps({"actions": table.tolist()}))
    np.save(inputs / "moves.npy", table)
    np.savetxt(inputs / "moves.csv", table, delimiter=",")
    assert nodes.Cosmos3LoadActions.INPUT_TYPES()["required"]["file"][0] == ["moves.csv", "moves.json", "moves.npy"]
    for name in ("moves.json", "moves.npy", "moves.csv"):
        (loaded,) = nodes.Cosmos3LoadActions().load(name, "pusht")
        assert torch.allclose(loaded["actions"], torch.from_numpy(table)) and loaded["domain"] == "pusht"
    for escaping in ("../secret.json", "/etc/passwd"):
        with pytest.raises(nodes.actions.InputError, match="is refused"):
            nodes.Cosmos3LoadActions().load(escaping, "pusht")
    result = nodes.Cosmos3SaveActions().save(loaded, "robot/run")
    assert "saved run_00001_.json" in result["ui"]["text"][0]
    saved = json.loads((outputs / "robot" / "run_00001_.json").read_text())
    assert saved["domain"] == "pusht" and len(saved["actions"]) == 4
    assert np.allclose(np.load(outputs / "robot" / "run_00001_.npy"), table)
    with pytest.raises(ValueError, match="leaves the output folder"):
        nodes.Cosmos3SaveActions().save(loaded, "../../outside")
    (plot,) = nodes.Cosmos3ActionPlot().plot(loaded)
    assert plot.shape == (1, 450, 800, 3) and plot.std() > 0
    assert nodes.Cosmos3RobotState.VALIDATE_INPUTS("1, 2, 3").startswith("robot state needs 8 numbers")
    (state,) = nodes.Cosmos3RobotState().build("0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 1")
    assert state.shape == (8,)


def test_the_loader_takes_a_gguf_transformer_from_the_diffusion_models_folder(nodes, models_dir):
    loader = nodes.Cosmos3ModelLoader()
    assert "Cosmos3-Nano-Q4_0.gguf" in loader.INPUT_TYPES()["optional"]["transformer_file"][0]
    handle, _, info = loader.load("Cosmos3-Nano", "fp32", "cpu", transformer_file="Cosmos3-Nano-Q4_0.gguf")["result"]
    assert "Cosmos3-Nano-Q4_0.gguf" in info
    assert {getattr(m, "qtype", None) for m in handle.pipeline.transformer.modules()} == {None, "Q4_0"}  # kept quantized
    with pytest.raises(nodes.loader.InputError, match="not a .gguf file in models/diffusion_models"):
        loader.load("Cosmos3-Nano", "fp32", "cpu", transformer_file="../diffusion_models/Cosmos3-Nano-Q4_0.gguf")


GREEDY = {"temperature": 0.0, "top_p": 0.8, "top_k": 20, "presence_penalty": 1.5}


def reason(nodes, model, question="What is this?", sampling=GREEDY, **extra):
    options = dict(system_prompt="", max_new_tokens=6, thinking=False, seed=0, sampling=sampling)
    options.update(extra)
    return nodes.Cosmos3Reason().reason(model, question, **options)


def test_reason_node_streams_into_the_node_and_matches_the_runtime(nodes, monkeypatch):
    model, _, _ = load(nodes, "Cosmos3-Nano")
    shown = []
    monkeypatch.setattr(nodes.services.progress, "progress_text", lambda text, node_id: shown.append((node_id, text)))
    pictures = torch.rand(2, 40, 56, 3)  # a batch: two pictures
    out = reason(nodes, model, image=pictures, node_id="9")
    answer, thinking = out["result"]
    pipe = model.pipeline
    expected = pipe.reason("What is this?", images=list(pictures), max_new_tokens=6, temperature=0.0)
    assert answer == expected.text and thinking == "" and out["ui"]["text"][0] == answer
    assert shown and shown[-1] == ("9", answer)  # the finished answer is the last text shown
    clip = torch.rand(9, 40, 56, 3)
    out = reason(nodes, model, video=clip, video_fps=8.0, sample_fps=4.0, node_id="9")
    assert out["result"][0] == pipe.reason("What is this?", video=clip, video_fps=8.0, sample_fps=4.0,
                                           max_new_tokens=6, temperature=0.0).text
    (custom,) = nodes.Cosmos3ReasonSampling().build(0.9, 0.8, 5, 1.5)
    assert reason(nodes, model, sampling=custom, seed=3)["result"][0] == pipe.reason(
        "What is this?", max_new_tokens=6, temperature=0.9, top_k=5, top_p=0.8, presence_penalty=1.5, seed=3).text
    recommended = reason(nodes, model, sampling=None, seed=3)["result"][0]  # no sampling node: NVIDIA's values
    assert recommended == pipe.reason("What is this?", max_new_tokens=6, seed=3).text
    with pytest.raises(Exception, match="top_p"):
        nodes.Cosmos3ReasonSampling().build(0.9, 0.0, 5, 1.5)


def test_cancel_while_reasoning_then_the_next_question_works(nodes, monkeypatch):
    model, _, _ = load(nodes, "Cosmos3-Nano")

    class Interrupted(BaseException):
        pass

    calls = []

    def interrupt_on_third_token():
        calls.append(1)
        if len(calls) == 3:
            raise Interrupted

    monkeypatch.setattr(nodes.services.progress, "check_interrupt", interrupt_on_third_token)
    with pytest.raises(Interrupted):
        reason(nodes, model)
    monkeypatch.undo()
    assert len(reason(nodes, model)["ui"]["text"]) == 2


def test_upsample_prompt_node_passes_a_caption_to_text_encode(nodes, monkeypatch):
    model, _, _ = load(nodes, "Cosmos3-Nano")
    reply = '```json\n{"scene_imagination": "focus: a cat", "temporal_caption": "0:00 a cat", "duration": "0:02"}\n```'
    answer = type("Answer", (), {"text": reply})
    monkeypatch.setattr(type(model.pipeline.reasoner), "chat", lambda self, messages, images, **options: answer)
    out = nodes.Cosmos3UpsamplePrompt().upsample(model, "a cat", 64, 48, 49, 24.0, 64, 0)
    (caption,) = out["result"]
    assert json.loads(caption)["duration"] == "2s"
    assert out["ui"]["text"][0] == "JSON caption (asked with the pack's own templates)"
    bundle = nodes.Cosmos3TextEncode().encode(caption, "", "auto", True, True, True)["result"][0]
    assert json.loads(bundle["prompt"])["temporal_caption"] == "0:00 a cat"
    with pytest.raises(Exception, match="one starting image"):
        nodes.Cosmos3UpsamplePrompt().upsample(model, "a cat", 0, 0, 0, 0.0, 64, 0, image=torch.rand(2, 32, 32, 3))


def test_reasoner_only_loader_answers_and_refuses_to_generate(nodes):
    full, _, _ = load(nodes, "Cosmos3-Nano")
    expected = reason(nodes, full)["result"]
    model, vae, info = load(nodes, "Cosmos3-Nano", parts="reasoner")
    assert "the Reasoner alone" in info and model.pipeline.vae is None
    assert reason(nodes, model)["result"] == expected
    with pytest.raises(Exception, match="parts"):
        sample(nodes, model, text(nodes))
    with pytest.raises(Exception, match="parts 'reasoner' runs on one GPU"):
        load(nodes, "Cosmos3-Nano", parts="reasoner", gpus=2)
