"""Every shipped workflow: API prompts validate and run like ComfyUI runs them; UI files match their API twins.

A workflow is checked for being valid, not for being what the builder (tests/build_workflows.py) would write
today: a widget appended to a node's "optional" inputs with a default leaves every saved workflow valid, as in
ComfyUI, so adding one rewrites no file here (test_a_workflow_saved_before_the_samplers_last_widget_still_runs).
"""

import copy
import inspect
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from comfy_harness import (
    CORE_NODES,
    LoadAudio,
    LoadImage,
    LoadVideo,
    PreviewAny,
    SaveImage,
    SaveVideo,
    Video,
    WorkflowError,
    declared_inputs,
    execute,
    is_widget,
    load_json,
    ui_extra_values,
    validate,
    widget_names,
)
from conftest import ROOT
from cosmos3_runtime.media import save_wav

API = sorted((ROOT / "workflows" / "api").glob("*.json"))
EXAMPLE_ACTIONS = "agibot_actions.csv"  # the Sim-Bimanual workflow's actions, copied into ComfyUI's input folder
ACTION = [p for p in API if "_droid_" in p.name]  # action workflows (Edge-Policy-DROID)
CORE = [p for p in API if p.stem.endswith(("_core", "_easycache"))]  # ComfyUI samples them (test_comfyui_server.py)
TRANSFER = [p for p in API if "_transfer_" in p.name and "_sim_" not in p.name]  # Cosmos3 Transfer Sampler: frames out
SIM_TRANSFER = [p for p in API if "_sim_transfer_" in p.name and p not in CORE]  # Cosmos3 Sim-Transfer Sampler
SIM_BIMANUAL = [p for p in API if "_sim_bimanual" in p.name and p not in CORE]  # a causal rollout of actions
REASON = [p for p in API if "_reason_" in p.name]  # the Reasoner alone: text out
GUARDED = [p for p in API if "_guardrail" in p.name]  # NVIDIA's guardrail package (stand-ins for its models)
UI = sorted((ROOT / "workflows").glob("*.json"))


@pytest.fixture
def registry(pack, models_dir, tmp_path, monkeypatch):
    inputs = tmp_path / "input"
    inputs.mkdir()
    pixels = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(inputs / "example.png")
    shutil.copy(ROOT / "workflows" / EXAMPLE_ACTIONS, inputs)
    monkeypatch.setenv("COSMOS3_INPUT_DIR", str(inputs))
    LoadImage.input_dir = LoadAudio.input_dir = inputs
    tone = torch.sin(2 * torch.pi * 220 * torch.arange(44100) / 44100)  # 1 s of a 220 Hz tone, mono 44.1 kHz
    save_wav(0.5 * tone.unsqueeze(0), inputs / "example.wav", 44100)
    LoadVideo.clips = {"example.mp4": Video(torch.rand(11, 120, 160, 3), 24.0),
                       **{name: Video(clip[:13], 16.0) for name, clip in zip(pack.transfer.EXAMPLE_CLIPS,
                                                                             pack.transfer.example_scene(13, 48, 80))}}
    SaveImage.saved.clear()
    SaveVideo.saved.clear()
    PreviewAny.shown.clear()
    return {**pack.NODE_CLASS_MAPPINGS, **CORE_NODES}


def test_there_are_workflows_and_each_has_a_twin():
    assert len(API) >= 7
    assert [p.name for p in API] == [p.name for p in UI]
    assert all(p.with_suffix(".jpg").is_file() for p in UI)  # template thumbnails


@pytest.mark.parametrize("path", API, ids=lambda p: p.stem)
def test_api_workflow_validates(registry, path):
    validate(load_json(path), registry)


def small(prompt: dict) -> dict:
    """The same graph at toy sizes, so a CPU runs it in seconds (the graph and widgets are unchanged otherwise)."""
    prompt = copy.deepcopy(prompt)
    for node in prompt.values():
        if node["class_type"] == "Cosmos3Sampler":
            frames = node["inputs"]["frames"]
            media = node["inputs"].get("media")
            keyframes = media is not None and prompt[media[0]]["class_type"] == "Cosmos3Keyframes"  # their count (below)
            node["inputs"].update(width=64, height=48, frames=0 if keyframes else 1 if frames == 1 else 13)
            if node["inputs"].get("chunk_frames"):  # a long video: 13 frames in three chunks of 5
                node["inputs"]["chunk_frames"] = 5
        if node["class_type"] == "Cosmos3Keyframes":
            node["inputs"]["frames"] = 13
        if node["class_type"] == "Cosmos3Scheduler":
            node["inputs"]["steps"] = min(node["inputs"]["steps"], 3) or 3
        if node["class_type"] == "Cosmos3Action":
            node["inputs"].update(chunk_size=4, resolution_tier="256")
        if node["class_type"] == "Wan22ImageToVideoLatent":
            length = node["inputs"]["length"]
            node["inputs"].update(width=64, height=48, length=1 if length == 1 else 13)
        if node["class_type"] == "KSampler":
            node["inputs"]["steps"] = 3
        if node["class_type"] == "Cosmos3TransferSampler":  # 13 frames in two chunks
            node["inputs"].update(width=64, height=48, chunk_frames=9)
        if node["class_type"] == "Cosmos3SimTransferSampler":  # latent frame 0, then chunks of 4
            node["inputs"].update(width=64, height=48)
        if node["class_type"] in ("Cosmos3Reason", "Cosmos3UpsamplePrompt"):
            node["inputs"]["max_new_tokens"] = 8
        if node["class_type"] == "Cosmos3UpsamplePrompt":
            node["inputs"].update(width=64, height=48, frames=13)
    return prompt


@pytest.mark.parametrize("path", [p for p in API if p not in ACTION + CORE + TRANSFER + SIM_TRANSFER + SIM_BIMANUAL
                                  + REASON],
                         ids=lambda p: p.stem)
def test_api_workflow_runs_and_saves_frames(registry, path, request):
    if path in GUARDED:
        request.getfixturevalue("guardrail_package")
    prompt = small(load_json(path))
    results = execute(prompt, registry)
    samplers = [n for n, node in prompt.items() if node["class_type"] == "Cosmos3Sampler"]
    latent = results[samplers[0]][0][0]["samples"]
    if SaveImage.saved:
        ((_, images),) = SaveImage.saved
        assert images.shape == (1, 48, 64, 3) and latent.shape == (1, 48, 1, 3, 4)
    else:
        ((_, video),) = SaveVideo.saved
        assert video.images.shape == (13, 48, 64, 3) and latent.shape == (1, 48, 4, 3, 4)
        expected_fps = prompt[samplers[0]]["inputs"]["fps"] or 24.0
        assert video.fps == expected_fps  # set once on the sampler, carried to the video
        if prompt[samplers[0]]["inputs"]["sound"]:  # the sound track, trimmed to the clip, reaches Create Video
            assert video.audio["waveform"].shape == (1, 2, int(13 / expected_fps * video.audio["sample_rate"]))
    loader = next(n for n, node in prompt.items() if node["class_type"] == "Cosmos3ModelLoader")
    assert "multi-step" in results[loader][0][2] or "distilled" in results[loader][0][2]


@pytest.mark.parametrize("path", [p for p in API if any(n["class_type"].startswith(("Cosmos3Reason", "Cosmos3Upsample"))
                                                       for n in load_json(p).values())], ids=lambda p: p.stem)
def test_reasoner_workflows_answer_in_the_node_and_pass_text_on(registry, path):
    prompt = small(load_json(path))
    results = execute(prompt, registry)
    for node_id, node in prompt.items():
        if node["class_type"] == "Cosmos3Reason":
            answer, thinking = results[node_id][0]
            assert isinstance(answer, str) and thinking == ""
            assert results[node_id][1]["text"][0] == answer and "8 tokens" in results[node_id][1]["text"][1]
            assert PreviewAny.shown == [answer]  # the text preview shows the answer
        if node["class_type"] == "Cosmos3UpsamplePrompt":  # random weights write no JSON: the prompt goes on as given
            (caption,) = results[node_id][0]
            assert caption == node["inputs"]["prompt"] and "no JSON caption" in results[node_id][1]["text"][0]


@pytest.mark.slow  # two chunked transfers (the runtime's transfer parity runs by default)
@pytest.mark.parametrize("path", TRANSFER, ids=lambda p: p.stem)
def test_transfer_workflow_runs_and_saves_a_clip_as_long_as_the_controls(registry, path):
    prompt = small(load_json(path))
    results = execute(prompt, registry)
    ((_, video),) = SaveVideo.saved
    assert video.images.shape == (13, 48, 64, 3) and video.fps == 16.0  # the source clip's fps, through the sampler
    (sampler,) = [n for n, node in prompt.items() if node["class_type"] == "Cosmos3TransferSampler"]
    report = "\n".join(results[sampler][1]["text"])
    assert "2 chunks of 9 frames" in report and "resized to 64x48" in report
    hints = {node["class_type"] for node in prompt.values() if node["class_type"].endswith("Control")}
    assert ("depth" in report) == ("Cosmos3DepthControl" in hints) and "(edge" in report


@pytest.mark.slow  # a causal rollout with its control clip encoded and the clip decoded
@pytest.mark.parametrize("path", SIM_TRANSFER, ids=lambda p: p.stem)
def test_sim_transfer_workflow_rolls_out_whole_chunks_of_the_control(registry, path):
    LoadVideo.clips = {name: Video(torch.rand(21, 48, 80, 3, generator=torch.Generator().manual_seed(0)), 16.0)
                       for name in LoadVideo.clips}
    prompt = small(load_json(path))
    results = execute(prompt, registry)
    ((_, video),) = SaveVideo.saved
    assert video.images.shape == (17, 48, 64, 3) and video.fps == 16.0  # 21 frames trimmed to whole chunks
    (sampler,) = [n for n, node in prompt.items() if node["class_type"] == "Cosmos3SimTransferSampler"]
    report = "\n".join(results[sampler][1]["text"])
    assert "2 chunks of 4 steps, edge control, K/V history" in report and "trimmed to 17" in report


@pytest.mark.parametrize("path", SIM_BIMANUAL, ids=lambda p: p.stem)
def test_sim_bimanual_workflow_rolls_out_the_actions_file(registry, path):
    prompt = small(load_json(path))
    results = execute(prompt, registry)
    ((_, video),) = SaveVideo.saved
    assert video.images.shape == (13, 48, 64, 3) and video.fps == 30.0  # the first 12 actions: 1 + 12 frames
    (sampler,) = [n for n, node in prompt.items() if node["class_type"] == "Cosmos3Sampler"]
    report = "\n".join(results[sampler][1]["text"])
    assert "causal actions: 64x48, 13 frames" in report and "the first 12 of 32 actions used" in report


@pytest.mark.slow  # three action runs with their plots (the runtime's action parity runs by default)
@pytest.mark.parametrize("path", ACTION, ids=lambda p: p.stem)
def test_action_workflow_runs(registry, path, tmp_path, monkeypatch):
    monkeypatch.setenv("COSMOS3_OUTPUT_DIR", str(tmp_path / "output"))
    prompt = small(load_json(path))
    results = execute(prompt, registry)
    actions = [results[n][0][1] for n, node in prompt.items() if node["class_type"] == "Cosmos3Sampler"
               and node["inputs"].get("action") and prompt[node["inputs"]["action"][0]]["inputs"]["mode"] != "forward_dynamics"]
    for table in actions:  # droid-server preset (the checkpoint's name): 8-D joint actions, state row dropped
        assert table["preset"] == "droid-server" and table["actions"].shape == (4, 8)
    if "forward" in path.stem:
        ((_, video),) = SaveVideo.saved
        assert video.images.shape[0] == 5 and video.fps == 15.0  # chunk + 1 frames at the preset's fps
    else:
        saved = sorted(p.name for p in (tmp_path / "output" / "actions").iterdir())
        assert any(n.endswith(".json") for n in saved) and any(n.endswith(".npy") for n in saved)
        ((_, plot),) = [s for s in SaveImage.saved if s[0].endswith("_plot")]
        assert plot.shape[-1] == 3 and plot.shape[1] > 100  # a drawn chart


SOCKETLESS = ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")


def front_end_conversion(workflow: dict, registry: dict) -> dict:
    """UI -> API the way the front end's graphToPrompt does it, written from its rules, not from the
    generator's helpers (tests/build_workflows.py): each widget input (a combo list or a socketless
    type) takes the next widgets_values entry; `control_after_generate` and upload buttons add one
    UI-only entry after theirs; widgets past the end of widgets_values keep their defaults (the front
    end's LGraphNode.configure stops there); a linked input becomes [source id, slot]; muted/bypassed
    nodes drop."""
    by_id = {link[0]: link for link in workflow["links"]}
    prompt = {}
    for node in workflow["nodes"]:
        if node["mode"] in (2, 4):
            continue
        spec = registry[node["type"]].INPUT_TYPES()
        queue = list(node["widgets_values"])
        linked = {}
        for slot, entry in enumerate(node["inputs"]):
            if entry["link"] is not None:
                link = by_id[entry["link"]]
                if (link[3], link[4]) != (node["id"], slot):
                    raise WorkflowError(f"link {link[0]} does not end at node {node['id']} slot {slot}")
                linked[entry["name"]] = [str(link[1]), link[2]]
        inputs = {}
        for section in ("required", "optional"):
            for name, (kind, *rest) in spec.get(section, {}).items():
                options = rest[0] if rest else {}
                if isinstance(kind, list) or kind in SOCKETLESS:
                    if queue:
                        inputs[name] = queue.pop(0)
                        queue = queue[ui_extra_values(options):]
                    elif "default" in options:  # saved before this widget existed: it keeps its default
                        inputs[name] = options["default"]
                    else:
                        raise WorkflowError(f"node {node['id']}: no widget value left for {name}")
                if name in linked:
                    inputs[name] = linked[name]
        if queue:
            raise WorkflowError(f"node {node['id']} ({node['type']}): {len(queue)} widgets_values left over")
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt


def with_defaults(prompt: dict, registry: dict) -> dict:
    """What each node of an API prompt runs with: an optional widget it leaves out is at its default. ComfyUI's
    server calls a node with only the inputs its prompt has (execution.py, get_input_data), so the node's own
    keyword default runs, which is the declared one (test_optional_widgets_run_at_their_declared_default)."""
    filled = {}
    for node_id, node in prompt.items():
        inputs = dict(node["inputs"])
        for name, (kind, options, required) in declared_inputs(registry[node["class_type"]]).items():
            if is_widget(kind) and not required and "default" in options:
                inputs.setdefault(name, options["default"])
        filled[node_id] = {"class_type": node["class_type"], "inputs": inputs}
    return filled


@pytest.mark.parametrize("path", UI, ids=lambda p: p.stem)
def test_ui_workflow_matches_its_api_twin(registry, path):
    """(test_comfyui_server.py checks the same with the real front end's graphToPrompt.)"""
    converted = front_end_conversion(load_json(path), registry)
    validate(converted, registry)
    assert with_defaults(converted, registry) == with_defaults(load_json(path.parent / "api" / path.name), registry)


def test_optional_widgets_run_at_their_declared_default(pack):
    """A prompt without an optional widget (made before it existed) runs the node's keyword default and the front
    end shows the declared one: they must be the same value, in the node's function and in VALIDATE_INPUTS."""
    for node_id, cls in pack.NODE_CLASS_MAPPINGS.items():
        functions = [getattr(cls, cls.FUNCTION), *([cls.VALIDATE_INPUTS] if hasattr(cls, "VALIDATE_INPUTS") else [])]
        for name, (kind, options, required) in declared_inputs(cls).items():
            if required or not is_widget(kind):
                continue
            assert "default" in options, (node_id, name)
            for function in functions:
                parameter = inspect.signature(function).parameters.get(name)
                assert parameter is None or parameter.default == options["default"], (node_id, function.__name__, name)


def test_a_workflow_saved_before_the_samplers_last_widget_still_runs(registry):
    """Appending a widget to a sampler rewrites no workflow: one saved before it existed (the sampler without its
    last widget) validates and runs in the API format, and the UI format converts to the same prompt."""
    sampler = registry["Cosmos3Sampler"]
    api = load_json(ROOT / "workflows" / "api" / "cosmos3_edge_t2v.json")
    (node_id,) = [n for n, node in api.items() if node["class_type"] == "Cosmos3Sampler"]
    last = [name for name in widget_names(sampler) if name in api[node_id]["inputs"]][-1]  # the last one saved
    assert not declared_inputs(sampler)[last][2]  # appended widgets are optional
    older = copy.deepcopy(api)
    del older[node_id]["inputs"][last]
    execute(small(older), registry)  # validated, then the sampler runs at its own default for the widget
    ui = load_json(ROOT / "workflows" / "cosmos3_edge_t2v.json")
    next(n for n in ui["nodes"] if n["type"] == "Cosmos3Sampler")["widgets_values"].pop()
    converted = front_end_conversion(ui, registry)
    assert converted[node_id]["inputs"][last] == declared_inputs(sampler)[last][1]["default"]
    assert with_defaults(converted, registry) == with_defaults(older, registry)


def test_widget_order_of_our_nodes(pack):
    """widgets_values follow these orders; changing one breaks saved workflows. Append new widgets only, to
    "optional" with a default: saved workflows then stay valid as they are."""
    expected = {
        "Cosmos3ModelLoader": ["model_name", "dtype", "device", "hf_repo_id", "allow_download", "gpus", "multi_gpu",
                               "offload_text", "blocks_to_swap", "quantize", "transformer_file", "parts"],
        "Cosmos3TextEncode": ["prompt", "negative_prompt", "system_prompt", "resolution_template", "duration_template",
                              "json_captions"],
        "Cosmos3Scheduler": ["schedule", "steps", "flow_shift"],
        "Cosmos3Sampler": ["width", "height", "frames", "fps", "guidance", "guidance_interval", "seed", "sound", "cache",
                           "compile", "chunk_frames", "chunk_overlap_frames", "cache_threshold",
                           "cache_max_consecutive"],
        "Cosmos3Keyframes": ["frames", "middle_frames"],
        "Cosmos3VAEDecode": ["tiled", "tile_size", "tile_overlap"],
        "Cosmos3VAEEncode": [],
        "Cosmos3ImageToVideo": [],
        "Cosmos3VideoToVideo": ["condition_frames", "keep"],
        "Cosmos3JSONCaption": ["temporal_caption", "subjects", "extra_json"],
        "Cosmos3DefaultNegativePrompt": [],
        "Cosmos3SoundDecode": ["trim"],
        "Cosmos3LatentToVideo": ["condition_frames", "keep"],
        "Cosmos3Action": ["mode", "domain", "chunk_size", "resolution_tier", "view_point", "preset"],
        "Cosmos3RobotState": ["values"],
        "Cosmos3LoadActions": ["file", "domain"],
        "Cosmos3SaveActions": ["filename_prefix"],
        "Cosmos3ActionPlot": [],
        "Cosmos3APIObservation": ["key", "index"],
        "Cosmos3APIResult": ["key", "index", "candidate"],
        "Cosmos3CoreModel": ["compile"],
        "Cosmos3CoreTextEncode": ["prompt", "negative_prompt", "system_prompt", "resolution_template",
                                  "duration_template", "json_captions", "fps"],
        "Cosmos3ConditionFrames": ["condition_frames"],
        "Cosmos3CoreSimControl": [],
        "Cosmos3CoreSimActions": [],
        "Cosmos3LoraLoader": ["lora_name", "strength"],
        "Cosmos3EdgeControl": ["derive"],
        "Cosmos3BlurControl": ["derive"],
        "Cosmos3DepthControl": [],
        "Cosmos3SegmentationControl": [],
        "Cosmos3WorldScenarioMapControl": [],
        "Cosmos3TransferSampler": ["width", "height", "frames", "fps", "guidance", "control_guidance", "chunk_frames",
                                   "chunk_overlap_frames", "seed", "control_guidance_interval", "cache", "compile",
                                   "cache_threshold", "cache_max_consecutive"],
        "Cosmos3SimTransferSampler": ["width", "height", "frames", "fps", "seed", "history", "window",
                                      "emphasize_control", "history_memory"],
        "Cosmos3APIChat": ["key", "choice"],
        "Cosmos3APISessionTick": ["key"],
        "Cosmos3Reason": ["question", "system_prompt", "max_new_tokens", "thinking", "seed", "video_fps", "sample_fps"],
        "Cosmos3ReasonSampling": ["temperature", "top_p", "top_k", "presence_penalty"],
        "Cosmos3UpsamplePrompt": ["prompt", "width", "height", "frames", "fps", "max_new_tokens", "seed"],
        "Cosmos3GuardrailLoader": ["device", "fail_closed", "allow_download"],
    }
    assert {name: widget_names(cls) for name, cls in pack.NODE_CLASS_MAPPINGS.items()} == expected


def test_sampler_widgets_values_carry_the_seed_control(registry):
    workflow = load_json(ROOT / "workflows" / "cosmos3_edge_t2v.json")
    sampler = next(n for n in workflow["nodes"] if n["type"] == "Cosmos3Sampler")
    seed = widget_names(registry["Cosmos3Sampler"]).index("seed")  # (no widget before it has UI-only values)
    assert sampler["widgets_values"][seed : seed + 3] == [42, "fixed", False]  # seed, its control, then sound


def test_a_shifted_widget_is_caught(registry):
    workflow = load_json(UI[0])
    for node in workflow["nodes"]:
        if node["type"] == "Cosmos3Sampler":
            node["widgets_values"].insert(0, 0)
    with pytest.raises(WorkflowError):  # values left over, or one of the wrong type
        validate(front_end_conversion(workflow, registry), registry)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p["4"]["inputs"].update(width=-16), "value_smaller_than_min"),
        (lambda p: p["1"]["inputs"].update(model_name="../../etc"), "value_not_in_list"),
        (lambda p: p["4"]["inputs"].update(text=["1", 0]), "return_type_mismatch"),
        (lambda p: p["4"]["inputs"].pop("seed"), "required_input_missing"),
        (lambda p: p.update({"99": {"class_type": "NoSuchNode", "inputs": {}}}), "missing_node_type"),
    ],
)
def test_validation_rejects_bad_prompts(registry, change, message):
    prompt = load_json(ROOT / "workflows" / "api" / "cosmos3_edge_t2v.json")
    change(prompt)
    with pytest.raises(WorkflowError, match=message):
        validate(prompt, registry)


def test_node_definitions_are_well_formed(pack):
    # one entry per node in NODES (its id is its class name): no class, and no display name, twice
    assert len(pack.NODE_CLASS_MAPPINGS) == len(set(pack.NODE_DISPLAY_NAME_MAPPINGS.values())) == len(pack.NODES)
    for node_id, cls in pack.NODE_CLASS_MAPPINGS.items():
        assert node_id.startswith("Cosmos3") and pack.NODE_DISPLAY_NAME_MAPPINGS[node_id].startswith("Cosmos3 ")
        assert cls.CATEGORY.startswith("cosmos3") and callable(getattr(cls, cls.FUNCTION))
        assert len(getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)) == len(cls.RETURN_TYPES)
        for section in cls.INPUT_TYPES().values():
            for name, spec in section.items():
                kind, options = spec[0], (spec[1] if len(spec) > 1 else {})
                if isinstance(kind, list):
                    assert options.get("default", kind[0]) in kind, (node_id, name)
                elif "default" in options and "min" in options:
                    assert options["min"] <= options["default"] <= options["max"], (node_id, name)
        json.dumps(cls.INPUT_TYPES())  # /object_info must serialise


@pytest.mark.parametrize("path", UI, ids=lambda p: p.stem)
def test_ui_workflows_name_their_checkpoint_and_fit_the_screen(path):
    """The loader carries the front end's model metadata (the missing-checkpoint notice reads it), and the
    saved view shows the whole graph, two rows of groups, at a zoom where the front end still draws text."""
    workflow = load_json(path)
    loader = next(n for n in workflow["nodes"] if n["type"] == "Cosmos3ModelLoader")
    (model,) = loader["properties"]["models"]
    assert model["name"] == loader["widgets_values"][0] and model["directory"] == "cosmos3"
    assert model["url"].startswith("https://huggingface.co/nvidia/Cosmos3-")
    view = workflow["extra"]["ds"]
    assert 0.6 <= view["scale"] <= 1.0
    tops = {g["bounding"][1] for g in workflow["groups"]}
    assert len(tops) == 2
    for node in workflow["nodes"]:  # every node inside the 1600x1000 window at the saved view
        x, y = node["pos"]
        right = (x + node["size"][0] + view["offset"][0]) * view["scale"]
        bottom = (y + node["size"][1] + view["offset"][1]) * view["scale"]
        assert (x + view["offset"][0]) * view["scale"] >= 60 and (y - 30 + view["offset"][1]) * view["scale"] >= 100
        assert right <= 1600 and bottom <= 1000, (node["title"], right, bottom)
