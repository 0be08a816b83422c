"""Against a real ComfyUI server (tier 3): skipped unless COMFYUI_DIR points at a ComfyUI checkout.

COMFYUI_PYTHON is the interpreter that runs it (default: this one; it needs ComfyUI's requirements).
The server starts on a free loopback port with a throw-away base directory: the pack linked into its
custom_nodes/, tiny checkpoints under the names the workflows use in models/cosmos3/, and
input/example.png and example.wav. Every API workflow is queued over HTTP at toy sizes and must succeed;
queue-time validation must reject bad values with ComfyUI's own error.

With PLAYWRIGHT_CORE (the folder of an installed playwright-core package) and a Chromium on PATH,
the front end is checked too (tests/frontend_check.cjs): each UI workflow opens without errors, and
the front end's own graphToPrompt turns it into exactly its API twin; a workflow naming a missing
checkpoint shows the download notice. Screenshots go to COSMOS3_SCREENSHOTS if set.
"""

import base64
import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import ROOT
from cosmos3_runtime.media import read_audio, save_wav
from cosmos3_runtime.tiny import sim_bimanual_block, sim_transfer_block
from comfy_harness import CORE_NODES
from test_workflows import API, CORE, GUARDED, UI, small, with_defaults
import guardrail_stand_ins as stand_ins

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = [pytest.mark.skipif(not COMFYUI_DIR, reason="set COMFYUI_DIR to a ComfyUI checkout to run these"),
              pytest.mark.slow]

CHECKPOINTS = {  # model folder names the shipped workflows use
    "Cosmos3-Edge": dict(kind="edge"),
    "Cosmos3-Nano": dict(kind="gated", sound=True),
    "Cosmos3-Super-Text2Image-4Step": dict(kind="gated", distilled=True),
    "Cosmos3-Super-Image2Video-4Step": dict(kind="gated", distilled=True),
    "nvidia/Cosmos3-Edge-Policy-DROID": dict(kind="edge", action=True),
    "Cosmos3-Nano-Sim-Transfer": dict(kind="gated", distilled=True, causal=sim_transfer_block()),
    "Cosmos3-Nano-Sim-Transfer-framewise": dict(kind="gated", distilled=True,
                                                causal=sim_transfer_block(1, window_frames=4, sink_frames=1)),
    # a window of 8 latent frames: a session slides its history from its third tick
    "Cosmos3-Nano-Sim-Bimanual": dict(kind="gated", distilled=True, action=True, causal=sim_bimanual_block(8)),
    # big enough that /free is measurable: 185M parameters, 740 MB in fp32 (what a CPU server loads)
    "Cosmos3-Edge-Large": dict(kind="edge", size="small", overrides={
        "hidden_size": 1024, "num_hidden_layers": 8, "intermediate_size": 4096, "num_attention_heads": 8,
        "num_key_value_heads": 4, "head_dim": 128, "rope_axes_dim": [24, 20, 20]}),
}


UPLOAD_LIMIT_MB = 1  # the action endpoint's upload limit in this server (default 64)
MAX_CONNECTIONS = 3  # websocket connections it serves at once (default 8)


def _guardrail_stand_ins(base: Path) -> None:
    """The guardrail package's models and files stood in for in the server (tests/guardrail_stand_ins.py): a custom
    node that installs the stand-ins when ComfyUI imports it, and a Hugging Face cache of the tests' own."""
    stand_ins.hf_cache(base / "hub")
    node = base / "custom_nodes" / "cosmos3_guardrail_stand_ins"
    node.mkdir(parents=True)
    (node / "__init__.py").write_text(f"""import sys, types
sys.path.insert(0, {str(ROOT / "tests")!r})
import guardrail_stand_ins
patch = types.SimpleNamespace(setattr=setattr, setitem=lambda mapping, key, value: mapping.__setitem__(key, value))
guardrail_stand_ins.stub_torchvision(patch)
try:
    import cosmos_guardrail.cosmos_guardrail as checker
    guardrail_stand_ins.install(checker, patch)
except ImportError:  # the package is not installed in ComfyUI's Python: the guarded workflow is skipped
    pass
NODE_CLASS_MAPPINGS = {{}}
""")


def _has_guardrail_package() -> bool:
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    return subprocess.run([python, "-c", "import cosmos_guardrail"], capture_output=True).returncode == 0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(url: str, body: dict | None = None, timeout: float = 30, data: bytes | None = None, content_type=None):
    if body is not None:
        data, content_type = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(url, data, {"Content-Type": content_type} if content_type else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@contextlib.contextmanager
def comfyui_server(base: Path, checkpoints: dict, tiny_factory, env: dict | None = None):
    """A real ComfyUI server on a free loopback port with `base` as its base directory: the pack linked into
    custom_nodes/, `checkpoints` ({folder name: make_tiny_checkpoint options}) in models/cosmos3/, an
    input/example.png and example.wav. Yields its URL; `base / "server.log"` is its log."""
    (base / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (base / "custom_nodes" / "cosmos3").symlink_to(ROOT, target_is_directory=True)
    for name, options in checkpoints.items():
        shutil.copytree(tiny_factory(**options), base / "models" / "cosmos3" / name)
    (base / "input").mkdir()
    pixels = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(base / "input" / "example.png")
    shutil.copy(ROOT / "workflows" / "agibot_actions.csv", base / "input")  # the Sim-Bimanual workflow's
    tone = torch.sin(2 * torch.pi * 220 * torch.arange(44100) / 44100)  # the audio workflow's: 1 s, mono 44.1 kHz
    save_wav(0.5 * tone.unsqueeze(0), base / "input" / "example.wav", 44100)
    _guardrail_stand_ins(base)
    port = _port()
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    log = open(base / "server.log", "w")
    process = subprocess.Popen([python, "main.py", "--cpu", "--disable-api-nodes", "--listen", "127.0.0.1",
                                "--port", str(port), "--base-directory", str(base)],
                               cwd=COMFYUI_DIR, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "COSMOS3_API_MAX_UPLOAD_MB": str(UPLOAD_LIMIT_MB),
                                    "COSMOS3_API_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
                                "HF_HUB_CACHE": str(base / "hub"), **(env or {})})
    url = f"http://127.0.0.1:{port}"
    (base / "server.pid").write_text(str(process.pid))
    deadline = time.monotonic() + 120
    while True:
        try:
            if _call(f"{url}/object_info/Cosmos3Sampler", timeout=5)[0] == 200:
                break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"ComfyUI did not start: {(base / 'server.log').read_text()[-3000:]}")
        time.sleep(1)
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_factory, tiny_gguf):
    base = tmp_path_factory.mktemp("comfyui-base")
    _write_loras(base / "models" / "loras", tiny_factory(**CHECKPOINTS["Cosmos3-Edge"]) / "transformer")
    (base / "models" / "diffusion_models").mkdir()
    shutil.copy(tiny_gguf, base / "models" / "diffusion_models" / tiny_gguf.name)
    for layout, name in FP8_LAYOUTS.items():
        _official_fp8(tiny_factory(**CHECKPOINTS["Cosmos3-Nano"]), base / "models" / "cosmos3" / name, layout)
    with comfyui_server(base, CHECKPOINTS, tiny_factory) as url:
        yield url, base


FP8_LAYOUTS = {"saved": "Cosmos3-Nano-FP8", "unified": "Cosmos3-Nano-FP8-Unified"}  # ModelOpt's two layouts


def _official_fp8(source: Path, target: Path, layout: str) -> None:
    """`source` in NVIDIA's official FP8 `layout` at `target`, written by nvidia-modelopt (tests/modelopt_files.py)
    in the reference Python (REFERENCE_PYTHON, default this one: it needs diffusers and nvidia-modelopt); the reason
    in `target`.failed when it cannot be made there."""
    code = ("import sys; from pathlib import Path; sys.path.insert(0, 'tests'); from modelopt_files import make_fp8; "
            "make_fp8(Path(sys.argv[1]), Path(sys.argv[2]), layout=sys.argv[3])")
    python = os.environ.get("REFERENCE_PYTHON", sys.executable)
    done = subprocess.run([python, "-c", code, str(source), str(target), layout], cwd=ROOT, capture_output=True,
                          text=True)
    if done.returncode:
        shutil.rmtree(target, ignore_errors=True)
        target.with_suffix(".failed").write_text(done.stderr[-2000:])


def _write_loras(folder: Path, transformer: Path) -> None:
    """A LoRA for the tiny Edge checkpoint (diffusers' transformer.* keys) and one whose keys are Flux's."""
    from safetensors.torch import save_file

    from cosmos3_runtime.weights.files import read_headers

    folder.mkdir(parents=True)
    out_features, in_features = read_headers(transformer)[0]["layers.0.self_attn.add_q_proj.weight"]["shape"]
    module = "transformer.layers.0.self_attn.add_q_proj"
    save_file({f"{module}.lora_A.weight": torch.randn(4, in_features), f"{module}.lora_B.weight": torch.randn(out_features, 4)},
              str(folder / "cosmos3_edge_test.safetensors"))
    save_file({"double_blocks.0.img_attn.qkv.lora_A.weight": torch.zeros(4, 8),
               "double_blocks.0.img_attn.qkv.lora_B.weight": torch.zeros(8, 4)}, str(folder / "flux_style.safetensors"))


def _run(url: str, prompt: dict, timeout: float = 300) -> dict:
    status, reply = _call(f"{url}/prompt", {"prompt": prompt})
    assert status == 200, reply
    prompt_id = reply["prompt_id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, history = _call(f"{url}/history/{prompt_id}")
        if history and prompt_id in history and history[prompt_id]["status"].get("completed") is not None:
            return history[prompt_id]
        time.sleep(0.5)
    pytest.fail(f"prompt {prompt_id} did not finish in {timeout} s")


def _outcome(history: dict) -> tuple[str, list[str]]:
    """A finished prompt's status and the messages of its execution errors."""
    messages = history["status"]["messages"]
    return history["status"]["status_str"], [data.get("exception_message") for event, data in messages
                                             if event == "execution_error"]


def test_the_pack_loads_without_import_errors(server):
    url, base = server
    log = (base / "server.log").read_text()
    assert "IMPORT FAILED" not in "\n".join(line for line in log.splitlines() if "cosmos3" in line), log[-3000:]
    _, info = _call(f"{url}/object_info/Cosmos3ModelLoader")
    assert set(CHECKPOINTS) <= set(info["Cosmos3ModelLoader"]["input"]["required"]["model_name"][0])


@pytest.mark.parametrize("path", API, ids=lambda p: p.stem)
def test_every_api_workflow_runs_in_the_server(server, path):
    url, base = server
    if path in GUARDED and not _has_guardrail_package():
        pytest.skip("cosmos-guardrail is not installed in ComfyUI's Python (pip install --no-deps -r "
                    "requirements-guardrails-test.txt there)")
    prompt = small(json.loads(path.read_text()))
    for node in prompt.values():
        if node["class_type"] == "SaveVideo":
            node["inputs"]["filename_prefix"] = f"test/{path.stem}"
    history = _run(url, prompt)
    status, errors = _outcome(history)
    assert status == "success", errors
    if path in CORE:  # ComfyUI sampled: the saved image or video is the result
        assert any(output.get("images") for output in history["outputs"].values()), history["outputs"]
        return
    reports = [text for output in history["outputs"].values() for text in output.get("text", [])]
    modes = ("t2i", "t2v", "i2v", "v2v", "keyframes", "policy", "forward_dynamics", "inverse_dynamics", "transfer",
             "Sim-Transfer", "causal actions")
    assert any(line.startswith(modes) for line in reports) or path.stem.endswith("_reason_image"), reports
    if path.stem == "cosmos3_nano_audio_i2v":  # Save Video muxed the soundtrack the run held: example.wav's tone
        (saved,) = [i for out in history["outputs"].values() for i in out.get("images", [])]
        waveform, rate = read_audio(base / "output" / saved["subfolder"] / saved["filename"])
        assert waveform.shape[0] == 2 and 0 <= waveform.shape[1] / rate - 13 / 24 <= 2 * 1024 / rate  # AAC padding
        assert waveform.abs().max() > 0.4
    for node_id, node in prompt.items():
        if node["class_type"] == "Cosmos3Reason":  # the answer in the node, and in the text preview after it
            answer, count = history["outputs"][node_id]["text"]
            assert "8 tokens" in count
            preview = next(n for n, v in prompt.items() if v["class_type"] == "PreviewAny")
            assert history["outputs"][preview]["text"] == [answer]


@pytest.mark.parametrize("layout", FP8_LAYOUTS)
@pytest.mark.parametrize("workflow", ["cosmos3_nano_t2v", "cosmos3_nano_i2v_core"])
def test_nano_workflows_run_on_an_official_fp8_checkpoint(server, workflow, layout):
    """Nano text-to-video (the pack's sampler) and image-to-video (ComfyUI's sampler on the core MODEL, which finds
    each step in its sigmas) on a tiny checkpoint in NVIDIA's official FP8 layouts (ModelOpt's own files, saved and
    unified export): the loader reports the FP8 policy and 8 steps run through both precisions (W8A16 first and last
    3, W8A8 between)."""
    url, base = server
    name = FP8_LAYOUTS[layout]
    failed = base / "models" / "cosmos3" / f"{name}.failed"
    if failed.exists():
        pytest.skip(f"the FP8 checkpoint could not be written (set REFERENCE_PYTHON to a Python with diffusers and "
                    f"nvidia-modelopt): {failed.read_text()[-300:]}")
    prompt = small(json.loads((ROOT / "workflows" / "api" / f"{workflow}.json").read_text()))
    for node in prompt.values():
        if node["class_type"] == "Cosmos3ModelLoader":
            node["inputs"]["model_name"] = name
        if node["class_type"] == "Cosmos3Scheduler":
            node["inputs"]["steps"] = 8
        if node["class_type"] == "SaveVideo":
            node["inputs"]["filename_prefix"] = f"test/{workflow}_{layout}_fp8"
    history = _run(url, prompt)
    status, errors = _outcome(history)
    assert status == "success", errors
    # the loader's report (in the log: ComfyUI reuses a loaded model without running the loader node again)
    assert f"{name}: gated (SwiGLU), multi-step, sound head, ModelOpt FP8 (W8A16 on the first 3 and last 3 " \
        "steps, W8A8 between" in (base / "server.log").read_text()


def _refused_then_runs(url: str, workflow: str, node: str, name: str, bad, good, message: str) -> None:
    """The workflow with `bad` in one input is refused naming `message`; with `good` the same server runs it."""
    prompt = small(json.loads((ROOT / "workflows" / "api" / f"{workflow}.json").read_text()))
    prompt[node]["inputs"][name] = bad
    status, errors = _outcome(_run(url, prompt))
    assert status == "error" and message in errors[0], errors
    prompt[node]["inputs"][name] = good
    assert _run(url, prompt)["status"]["status_str"] == "success"


def test_a_refused_question_leaves_the_server_working(server):
    url, _ = server
    _refused_then_runs(url, "cosmos3_nano_reason_image", "9", "question", "What is <|image_pad|> this?",
                       "What is this?", "special token")


def test_a_prompt_the_guardrail_blocks_stops_the_run_naming_the_check(server):
    """What a user sees: the sampler's error names the check that blocked the prompt, never the words; nothing is
    saved; the same graph with another prompt runs."""
    url, _ = server
    if not _has_guardrail_package():
        pytest.skip("cosmos-guardrail is not installed in ComfyUI's Python")
    word = stand_ins.WORDS["custom"][0]
    _refused_then_runs(url, "cosmos3_edge_t2v_guardrail", "3", "prompt", f"A {word} crosses a busy plaza.",
                       "A violinist plays in a busy plaza.", "the prompt was blocked by the guardrail's keyword blocklist")
    prompt = small(json.loads((ROOT / "workflows" / "api" / "cosmos3_edge_t2v_guardrail.json").read_text()))
    prompt["3"]["inputs"]["prompt"] = f"A {word} crosses a busy plaza."
    history = _run(url, prompt)
    _, errors = _outcome(history)
    assert word not in errors[0] and not any(out.get("images") for out in history["outputs"].values()), errors
    print(f"\nwhat the user sees: {errors[0]}")


def test_a_transfer_the_checkpoint_refuses_leaves_the_server_working(server):
    """Transfer on Edge is refused by name (the pack writes the example clips into the input folder at startup)."""
    url, base = server
    assert all((base / "input" / name).is_file() for name in ("cosmos3_transfer_scene.mp4",
                                                              "cosmos3_transfer_scene_depth.mp4"))
    _refused_then_runs(url, "cosmos3_nano_transfer_edge", "1", "model_name", "Cosmos3-Edge", "Cosmos3-Nano",
                       "Edge is refused")


def test_a_lora_on_the_core_model_and_a_lora_for_another_model(server):
    url, _ = server
    prompt = small(json.loads((ROOT / "workflows" / "api" / "cosmos3_edge_t2v_core.json").read_text()))
    prompt["30"] = {"class_type": "Cosmos3LoraLoader", "inputs": {"model": ["2", 0], "strength": 0.8,
                                                                 "lora_name": "cosmos3_edge_test.safetensors"}}
    prompt["6"]["inputs"]["model"] = ["30", 0]
    history = _run(url, prompt)
    assert history["status"]["status_str"] == "success", history["status"]
    assert history["outputs"]["30"]["text"] == ["cosmos3_edge_test.safetensors: 1 modules patched at strength 0.8"]
    prompt["30"]["inputs"]["lora_name"] = "flux_style.safetensors"
    history = _run(url, prompt)
    errors = [data.get("exception_message", "") for event, data in history["status"]["messages"] if event == "execution_error"]
    assert history["status"]["status_str"] == "error" and "looks like a LoRA for Flux" in errors[0], errors
    prompt["30"]["inputs"].update(lora_name="../../secret.safetensors")
    status, reply = _call(f"{url}/prompt", {"prompt": prompt})
    assert status == 400 and reply["node_errors"]["30"]["errors"][0]["type"] == "value_not_in_list", reply
    prompt["6"]["inputs"]["model"] = ["2", 0]  # and without the LoRA the next run works
    assert _run(url, prompt)["status"]["status_str"] == "success"


def test_queue_time_validation_rejects_a_bad_size(server):
    url, _ = server
    prompt = small(json.loads((ROOT / "workflows" / "api" / "cosmos3_edge_t2v.json").read_text()))
    prompt["4"]["inputs"]["width"] = 100
    status, reply = _call(f"{url}/prompt", {"prompt": prompt})
    assert status == 400
    errors = reply["node_errors"]["4"]["errors"]
    assert errors[0]["type"] == "custom_validation_failed" and "multiple of 16" in errors[0]["details"], errors


def test_the_front_end_opens_and_converts_every_ui_workflow(server, tmp_path, pack):
    modules, chromium = os.environ.get("PLAYWRIGHT_CORE"), shutil.which("chromium") or shutil.which("chromium-browser")
    if not modules or not chromium or not shutil.which("node"):
        pytest.skip("set PLAYWRIGHT_CORE and install chromium and node to check the front end")
    url, _ = server
    shots = os.environ.get("COSMOS3_SCREENSHOTS", str(tmp_path))
    env = {**os.environ, "NODE_PATH": str(Path(modules).parent), "CHROMIUM": chromium}
    done = subprocess.run(["node", str(ROOT / "tests" / "frontend_check.cjs"), url, str(ROOT / "workflows"), shots],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for path in UI:
        api = json.loads((path.parent / "api" / path.name).read_text())
        expected = {k: {"class_type": v["class_type"], "inputs": v["inputs"]} for k, v in api.items()}
        got = report["converted"][path.stem]
        # Load Video's preview is a front-end widget whose value graphToPrompt adds; ComfyUI's LoadVideo has no such
        # input and ignores it
        got = {k: {"class_type": v["class_type"], "inputs": {name: value for name, value in v["inputs"].items()
                                                             if name != "video-preview"}} for k, v in got.items()}
        # a widget newer than the file is at its default on both sides (the front end fills it, the server passes none)
        registry = {**pack.NODE_CLASS_MAPPINGS, **CORE_NODES}
        assert with_defaults(got, registry) == with_defaults(expected, registry)
        assert report["errors"][path.stem] == [], report["errors"][path.stem]
        assert report["template_scale"][path.stem] >= 0.6  # opened from the template browser: text still drawn
    assert "checkpoint not installed: Cosmos3-Missing" in report["missing_notice"]
    answer, count = report["reason_report"].split("\n")[-2:]  # run from the front end: the answer shows in the node
    assert "8 tokens" in count and report["reason_preview"] == answer
    # the endpoint's internal nodes are developer-mode only: the node search does not offer them
    assert any("Cosmos3 Core Model" in hit for hit in report["search"]["Cosmos3 Core Model"]), report["search"]
    assert not any("Cosmos3 API" in hit for hit in report["search"]["Cosmos3 API"]), report["search"]


def test_two_worker_processes_start_inside_comfyui(server):
    """gpus = 2 on a CPU server: two worker processes (gloo) that must not re-run ComfyUI's main.py."""
    url, _ = server
    prompt = small(json.loads((ROOT / "workflows" / "api" / "cosmos3_edge_t2i.json").read_text()))
    prompt["1"]["inputs"]["gpus"] = 2
    history = _run(url, prompt)
    status, errors = _outcome(history)
    assert status == "success", errors
    prompt["1"]["inputs"]["gpus"] = 1  # and back: the pool is closed, one process again
    assert _run(url, prompt)["status"]["status_str"] == "success"


def test_cancel_stops_a_run_within_seconds(server):
    """POST /interrupt (the Cancel button) during a sampler step that takes seconds on a CPU ends the prompt within
    about one layer's time, not at the step's end; the server then runs the same graph to the end."""
    url, _ = server

    def one_step(width, height, frames, seed) -> dict:  # the sampler's latent previewed as text: no decode
        prompt = json.loads((ROOT / "workflows" / "api" / "cosmos3_edge_t2i.json").read_text())
        prompt["1"]["inputs"]["model_name"] = "Cosmos3-Edge-Large"
        prompt["9"] = {"class_type": "Cosmos3Scheduler", "inputs": {"schedule": "auto", "steps": 1, "flow_shift": 0.0}}
        prompt["4"]["inputs"].update(width=width, height=height, frames=frames, seed=seed, schedule=["9", 0])
        prompt["20"] = {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}}
        del prompt["5"]
        return prompt

    assert _run(url, one_step(64, 48, 1, seed=1))["status"]["status_str"] == "success"  # loads the checkpoint
    status, reply = _call(f"{url}/prompt", {"prompt": one_step(1408, 1408, 1, seed=2)})
    assert status == 200, reply
    time.sleep(2)  # inside its step
    pressed = time.monotonic()
    assert _call(f"{url}/interrupt", {})[0] == 200
    while not (history := _call(f"{url}/history/{reply['prompt_id']}")[1]):
        assert time.monotonic() - pressed < 60, "the cancelled prompt did not end"
        time.sleep(0.1)
    delay = time.monotonic() - pressed
    events = [event for event, _ in history[reply["prompt_id"]]["status"]["messages"]]
    assert "execution_interrupted" in events, events
    started = time.monotonic()
    assert _run(url, one_step(1408, 1408, 1, seed=3))["status"]["status_str"] == "success"
    step = time.monotonic() - started
    print(f"\ncancel delay {delay:.2f} s; the step it cut takes {step:.1f} s")
    assert delay < 2.0 < step - 2  # checked between steps only, the prompt would have run to the step's end


def test_a_request_whose_output_cannot_fit_is_refused_within_seconds(server):
    """4097 frames at 8192 x 8192 through the sampler (LATENT out, in 41 chunks, each of which fits a device): its
    latents alone are 48 GiB of host memory, refused at once naming memory and the figure; the server stays up."""
    url, _ = server
    prompt = small(json.loads((ROOT / "workflows" / "api" / "cosmos3_nano_t2v.json").read_text()))
    assert _run(url, prompt)["status"]["status_str"] == "success"  # the checkpoint is loaded
    huge = json.loads(json.dumps(prompt))
    huge["4"]["inputs"].update(width=8192, height=8192, frames=4097, chunk_frames=93)
    huge["20"] = {"class_type": "PreviewAny", "inputs": {"source": ["4", 0]}}  # the LATENT itself, not decoded
    for node in ("5", "21", "22", "23"):
        huge.pop(node, None)
    started = time.monotonic()
    status, errors = _outcome(_run(url, huge))
    seconds = time.monotonic() - started
    print(f"\nrefused in {seconds:.1f} s: {errors[0]}")
    assert status == "error" and "output latents 48.05 GiB" in errors[0] and seconds < 10, errors
    assert _run(url, prompt)["status"]["status_str"] == "success"


def _rss(base) -> int:
    """The server process's resident memory in bytes."""
    pid = (base / "server.pid").read_text()
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024


def _settled_rss(url: str, base) -> int:
    """The server's resident memory after /free, once it stops falling (at most 10 s)."""
    assert _call(f"{url}/free", {"unload_models": True, "free_memory": True})[0] == 200
    deadline, last = time.monotonic() + 10, None
    while (rss := _rss(base)) != last and time.monotonic() < deadline:
        last = rss
        time.sleep(1.5)  # the pack gives freed memory back to the system 1 s after a checkpoint is collected
    return rss


@pytest.mark.parametrize("attempt", range(int(os.environ.get("COSMOS3_FREE_REPEAT", "1"))))  # to rerun it N times
@pytest.mark.parametrize("workflow", ["cosmos3_edge_t2i", "cosmos3_super_t2i_4step_core"])
def test_free_releases_the_weights_and_the_next_run_gives_the_same_output(server, workflow, attempt):  # noqa: ARG001
    """After POST /free (unload_models, free_memory) the server is back within 30 % of the checkpoint's size of
    its memory before the checkpoint was loaded, within 10 s, on the pack's path and on the core MODEL path; the next
    run reloads and gives the same output. Measured from before the load, not from after the run: under RAM
    pressure ComfyUI's cache may evict the loaded checkpoint during the run, and it is then gone before /free."""
    from cosmos3_runtime.weights.files import stored_bytes

    url, base = server
    prompt = small(json.loads((ROOT / "workflows" / "api" / f"{workflow}.json").read_text()))
    saves = [n for n in prompt.values() if n["class_type"] == "SaveImage"]  # (video encoding is not bit-stable)
    loader = next(n for n in prompt.values() if n["class_type"] == "Cosmos3ModelLoader")
    loader["inputs"]["model_name"] = "Cosmos3-Edge-Large"
    weights = 2 * sum(stored_bytes(base / "models" / "cosmos3" / "Cosmos3-Edge-Large" / "transformer")[0].values())
    outputs = []
    for run in ("before", "after"):
        saves[0]["inputs"]["filename_prefix"] = f"free/{workflow}_{run}"
        unloaded = _settled_rss(url, base)  # what earlier tests loaded is gone
        history = _run(url, prompt)
        assert history["status"]["status_str"] == "success"
        (saved,) = [i for out in history["outputs"].values() for i in out.get("images", [])]
        path = base / "output" / saved["subfolder"] / saved["filename"]
        outputs.append(np.asarray(Image.open(path).convert("RGB")))  # (the files differ: each embeds its prompt)
        if run == "before":
            assert _call(f"{url}/free", {"unload_models": True, "free_memory": True})[0] == 200
            deadline = time.monotonic() + 10
            while _rss(base) - unloaded > 0.3 * weights and time.monotonic() < deadline:
                time.sleep(0.25)
            left = _rss(base) - unloaded
            assert left <= 0.3 * weights, (f"{left / 2**20:.0f} MiB more than before the {weights / 2**20:.0f} MiB "
                                           "checkpoint was loaded")
    assert np.array_equal(outputs[0], outputs[1])


# --- the action endpoint (SGLang's /v1/actions/generations) -------------------------------------------------------

ACTIONS = "/cosmos3/v1/actions/generations"
DROID = "nvidia/Cosmos3-Edge-Policy-DROID"
FAST = {"action_horizon": 4, "num_inference_steps": 2, "height": 256}  # tier 256: a toy canvas on CPU


def _png(height=96, width=128) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _multipart(fields: dict, files: dict) -> tuple[bytes, str]:
    """A multipart/form-data body: text fields, and files as {field: (client file name, bytes)}."""
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()]
    for name, (filename, data) in files.items():
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n")
        parts.append(head.encode() + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _alive(url: str) -> None:
    assert _call(f"{url}/system_stats")[0] == 200


def test_the_action_endpoint_answers_a_json_request_like_sglang(server):
    url, _ = server
    image = {"b64_json": base64.b64encode(_png()).decode()}
    body = {"model": DROID, "request_id": "step-1", "input": {"task": "Pick up the red cube", "observation": {
        "images": {"exterior_image_1_left": image}, "domain_name": "droid_lerobot"}}, "parameters": FAST}
    status, answer = _call(f"{url}{ACTIONS}", body, timeout=300)
    assert status == 200, answer
    (item,) = answer["data"]
    assert answer["id"] == "step-1" and answer["object"] == "action.generation" and answer["model"] == DROID
    assert item["action"]["shape"] == [4, 10] and np.asarray(item["action"]["values"]).shape == (4, 10)
    assert answer["usage"]["denoise_steps"] == 2 and answer["cosmos3"]["preset"] == "sglang"
    history = _call(f"{url}/history/{answer['cosmos3']['prompt_id']}")[1]
    assert history[answer["cosmos3"]["prompt_id"]]["status"]["status_str"] == "success"  # it ran through the queue
    again = _call(f"{url}/api{ACTIONS}", body, timeout=300)  # ComfyUI mirrors routes under /api; same seed, same actions
    assert again[0] == 200 and again[1]["data"][0]["action"]["values"] == item["action"]["values"]
    _alive(url)


def test_the_action_endpoint_takes_uploads_and_never_uses_their_names(server, tmp_path):
    url, base = server
    fields = {"task": "Pick up the red cube", "domain_name": "droid_lerobot", "model": DROID, **FAST}
    data, kind = _multipart(fields, {"image": ("../../escaped.png", _png())})
    status, answer = _call(f"{url}{ACTIONS}", data=data, content_type=kind, timeout=300)
    assert status == 200 and answer["data"][0]["action"]["shape"] == [4, 10], answer
    assert not list(base.parent.rglob("escaped.png")) and not list(base.rglob("*.png.*"))

    from cosmos3_runtime.media import save_video

    clip = save_video(torch.rand(9, 96, 128, 3), tmp_path / "clip.mp4", fps=15).read_bytes()
    fields.update(action_mode="inverse_dynamics")
    data, kind = _multipart(fields, {"video": ("/etc/clip.mp4", clip)})
    status, answer = _call(f"{url}{ACTIONS}", data=data, content_type=kind, timeout=300)
    assert status == 200 and answer["data"][0]["action"]["action_mode"] == "inverse_dynamics", answer
    _alive(url)


REFUSALS = [  # (body bytes, content type, status, field named)
    (b'{"input": {"task": "go", ', "application/json", 400, "body"),
    (json.dumps({"model": DROID, "input": {"task": "go", "observation": {"image": {"b64_json": ""}}}}).encode(),
     "application/json", 400, "input.observation.domain_name"),
    (json.dumps({"model": "../../secrets", "input": {"task": "go", "observation": {"domain_name": "pusht"}}}).encode(),
     "application/json", 400, "model"),
    (b"task=go", "text/plain", 415, "Content-Type"),
]


@pytest.mark.parametrize("data, kind, status, where", REFUSALS, ids=[r[3] for r in REFUSALS])
def test_the_action_endpoint_refuses_bad_requests_and_stays_up(server, data, kind, status, where):
    url, _ = server
    got, answer = _call(f"{url}{ACTIONS}", data=data, content_type=kind)
    assert got == status and answer["error"]["param"] == where and where in answer["detail"], answer
    _alive(url)


def test_the_action_endpoint_refuses_an_oversized_upload(server):
    url, _ = server
    data, kind = _multipart({"domain_name": "droid_lerobot"}, {"image": ("big.png", os.urandom(UPLOAD_LIMIT_MB * 2**20 + 1))})
    status, answer = _call(f"{url}{ACTIONS}", data=data, content_type=kind)
    assert status == 413 and "upload limit" in answer["detail"], answer
    _alive(url)


def test_the_action_endpoint_reports_what_the_run_refused(server):
    """A checkpoint without an action head: the runtime's error comes back as a 400, and the next run works."""
    url, _ = server
    body = {"model": "Cosmos3-Edge", "input": {"task": "go", "observation": {
        "image": {"b64_json": base64.b64encode(_png()).decode()}, "domain_name": "droid_lerobot"}}, "parameters": FAST}
    status, answer = _call(f"{url}{ACTIONS}", body, timeout=300)
    assert status == 400 and "action head" in answer["detail"], answer
    assert _call(f"{url}{ACTIONS.replace('generations', 'metadata')}")[1]["object"] == "action.metadata"
    _alive(url)


# --- the chat completions route, with the real `openai` client ---------------------------------------------------

CHAT_MODEL = "Cosmos3-Nano"


def _openai(url: str, prefix: str = ""):
    openai = pytest.importorskip("openai")
    return openai, openai.OpenAI(base_url=f"{url}{prefix}/cosmos3/v1", api_key="unused", max_retries=0, timeout=300)


def _clip_bytes(frames=24, fps=12) -> bytes:
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        for i in range(frames):
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.full((64, 96, 3), 9 * i, np.uint8), format="rgb24")))
        container.mux(stream.encode())
    return buffer.getvalue()


def test_the_chat_route_answers_the_openai_client_like_reason(server):
    import cosmos3_runtime

    url, base = server
    openai, client = _openai(url)
    assert CHAT_MODEL in [m.id for m in client.models.list().data]
    png = _png()
    image = "data:image/png;base64," + base64.b64encode(png).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                             {"type": "text", "text": "What is this?"}]}]
    reply = client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=8, temperature=0, seed=0)
    pipe = cosmos3_runtime.load(base / "models" / "cosmos3" / CHAT_MODEL, device="cpu", dtype="fp32", parts="reasoner")
    expected = pipe.reason("What is this?", images=[np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))],
                           max_new_tokens=8, temperature=0.0, seed=0)
    choice = reply.choices[0]
    assert choice.message.content == expected.text and choice.finish_reason == expected.finish_reason
    assert reply.usage.prompt_tokens == len(expected.prompt_ids) and reply.usage.completion_tokens == 8
    assert reply.object == "chat.completion" and reply.model == CHAT_MODEL and reply.id.startswith("chatcmpl-")

    chunks = list(client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=8, temperature=0,
                                                 seed=0, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == expected.text and sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) > 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens == 8

    video = "data:video/mp4;base64," + base64.b64encode(_clip_bytes()).decode()
    clip = client.chat.completions.create(model=CHAT_MODEL, max_tokens=4, temperature=0, messages=[{"role": "user",
        "content": [{"type": "video_url", "video_url": {"url": video}}, {"type": "text", "text": "What happens?"}]}],
        extra_body={"media_io_kwargs": {"video": {"fps": 2}}})
    assert clip.choices[0].message.content is not None and clip.usage.completion_tokens == 4

    thought = client.chat.completions.create(model=CHAT_MODEL, max_tokens=6, messages=[{"role": "user", "content": "Why?"}],
                                             extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    assert "reasoning_content" in thought.choices[0].message.model_extra

    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="never fetches URLs"):
        client.chat.completions.create(model=CHAT_MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}])
    with pytest.raises(openai.NotFoundError, match="Cosmos3-Missing"):
        client.chat.completions.create(model="Cosmos3-Missing", messages=messages, max_tokens=2)
    _, mirrored = _openai(url, "/api")  # ComfyUI mirrors the routes under /api; the next request works
    again = mirrored.chat.completions.create(model=CHAT_MODEL, messages=messages, max_tokens=8, temperature=0, seed=0)
    assert again.choices[0].message.content == expected.text
    _alive(url)


def test_the_chat_route_refuses_an_oversized_body(server):
    url, _ = server
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "x" * (UPLOAD_LIMIT_MB * 2**20 + 10)}]}
    status, answer = _call(f"{url}/cosmos3/v1/chat/completions", body)
    assert status == 413 and answer["error"]["param"] == "body", answer
    _alive(url)


def test_an_abandoned_stream_takes_its_prompt_off_the_queue(server):
    """Chat requests waiting behind a long run, up to the connection cap (the next one is a 503), whose clients go
    away, leave the queue: without the unqueue they would stay pending (and run for nobody)."""
    import http.client

    url, _ = server
    busy = small(json.loads((ROOT / "workflows" / "api" / "cosmos3_edge_t2v.json").read_text()))
    busy["1"]["inputs"]["model_name"] = "Cosmos3-Edge-Large"
    busy["4"]["inputs"].update(frames=33, width=128, height=96)
    status, queued = _call(f"{url}/prompt", {"prompt": busy})
    assert status == 200, queued
    host, port = url.removeprefix("http://").split(":")
    body = {"model": CHAT_MODEL, "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    connections = []
    for _ in range(MAX_CONNECTIONS):
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request("POST", "/cosmos3/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")  # queued: the role chunk came
        connections.append(connection)
    status, refused = _call(f"{url}/cosmos3/v1/chat/completions", body)
    assert status == 503 and "COSMOS3_API_MAX_CONNECTIONS" in refused["error"]["message"], refused

    def chat_prompts(entries):
        return [e for e in entries if any(n["class_type"] == "Cosmos3APIChat" for n in e[2].values())]

    queue = _call(f"{url}/queue")[1]
    assert len(chat_prompts(queue["queue_pending"])) == MAX_CONNECTIONS and queue["queue_running"]  # behind the run
    for connection in connections:
        connection.sock.close()
        connection.close()
    deadline = time.monotonic() + 10
    while chat_prompts(_call(f"{url}/queue")[1]["queue_pending"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    queue = _call(f"{url}/queue")[1]
    assert not chat_prompts(queue["queue_pending"]) and queue["queue_running"], queue  # gone while the run still runs
    while _call(f"{url}/queue")[1]["queue_running"]:
        time.sleep(0.5)
    _alive(url)


TICKS = "/cosmos3/v1/sessions/ticks"
SOAK_TICKS = int(os.environ.get("COSMOS3_SOAK_TICKS", "24"))  # ticks over three sessions (the docs' soak: 200)


def _tick(url: str, session: str, k: int, values=None, **extra) -> tuple[int, dict]:
    values = np.random.default_rng(k).normal(size=(16, 29)).tolist() if values is None else values
    body = {"extra_args": {"ar_diffusion_tick": {
        "session_id": session, "request_id": f"{session}-{k}", "chunk_index": k, "applied_event_ids": [k],
        "controls": [{"track": "robot_action", "schema": "robot_action.v1", "data": {"values": values}}],
        **extra.pop("tick", {})}}, **extra}
    if k == 0:
        body.update(prompt="The robot folds the towel.", width=64, height=32,
                    image=np.random.default_rng(0).integers(0, 256, (32, 64, 3)).tolist())
    return _call(f"{url}{TICKS}", body, timeout=300)


def test_a_session_ticks_over_http_and_refuses_what_it_cannot_take(server):
    url, _ = server
    status, first = _tick(url, "s1", 0)
    assert status == 200, first
    assert first["ar_diffusion"] == {"session_id": "s1", "request_id": "s1-0", "chunk_index": 0,
                                     "applied_event_ids": [0]}
    assert (first["num_frames"], first["frame_index"], len(first["frames"])) == (17, 0, 17)
    assert Image.open(io.BytesIO(base64.b64decode(first["frames"][0]["b64_json"]))).size == (64, 32)
    for k, session, extra, status_wanted, field in [
        (2, "s1", {}, 409, "ar_diffusion_tick.chunk_index"),  # out of order
        (0, "s2", {}, 409, "ar_diffusion_tick.session_id"),  # one session per model
        (1, "s1", {"values": [[0.0] * 9] * 16}, 400, "ar_diffusion_tick.controls[0].data.values"),
        (1, "s1", {"fps": 15}, 409, "fps"),  # bound at open
    ]:
        status, refused = _tick(url, session, k, **extra)
        assert (status, refused["error"]["param"]) == (status_wanted, field), refused
    status, second = _tick(url, "s1", 1, tick={"close_session": True})
    assert status == 200 and (second["num_frames"], second["frame_index"], second["first_frame"]) == (16, 5, 17)
    status, gone = _tick(url, "s1", 2)
    assert status == 404 and "start it again at chunk_index 0" in gone["error"]["message"], gone
    request = urllib.request.Request(f"{url}/cosmos3/v1/sessions/s1", method="DELETE")
    with pytest.raises(urllib.error.HTTPError) as closed:
        urllib.request.urlopen(request, timeout=30)
    assert closed.value.code == 404
    _alive(url)


def test_a_soak_of_ticks_over_three_sessions_keeps_memory_flat(server):
    url, base = server
    rss, seconds = [], []
    counts = [max(3, SOAK_TICKS // 3 + (n < SOAK_TICKS % 3)) for n in range(3)]
    for n, count in enumerate(counts):
        session = f"soak-{n}"
        for k in range(count):
            start = time.perf_counter()
            status, answer = _tick(url, session, k)
            assert status == 200, answer
            seconds.append(time.perf_counter() - start)
            rss.append(_rss(base) / 2**20)
        request = urllib.request.Request(f"{url}/cosmos3/v1/sessions/{session}", method="DELETE")
        assert urllib.request.urlopen(request, timeout=30).status == 200
    settled = rss[counts[0]:]  # after the first session (the model loaded, the window filled once)
    print(f"soak: {len(rss)} ticks over 3 sessions, median {sorted(seconds)[len(seconds) // 2]:.2f} s a tick; "
          f"server RSS after the first session {min(settled):.0f}-{max(settled):.0f} MiB, at the end {rss[-1]:.0f} MiB")
    assert max(settled) - settled[0] < 150, rss
    _alive(url)


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory, tiny_factory):
    """A server with the server-wide guardrail on (the package's stand-ins), serving the chat route."""
    if not _has_guardrail_package():
        pytest.skip("cosmos-guardrail is not installed in ComfyUI's Python")
    base = tmp_path_factory.mktemp("comfyui-guarded")
    with comfyui_server(base, {CHAT_MODEL: CHECKPOINTS[CHAT_MODEL]}, tiny_factory,
                        env={"COSMOS3_GUARDRAILS": "on"}) as url:
        yield url, base


def test_the_server_wide_guardrail_refuses_a_request_before_queueing_it(guarded_server):
    url, _ = guarded_server
    word = stand_ins.WORDS["custom"][0]
    body = {"model": CHAT_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": f"Describe a {word}."}]}
    status, refused = _call(f"{url}/cosmos3/v1/chat/completions", body, timeout=120)
    assert status == 400 and refused["error"]["type"] == "guardrail_blocked", refused
    assert "blocked by the guardrail's keyword blocklist" in refused["error"]["message"] and word not in str(refused)
    _, history = _call(f"{url}/history")
    assert history == {}  # nothing was queued
    body["messages"][0]["content"] = "Describe a cat."
    status, answer = _call(f"{url}/cosmos3/v1/chat/completions", body, timeout=300)
    assert status == 200 and answer["choices"][0]["message"]["content"] is not None, answer
    prompt = small(json.loads((ROOT / "workflows" / "api" / "cosmos3_nano_t2v.json").read_text()))
    encode = next(node for node in prompt.values() if node["class_type"] == "Cosmos3TextEncode")
    encode["inputs"]["prompt"] = f"A {word} at dawn."  # a graph without a guardrail node: the server's applies
    status, errors = _outcome(_run(url, prompt))
    assert status == "error" and "blocked by the guardrail's keyword blocklist" in errors[0], errors
    assert _call(f"{url}/free", {"unload_models": True, "free_memory": True})[0] == 200
