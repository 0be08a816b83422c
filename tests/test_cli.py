"""The command line: generate (PNG and MP4), demo, info, make-tiny, and its error exit."""

import numpy as np
import pytest
import torch
from conftest import ROOT

import cosmos3_runtime
from cosmos3_runtime.__main__ import build_parser, main


def test_generate_an_image(tiny_gated, tmp_path, capsys):
    out = tmp_path / "cat.png"
    assert main(["generate", "--checkpoint", str(tiny_gated), "--prompt", "a cat", "--frames", "1", "--steps", "2",
                 "--width", "64", "--height", "48", "--output", str(out), "--device", "cpu"]) == 0
    from PIL import Image

    assert Image.open(out).size == (64, 48)
    assert "t2i 64x48, 1 frames" in capsys.readouterr().out


@pytest.mark.slow  # whole CLI runs writing files (one writes an MP4 by default: the stages test)
def test_generate_a_video(tiny_edge, tmp_path):
    av = pytest.importorskip("av")
    out = tmp_path / "clip.mp4"
    assert main(["generate", "--checkpoint", str(tiny_edge), "--prompt", "a cat", "--frames", "9", "--steps", "2",
                 "--width", "64", "--height", "48", "--fps", "16", "--output", str(out), "--tile", "2"]) == 0
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        rate = container.streams.video[0].average_rate
    assert len(frames) == 9 and frames[0].shape == (48, 64, 3) and rate == 16
    assert np.std(frames[0]) > 0


def test_errors_exit_with_a_message(tiny_gated, tmp_path, capsys):
    code = main(["generate", "--checkpoint", str(tiny_gated), "--prompt", "x", "--width", "100",
                 "--output", str(tmp_path / "x.png")])
    assert code == 2 and "multiple of 16" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "missing")]) == 2


def test_demo_info_and_make_tiny(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "t"), "--kind", "edge", "--distilled"]) == 0
    assert main(["info", str(tmp_path / "t")]) == 0
    assert "Edge (dense relu2), distilled 4-step (SDE)" in capsys.readouterr().out
    assert main(["demo", "--checkpoint", str(tmp_path / "t"), "--width", "64", "--height", "48"]) == 0
    assert "one transformer forward" in capsys.readouterr().out


@pytest.fixture(scope="session")
def big_checkpoint(tiny_factory):
    """About 440 MB of fp32 weights: loading them would show in peak memory and time."""
    return tiny_factory(kind="gated", size="small", dtype="float32", overrides={"num_hidden_layers": 18})


USER_ERRORS = [
    (["--guidance-interval", "sometimes"], "--guidance-interval 'sometimes' must be 'auto', 'off' or 'LOW,HIGH'"),
    (["--image", "missing.png"], "image file missing.png does not exist"),
    (["--video", "missing.mp4"], "video file missing.mp4 does not exist"),
    (["--output", "x.gif"], "unsupported output file type '.gif'"),
    (["--output", "/no/such/folder/x.mp4"], "output folder /no/such/folder does not exist"),
    (["--device", "cuda"], "CUDA is not available"),
    (["--width", "100"], "width 100 must be a positive multiple of 16"),
    (["--frames", "0"], "--frames must be at least 1"),
    (["--checkpoint", "no-such-folder"], "no such checkpoint folder"),
    # relative, repo-id shaped: also tried on the Hub (unreachable or unknown), still one line
    (["--checkpoint", "does/not/exist/relative"], "no such checkpoint folder: "),
]


@pytest.mark.slow
def test_user_errors_exit_2_with_one_line_before_any_weight_is_read(big_checkpoint, tmp_path):
    """Each error: status 2, its message on one line, no traceback, and no weight read (memory, time)."""
    script = f"""
import io, json, resource, sys, time, contextlib
sys.path.insert(0, {str(ROOT)!r})
from cosmos3_runtime.__main__ import main
import torch
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
results = []
for extra in {[case for case, _ in USER_ERRORS]!r}:
    flags = {{"--checkpoint": {str(big_checkpoint)!r}, "--prompt": "a cat", "--output": "out.mp4", extra[0]: extra[1]}}
    err = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stderr(err):
        code = main(["generate", *(x for pair in flags.items() for x in pair)])
    results.append((code, err.getvalue(), time.perf_counter() - start))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"results": results, "grown_mib": (peak - baseline) / 1024}}))
"""
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for (code, err, seconds), (case, message) in zip(report["results"], USER_ERRORS):
        lines = err.splitlines()
        assert code == 2 and len(lines) == 1 and message in lines[0] and "Traceback" not in err, (case, err)
        assert seconds < 1.5 or case[1].count("/") > 1, (case, seconds)  # (the Hub is asked: a network round trip)
    hub = report["results"][-1][1]
    assert "also tried as a Hugging Face repo id (repo does/not, subfolder exist/relative): could not read" in hub
    assert report["grown_mib"] < 100, report  # the weights are 440 MB


def test_debug_shows_the_traceback(tiny_gated, tmp_path):
    with pytest.raises(cosmos3_runtime.InputError, match="multiple of 16"):
        main(["generate", "--checkpoint", str(tiny_gated), "--prompt", "x", "--width", "100", "--debug",
              "--output", str(tmp_path / "x.png")])


def test_every_generate_flag_has_help_and_shows_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    text = capsys.readouterr().out
    assert "[default: auto]" in text and "auto: 832 Edge video" in text and "--no-resolution-template" in text
    parser = build_parser()
    generate = parser._subparsers._group_actions[0].choices["generate"]
    for action in generate._actions:
        assert action.help, action.dest


ACTION_FLAGS = ("action_mode", "domain", "chunk_size", "resolution_tier", "view_point", "preset", "actions", "state",
                "action_stats")  # the ActionRequest's own fields, given to generate as one `action` option


def test_request_is_the_only_definition_of_the_options():
    """The CLI flags, the sampler widgets and the worker pool all come from (or check against) Request."""
    import inspect
    from dataclasses import fields

    from cosmos3_runtime import Cosmos3Pipeline, WorkerPool
    from cosmos3_runtime.request import OPTION_NAMES, Request

    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    cli = {a.dest for a in generate._actions} - {"help", "checkpoint", "kind", "prompt", "output", "sound_output", "sp",
                                                  "cfg_parallel", "device", "dtype", "debug", "offload_text", "blocks_to_swap",
                                                  "quantize", "transformer_file", "vae_dtype", "guardrails",
                                                  "guardrails_device", "guardrails_fail_open", *ACTION_FLAGS}
    assert cli == {f.name for f in fields(Request) if f.metadata["cli"]}
    for method in (Cosmos3Pipeline.generate, WorkerPool.generate):
        assert not set(inspect.signature(method).parameters) & OPTION_NAMES  # options only through **options


def test_info_reads_config_files_only(tiny_gated, tmp_path, capsys):
    import shutil

    folder = shutil.copytree(tiny_gated, tmp_path / "ckpt")
    for shard in (folder / "transformer").glob("*.safetensors"):
        shard.unlink()
    assert main(["info", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "gated (SwiGLU), multi-step" in out and "parameters:" in out and "text tower" in out
    assert "bf16" in out and "weight file(s) missing" in out


@pytest.mark.slow
def test_generate_with_sound_writes_an_audio_track_and_a_wav(tiny_factory, tmp_path, capsys):
    import wave

    av = pytest.importorskip("av")
    nano = tiny_factory(kind="gated", sound=True)
    out, wav = tmp_path / "rain.mp4", tmp_path / "rain.wav"
    assert main(["generate", "--checkpoint", str(nano), "--prompt", "rain on a roof", "--frames", "25", "--fps", "24",
                 "--width", "64", "--height", "48", "--steps", "2", "--sound", "--output", str(out),
                 "--sound-output", str(wav)]) == 0
    with av.open(str(out)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(audio=0))
        rate = stream.rate
    expected = 25 / 24  # seconds; AAC adds a priming frame and pads the last one (1024 samples each)
    assert stream.codec_context.name == "aac" and 0 <= samples / rate - expected <= 2 * 1024 / rate
    with wave.open(str(wav)) as f:
        assert (f.getnchannels(), f.getframerate(), f.getnframes()) == (2, 8000, int(25 / 24 * 8000))
    assert main(["generate", "--checkpoint", str(nano), "--prompt", "x", "--sound-output", str(wav),
                 "--output", str(out)]) == 2
    assert "--sound-output needs --sound" in capsys.readouterr().err


def test_generate_with_audio_holds_the_soundtrack_and_writes_it(tiny_factory, tmp_path, capsys, caplog, monkeypatch):
    import wave

    av = pytest.importorskip("av")
    from cosmos3_runtime.media import read_audio, save_wav

    nano = tiny_factory(kind="gated", sound=True)
    t = torch.arange(8000) / 16000
    save_wav(torch.sin(2 * torch.pi * 440 * t).unsqueeze(0) * 0.5, tmp_path / "in.wav", 16000)  # 0.5 s, mono
    out, wav = tmp_path / "drums.mp4", tmp_path / "drums.wav"
    assert main(["generate", "--checkpoint", str(nano), "--prompt", "a drummer", "--frames", "25", "--fps", "24",
                 "--width", "64", "--height", "48", "--steps", "2", "--audio", str(tmp_path / "in.wav"),
                 "--output", str(out), "--sound-output", str(wav)]) == 0
    assert "padded with silence to the video's 1.04 s" in caplog.text
    with av.open(str(out)) as container:
        assert container.streams.audio[0].codec_context.name == "aac"
    written, _ = read_audio(wav)
    with wave.open(str(wav)) as f:
        assert (f.getnchannels(), f.getframerate(), f.getnframes()) == (2, 8000, int(25 / 24 * 8000))
    assert written[:, :3990].abs().max() > 0.4 and not written[:, 4010:].any()  # 0.5 s, then silence
    _no_weight_is_read(monkeypatch)
    decoder_only = tiny_factory(kind="gated", sound=True, sound_encoder=False)
    assert main(["generate", "--checkpoint", str(decoder_only), "--prompt", "x", "--audio", str(tmp_path / "in.wav"),
                 "--output", str(out)]) == 2
    assert "has no encoder.* weights" in capsys.readouterr().err
    assert main(["generate", "--checkpoint", str(nano), "--prompt", "x", "--audio", str(tmp_path / "none.wav"),
                 "--output", str(out)]) == 2
    assert "audio file" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_actions_writes_them_next_to_the_video(tiny_factory, tmp_path, capsys):
    import json

    checkpoint = tiny_factory(kind="edge", action=True)
    image = tmp_path / "observation.png"
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (120, 160, 3), dtype=np.uint8)).save(image)
    out = tmp_path / "policy.mp4"
    assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", "Pick up the cube", "--image", str(image),
                 "--action-mode", "policy", "--chunk-size", "4", "--resolution-tier", "256", "--steps", "2",
                 "--output", str(out)]) == 0
    saved = json.loads((tmp_path / "policy.actions.json").read_text())
    assert saved["preset"] == "framework" and saved["units"] == "normalized" and len(saved["actions"]) == 4
    assert np.load(tmp_path / "policy.actions.npy").shape == (4, 10)
    forward = tmp_path / "moves.json"
    forward.write_text(json.dumps([[0.1] * 10, [0.2] * 10]))
    assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", "Push", "--image", str(image),
                 "--action-mode", "forward_dynamics", "--actions", str(forward), "--chunk-size", "4",
                 "--resolution-tier", "256", "--steps", "1", "--output", str(tmp_path / "rollout.mp4")]) == 0
    assert not (tmp_path / "rollout.actions.json").exists()  # forward dynamics predicts no actions
    assert main(["generate", "--checkpoint", str(checkpoint), "--prompt", "x", "--image", str(image),
                 "--action-mode", "inverse_dynamics", "--output", str(out)]) == 2
    assert "inverse_dynamics needs a video" in capsys.readouterr().err


@pytest.mark.slow
def test_transfer_writes_a_clip_as_long_as_its_controls(tiny_factory, tmp_path, capsys):
    av = pytest.importorskip("av")
    import torch

    from cosmos3_runtime.media import save_video

    source = save_video(torch.rand(9, 40, 56, 3), tmp_path / "source.mp4", 16.0)
    out = tmp_path / "transfer.mp4"
    assert main(["generate", "--checkpoint", str(tiny_factory(kind="gated")), "--prompt", "a red ball rolls",
                 "--control", f"edge:medium={source}", "--control", f"depth={source}", "--width", "64", "--height",
                 "48", "--steps", "1", "--chunk-frames", "5", "--output", str(out)]) == 0
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        rate = container.streams.video[0].average_rate
    assert len(frames) == 9 and frames[0].shape == (48, 64, 3)
    assert rate == 16  # the source's timing, not the authors' 30 (which is --fps 30)
    printed = capsys.readouterr().out
    assert "transfer 64x48, 9 frames @ 16 fps" in printed and "(edge, depth), 2 chunks of 5 frames" in printed
    assert "chunk 2/2" in printed and "VAE decode, latent frame 2/2" in printed  # progress of every stage


@pytest.mark.parametrize("kind, flags, words", [
    ("edge", [], "Edge is refused, as SGLang refuses it"),
    ("gated", ["--width", "1280", "--height", "720"], "this request needs at least"),
    ("gated", ["--control", "sky=x.mp4"], "unknown control hint(s) 'sky'"),
    ("gated", ["--control", "edge"], "--control 'edge' must be HINT=FILE or HINT:PRESET=FILE"),
    ("gated", ["--control", "depth:medium=SOURCE"], "only edge and blur controls can be derived"),
])
def test_transfer_mistakes_are_refused_before_any_weight_is_read(tiny_factory, tmp_path, capsys, monkeypatch, kind,
                                                                  flags, words):
    """The checkpoints have no transformer weights at all: a refusal that comes first needed none."""
    import shutil

    import torch

    from cosmos3_runtime import budget
    from cosmos3_runtime.media import save_video

    folder = shutil.copytree(tiny_factory(kind=kind), tmp_path / "ckpt")
    for shard in (folder / "transformer").glob("*.safetensors"):
        shard.unlink()
    monkeypatch.setattr(budget, "available_bytes", lambda device: 2**20)  # 1 MiB free
    source = save_video(torch.rand(5, 16, 16, 3), tmp_path / "source.mp4", 16.0)
    flags = [str(source) if f == "SOURCE" else f.replace("SOURCE", str(source)) for f in flags]
    controls = [] if any(f == "--control" for f in flags) else ["--control", f"edge={source}"]
    code = main(["generate", "--checkpoint", str(folder), "--prompt", "x", *controls, *flags, "--output",
                 str(tmp_path / "x.mp4")])
    assert code == 2 and words in capsys.readouterr().err


REFUSED_VALUES = [  # each refused value's message names the flag that was used, not the Python argument
    (["--frames", "0"], "--frames must be at least 1"),
    (["--guidance-interval", "sometimes"], "--guidance-interval 'sometimes'"),
    (["--condition-frames", "x"], "--condition-frames 'x' must be latent frame numbers"),
    (["--control-guidance", "2"], "--control-guidance is a transfer option"),
    (["--width", "4096", "--height", "4096"], "decode tiled (--tile), or shorten the prompt (--no-check-memory skips"),
    (["--max-prompt-tokens", "3"], "more than --max-prompt-tokens 3"),
]


@pytest.mark.parametrize("flags, words", REFUSED_VALUES, ids=[case[0][0] for case in REFUSED_VALUES])
def test_errors_name_the_flags_of_the_command_line(tiny_gated, tmp_path, capsys, flags, words):
    code = main(["generate", "--checkpoint", str(tiny_gated), "--prompt", "a cat", "--device", "cpu", *flags,
                 "--output", str(tmp_path / "x.mp4")])
    err = capsys.readouterr().err
    assert code == 2 and words in err, err


@pytest.mark.parametrize("argv, words", [
    (["reason", "--prompt", "what?", "--video-fps", "4"], "unrecognized arguments: --video-fps 4; see python -m "
                                                          "cosmos3_runtime reason --help"),
    (["generate", "--prompt", "a cat", "--output", "x.mp4", "--framez", "5"], "(did you mean --frames?); see"),
    (["generate", "--prompt", "a cat", "--output", "x.mp4", "--schedule", "karras"],
     "argument --schedule: invalid choice: 'karras' (choose from 'auto', 'unipc', 'checkpoint', 'distilled'); see "
     "python -m cosmos3_runtime generate --help"),
    (["generate", "--prompt", "a cat"], "the following arguments are required: --output; see"),
])
def test_a_mistake_in_the_flags_is_one_line_that_says_where_help_is(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and words in err, err


def test_audio_on_the_default_tiny_checkpoint_and_refusals_of_audio_and_sound(tmp_path, capsys):
    from cosmos3_runtime.media import save_wav

    save_wav(torch.rand(1, 4000) - 0.5, tmp_path / "in.wav", 8000)
    flags = ["--prompt", "a drummer", "--frames", "9", "--width", "64", "--height", "48", "--steps", "1", "--output",
             str(tmp_path / "out.mp4")]
    assert main(["generate", "--audio", str(tmp_path / "in.wav"), *flags]) == 0  # a gated tiny with a sound head
    assert main(["generate", "--audio", str(tmp_path / "in.wav"), "--sound", *flags]) == 2
    assert "audio (a soundtrack the video follows, which is then its sound) does not combine with sound" in \
        capsys.readouterr().err
    save_wav(torch.rand(1, 3) - 0.5, tmp_path / "1hz.wav", 1)  # 3 samples, taken as 3 s before
    assert main(["generate", "--audio", str(tmp_path / "1hz.wav"), *flags]) == 2
    assert "sample rate 1 Hz is outside what audio is sampled at (8000 to 768000 Hz)" in capsys.readouterr().err


def test_the_fps_help_gives_each_default():
    from cosmos3_runtime.request import help_of

    assert "auto: 24; 30 for causal checkpoints and transfers" in help_of("fps")


def test_sim_bimanual_without_actions_is_refused_before_any_weight_is_read(tiny_factory, tmp_path, capsys,
                                                                          monkeypatch):
    from cosmos3_runtime.tiny import sim_bimanual_block

    from PIL import Image

    root = tiny_factory(kind="gated", distilled=True, action=True, causal=sim_bimanual_block())
    Image.new("RGB", (64, 48)).save(tmp_path / "first.png")
    _no_weight_is_read(monkeypatch)
    assert main(["generate", "--checkpoint", str(root), "--prompt", "a robot", "--action-mode", "forward_dynamics",
                 "--image", str(tmp_path / "first.png"), "--domain", "agibotworld", "--output",
                 str(tmp_path / "robot.mp4")]) == 2
    err = capsys.readouterr().err
    assert "needs the actions to roll out, a table [N, 29] for agibotworld" in err and "CLI --actions FILE" in err


def test_actions_come_from_the_tables_the_load_actions_node_reads(tmp_path):
    from cosmos3_runtime.media import read_array

    example = read_array(str(ROOT / "workflows" / "agibot_actions.csv"), "actions")
    assert example.shape == (32, 29) and example.dtype == torch.float32
    np.save(tmp_path / "a.npy", example.numpy())
    (tmp_path / "a.json").write_text(f'{{"actions": {example.tolist()}}}')
    for name in ("a.npy", "a.json"):
        torch.testing.assert_close(read_array(str(tmp_path / name), "actions"), example)
    with pytest.raises(cosmos3_runtime.InputError, match="is neither a table file .* nor comma-separated numbers"):
        read_array("moves.txt", "actions")


def test_a_cpu_run_says_how_long_it_takes_and_shows_every_stage(tiny_edge, tmp_path, capsys):
    assert main(["generate", "--checkpoint", str(tiny_edge), "--prompt", "a cat", "--frames", "9", "--steps", "2",
                 "--width", "64", "--height", "48", "--device", "cpu", "--output", str(tmp_path / "x.mp4")]) == 0
    out = capsys.readouterr().out
    assert "on the CPU this takes about" in out and "4 transformer forwards of" in out and "VAE decode" in out
    for line in ("text tower, prompt 2/2", "step 2/2", "VAE decode, latent frame 3/3", "SeaCache: 4 forwards run"):
        assert line in out, out


def _no_weight_is_read(monkeypatch):
    from cosmos3_runtime.weights import files, gguf

    monkeypatch.setattr(files, "_tensors", lambda *a: pytest.fail("a weight was read before the refusal"))
    monkeypatch.setattr(gguf, "load_gguf_weights", lambda *a, **k: pytest.fail("a GGUF weight was read"))


def test_quantize_with_a_gguf_file_is_refused_from_its_header_before_planning(tiny_factory, tiny_gguf, tmp_path,
                                                                              capsys, monkeypatch):
    _no_weight_is_read(monkeypatch)
    code = main(["generate", "--checkpoint", str(tiny_factory(kind="gated", sound=True)), "--prompt", "a cat",
                 "--transformer-file", str(tiny_gguf), "--quantize", "fp8", "--output", str(tmp_path / "x.mp4")])
    out, err = capsys.readouterr()
    assert code == 2 and f"quantize='fp8' cannot apply to {tiny_gguf.name}: a GGUF file is already quantized" in err
    assert "on the CPU this takes" not in out  # refused before the request is planned and timed


def test_reasoning_on_a_one_frame_video_is_refused_before_loading(tiny_gated, tmp_path, capsys, monkeypatch):
    pytest.importorskip("av")
    from cosmos3_runtime.media import save

    clip = tmp_path / "one.mp4"
    save(torch.rand(1, 32, 32, 3), clip, 24.0)
    _no_weight_is_read(monkeypatch)
    code = main(["reason", "--checkpoint", str(tiny_gated), "--prompt", "what happens?", "--video", str(clip)])
    assert code == 2 and "a video needs at least 2 frames after sampling, got 1" in capsys.readouterr().err
