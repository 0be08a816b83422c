"""The HTTP action endpoint without a server: SGLang-shaped requests become checked calls and a graph of the
pack's nodes, the graph runs like a workflow and gives what the runtime gives, and the answer has SGLang's shape.
Over real HTTP inside ComfyUI it is tested in test_comfyui_server.py."""

import base64
import importlib
import io
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from comfy_harness import CORE_NODES, execute

MODEL = "nvidia/Cosmos3-Edge-Policy-DROID"


@pytest.fixture(scope="module")
def api(pack):
    """The request and answer shapes every transport shares."""
    return pack.serving.requests


@pytest.fixture(scope="module")
def graph(pack):
    return pack.serving.graph


def serving(pack, name: str):
    """A module of the pack's serving package (ComfyUI's server imports them when it registers the routes)."""
    return importlib.import_module(f"{pack.serving.__name__}.{name}")


def installed(api, *names, capable=None):
    """The checkpoints a request is parsed against: `names` installed, all with an action head unless `capable`."""
    checkpoints = importlib.import_module(api.__package__ + ".checkpoints")
    names = names or (MODEL,)
    return checkpoints.Checkpoints(names, tuple(names if capable is None else capable))


def run_graph(graph, pack, call) -> dict:
    """What `graph.run` does, without ComfyUI's queue: the request's prompt executed by the harness."""
    with pack.serving.jobs.Job({"frames": [a.clip() for _, a in call.inputs]}, 0) as job:
        execute(graph.prompt_graph(call, job.key), {**pack.NODE_CLASS_MAPPINGS, **CORE_NODES})
        return job.results


@pytest.fixture
def droid_dir(tmp_path, monkeypatch, tiny_factory):
    root = tmp_path / "models"
    shutil.copytree(tiny_factory(kind="edge", action=True), root / MODEL)
    monkeypatch.setenv("COSMOS3_MODEL_DIRS", str(root))
    return root / MODEL


def png(height=300, width=400, seed=0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def b64(data: bytes) -> dict:
    return {"b64_json": base64.b64encode(data).decode()}


def policy_body(**parameters) -> dict:
    return {"model": MODEL, "input": {"task": "Pick up the red cube", "observation": {
        "images": {"exterior_image_1_left": b64(png())}, "domain_name": "droid_lerobot"}},
        "parameters": {"action_horizon": 4, "num_inference_steps": 2, "height": 256, **parameters}}


def test_a_policy_request_runs_as_a_graph_and_matches_the_runtime(api, graph, pack, droid_dir):
    from cosmos3_runtime import ActionRequest, load

    call = api.parse_request(policy_body(seed=7), installed(api))
    assert (call.action.preset, call.action.chunk_size, call.action.resolution_tier, call.seed) == ("sglang", 4, 256, 7)
    assert call.cache == "seacache"  # NVIDIA's default; "cache": "off" turns it off
    answer = api.envelope(call, run_graph(graph, pack, call), "prompt-1")
    (item,) = answer["data"]
    assert answer["object"] == "action.generation" and answer["model"] == MODEL
    assert item["action"]["shape"] == [4, 10] and item["action"]["domain_id"] == 8
    assert answer["usage"] == {"batch_size": 1, "action_horizon": 4, "action_dim": 10, "candidate_count": 1,
                               "denoise_steps": 2, "prefix_cache_hit": False}

    pipe = load(str(droid_dir), dtype="fp32", device="cpu")
    image = Image.open(io.BytesIO(png())).convert("RGB")
    direct = pipe.generate("Pick up the red cube", seed=7, steps=2, output="latents",
                           action=ActionRequest(mode="policy", chunk_size=4, domain="droid_lerobot", resolution_tier=256,
                                                image=np.array(image)[None], preset="sglang"))
    assert torch.allclose(torch.tensor(item["action"]["values"]), direct.actions, atol=1e-5)


def test_multipart_uploads_and_text_fields_are_typed_like_json(api):
    form = {"task": "Push the T", "domain_name": "pusht", "action_horizon": "8", "seed": "3", "guidance_scale": "2.5",
            "action_mode": "policy"}
    call = api.parse_request({}, installed(api), uploads={"image": png(64, 80)}, form=form)
    assert (call.inputs[0][0], call.action.domain, call.action.chunk_size, call.seed, call.guidance) == (
        "Push the T", "pusht", 8, 3, 2.5)
    assert call.action.clip().shape == (1, 64, 80, 3) and call.model == MODEL  # the one Policy checkpoint is the default


def test_observations_in_every_sglang_form_decode_to_the_same_frames(api):
    pixels = np.random.default_rng(1).integers(0, 256, (32, 48, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    forms = [b64(buffer.getvalue()), data_url, pixels.tolist(),
             {"values": pixels.reshape(-1).tolist(), "shape": [32, 48, 3], "dtype": "uint8"}]
    for value in forms:
        frames = api.decode_image(value, "image")
        assert frames.shape == (1, 32, 48, 3) and torch.equal((frames * 255).round().byte()[0], torch.from_numpy(pixels))


def test_an_uploaded_video_is_decoded_in_memory_up_to_the_frames_needed(api, tmp_path):
    from cosmos3_runtime.media import save_video

    path = save_video(torch.rand(12, 64, 96, 3), tmp_path / "clip.mp4", fps=10)
    frames = api.decode_video(path.read_bytes(), "video", num_frames=5)
    assert frames.shape == (5, 64, 96, 3)
    body = {"model": MODEL, "input": {"task": "", "observation": {"video": b64(path.read_bytes()),
            "action_mode": "inverse_dynamics", "domain_name": "droid_lerobot"}}}
    call = api.parse_request(body, installed(api))
    assert call.action.mode == "inverse_dynamics" and call.action.clip().shape == (12, 64, 96, 3)  # 12 of the 17 needed


def obs(**fields) -> dict:
    return {"model": MODEL, "input": {"task": "go", "observation": {"image": b64(png(32, 32)),
            "domain_name": "droid_lerobot", **fields}}}


REFUSED = [  # (request, the field the 400 names, words of the message)
    ("not an object", "body", "JSON object"),
    ({"model": MODEL, "input": {"task": "go", "observation": {"image": "/etc/passwd", "domain_name": "droid_lerobot"}}},
     "input.observation.image", "file paths"),
    ({"model": MODEL, "input": {"task": "go", "observation": {"image": b64(png(32, 32))}}},
     "input.observation.domain_name", "needs domain_name"),
    (obs(domain_name="mars_rover"), "input.observation.domain_name", "not a known domain"),
    (obs(domain_name="libero"), "input.observation.domain_name", "no fixed action width"),
    (obs(action_mode="forward_dynamics"), "input.observation.action_mode", "produces a video"),
    (obs(action_mode="dance"), "input.observation.action_mode", "policy, inverse_dynamics"),
    (obs(action_horizon=6), "input.observation.action_horizon", "multiple of 4"),
    (obs(action_horizon=0), "input.observation.action_horizon", "multiple of 4"),
    (obs(action_horizon=8, num_frames=8), "input.observation.num_frames", "action_horizon + 1 = 9"),
    (obs(raw_action_dim=7), "input.observation.raw_action_dim", "10 wide"),
    (obs(domain_name=None, domain_id=8), "input.observation.domain_id", "raw_action_dim is required"),
    (obs(action_mode="inverse_dynamics"), "input.observation.video", "needs a video"),
    (obs(video=b64(png(32, 32))), "input.observation.video", "not both"),
    (obs(image={"b64_json": "@@not base64@@"}), "input.observation.image", "not valid base64"),
    (obs(image=b64(b"not an image")), "input.observation.image", "cannot read image"),
    (obs(image=[[[300, 0, 0]]]), "input.observation.image", "uint8"),
    (obs(seed="lots"), "input.observation.seed", "integer"),
    (obs(num_inference_steps=0), "input.observation.num_inference_steps", "positive"),
    (obs(height=500), "input.observation.height", "256, 480, 704, 720"),
    (obs(action_view_point="drone"), "input.observation.action_view_point", "ego_view"),
    (obs(preset="droid-server"), "input.observation.state", "needs the robot state"),
    (obs(preset="droid-server", state=[0.0] * 7), "input.observation.state", "8 finite numbers"),
    (obs(candidate_count=5), "input.observation.candidate_count", "must be 1 to 4"),
    (obs(candidate_count=2, candidate_reducer="median"), "input.observation.candidate_reducer", "mean"),
    (obs(return_candidates="maybe"), "input.observation.return_candidates", "true or false"),
    (obs(cache="teacache"), "input.observation.cache", "must be one of seacache, off"),
    (obs(image=[b64(png(32, 32))] * 5), "input.observation.image", "at most 4"),
    (obs(image=[b64(png(32, 32))] * 2, candidate_count=2), "input.observation.candidate_count", "exactly one"),
    ({**obs(), "model": "../../etc"}, "model", "not an installed checkpoint"),
    ({**obs(), "runtime": {"response_format": "raw"}}, "runtime.response_format", "envelope"),
    ({**obs(), "input": {"task": ["a", "b"], "observation": obs()["input"]["observation"]}}, "input.task",
     "one per observation image (1), got 2"),
]


@pytest.mark.parametrize("body, where, words", REFUSED, ids=[r[1] + ":" + r[2] for r in REFUSED])
def test_bad_requests_are_refused_naming_the_field(api, body, where, words):
    if isinstance(body, dict) and "input" in body:
        body["input"]["observation"] = {k: v for k, v in body["input"]["observation"].items() if v is not None}
    with pytest.raises(api.FieldError) as error:
        api.parse_request(body, installed(api, MODEL, "Cosmos3-Nano"))
    assert error.value.field == where and words in str(error.value), str(error.value)
    assert error.value.status == 400 and error.value.body()["error"]["param"] == where


def test_an_oversized_image_is_refused_from_its_header(api, pack, monkeypatch):
    monkeypatch.setattr(pack.serving.fields, "MAX_FRAME_PIXELS", 100 * 100)
    with pytest.raises(api.FieldError) as error:
        api.decode_image(b64(png(200, 200)), "input.observation.image")
    assert error.value.status == 413 and "over the limit" in str(error.value)


def test_the_droid_server_preset_takes_the_state_and_answers_8_wide(api, graph):
    call = api.parse_request(obs(preset="droid-server", state=[0.1] * 7 + [1.0], raw_action_dim=8), installed(api))
    assert call.action.width == 8 and call.action.chunk_size == 32
    prompt = graph.prompt_graph(call, "k")
    assert prompt["state_0"]["inputs"]["values"] == ", ".join(["0.1"] * 7 + ["1.0"])
    assert prompt["action_0"]["inputs"]["state"] == ["state_0", 0]


def test_a_state_is_ignored_outside_the_droid_server_preset(api, graph):
    """SGLang clients often send their robot's state (any width); SGLang's Cosmos3 path does not use it."""
    call = api.parse_request(obs(state=[1.0, 2.0, 3.0]), installed(api))
    assert call.action.state is None and "state_0" not in graph.prompt_graph(call, "k")


def test_the_graph_uses_only_the_packs_nodes_at_their_defaults(api, graph, pack):
    prompt = graph.prompt_graph(api.parse_request(obs(), installed(api)), "k")
    assert {n["class_type"] for n in prompt.values()} <= set(pack.NODE_CLASS_MAPPINGS)
    sampler = prompt["sampler_0_0"]["inputs"]
    assert (sampler["width"], sampler["guidance"], sampler["seed"]) == (0, 0.0, 42)  # 0: the preset's value


def test_metadata_describes_the_defaults(api):
    meta = api.metadata(installed(api))
    assert meta["object"] == "action.metadata" and meta["defaults"]["num_inference_steps"] == 35
    assert meta["input"]["domains"]["pusht"] == {"domain_id": 4, "raw_action_dim": 2}


def test_a_failed_run_maps_to_the_status_that_says_whose_fault_it_was(pack):
    failure = pack.serving.jobs.failure

    def record(event, **data):
        return {"status": {"status_str": "error", "messages": [["execution_start", {}], [event, data]]}}

    refused = record("execution_error", exception_type="cosmos3_pack.cosmos3_runtime.errors.InputError",
                     node_type="Cosmos3Sampler", exception_message="this checkpoint has no action head\n")
    assert failure(refused) == (400, "Cosmos3Sampler: this checkpoint has no action head")
    assert failure(record("execution_error", exception_type="torch.OutOfMemoryError", node_type="Cosmos3Sampler",
                          exception_message="CUDA out of memory"))[0] == 500
    assert failure(record("execution_interrupted", node_type="Cosmos3Sampler")) == (503, "the run was cancelled on the server")


def test_a_body_without_a_length_is_cut_off_at_the_limit(api, pack):
    """Chunked uploads carry no Content-Length: the reader stops once the limit is passed, not at the end."""
    import asyncio

    sent = []

    async def next_chunk():
        sent.append(1)
        return b"x" * 2**19

    with pytest.raises(api.FieldError) as error:
        asyncio.run(serving(pack, "http")._read(next_chunk, 2**20, "image"))
    assert error.value.status == 413 and error.value.field == "image" and len(sent) == 3


def test_a_batch_and_candidates_run_as_parallel_chains_of_one_prompt(api, graph, pack, droid_dir):
    """Two observations with a prompt each equal two single requests; two candidates answer the mean of the runs
    at seed and seed + 1, each listed with return_candidates."""
    images = [b64(png(32, 32, seed=s)) for s in (1, 2)]
    body = policy_body(seed=5)
    body["input"] = {"task": ["Pick up the red cube", "Open the drawer"], "observation": {
        "image": images, "domain_name": "droid_lerobot"}}
    call = api.parse_request(body, installed(api))
    assert len(call.inputs) == 2 and [p for p, _ in call.inputs] == ["Pick up the red cube", "Open the drawer"]
    answer = api.envelope(call, run_graph(graph, pack, call), "p")
    assert [d["input_index"] for d in answer["data"]] == [0, 1] and answer["usage"]["batch_size"] == 2
    for i, (task, image) in enumerate(zip(["Pick up the red cube", "Open the drawer"], images)):
        single = policy_body(seed=5)
        single["input"] = {"task": task, "observation": {"image": image, "domain_name": "droid_lerobot"}}
        one = api.parse_request(single, installed(api))
        alone = api.envelope(one, run_graph(graph, pack, one), "p")["data"][0]["action"]["values"]
        assert answer["data"][i]["action"]["values"] == alone

    candidates = api.parse_request(policy_body(seed=5, candidate_count=2, return_candidates=True), installed(api))
    item = api.envelope(candidates, run_graph(graph, pack, candidates), "p", numpy=True)["data"][0]
    runs = [item["candidates"][c]["action"]["values"] for c in (0, 1)]
    assert [item["candidates"][c]["seed"] for c in (0, 1)] == [5, 6] and not np.array_equal(*runs)
    assert item["action"]["values"].dtype == np.float32 and item["candidate_reducer"] == "mean"
    np.testing.assert_allclose(item["action"]["values"], (runs[0] + runs[1]) / 2, rtol=1e-6)
    first = api.parse_request(policy_body(seed=5), installed(api))
    np.testing.assert_array_equal(api.envelope(first, run_graph(graph, pack, first), "p", numpy=True)["data"][0]
                                  ["action"]["values"], runs[0])


def test_msgpack_numpy_is_the_openpi_encoding(pack):
    codec = pack.serving.msgpack_numpy
    packed = codec.packb(np.zeros(2, np.float32))
    assert packed.hex() == ("84c40b5f5f6e6461727261795f5fc3c40464617461c4080000000000000000c4056474797065a33c6634"
                            "c40573686170659102")  # the bytes openpi's msgpack_numpy writes for np.zeros(2, float32)
    back = codec.unpackb(codec.packb({"image": np.arange(12, dtype=np.uint8).reshape(2, 2, 3), "x": np.float64(1.5)}))
    assert back["image"].shape == (2, 2, 3) and back["image"].flags.writeable and back["x"] == 1.5
    for bad in (b"\xc1", codec.packb({"__ndarray__": True, "data": b"\x00" * 3, "dtype": "<f4", "shape": [1]}),
                codec.packb({"__ndarray__": True, "data": b"", "dtype": "|O", "shape": [0]})):
        with pytest.raises(ValueError):
            codec.unpackb(bad)


def droid_observation(**extra) -> dict:
    rng = np.random.default_rng(0)
    return {"observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/joint_position": np.linspace(-1, 1, 7), "observation/gripper_position": np.array([0.25]),
            "prompt": "put the marker in the cup", **extra}


def test_a_droid_observation_becomes_a_droid_server_request(api, pack):
    openpi = serving(pack, "openpi")
    observation = droid_observation(seed=3, action_horizon=8)
    call = api.parse_request(openpi.action_request(observation), installed(api))
    a = call.action
    assert (a.preset, a.domain, a.chunk_size, call.seed, call.inputs[0][0]) == ("droid-server", "droid_lerobot", 8, 3,
                                                                                  "put the marker in the cup")
    np.testing.assert_allclose(a.state.numpy(), [*np.linspace(-1, 1, 7), 0.25], rtol=1e-6)
    canvas = openpi.composed(observation)
    assert canvas.shape == (540, 640, 3)
    assert canvas[360:, 320:].max() == 0  # no second exterior camera: its slot is black
    assert canvas[:360, :140].max() == 0 and canvas[:360, 140:500].mean() > 60  # wrist 224x224 -> 360x360, centred
    with_second = openpi.composed(droid_observation(**{"observation/exterior_image_2_left": np.full((90, 160, 3), 200,
                                                                                                    np.uint8)}))
    assert with_second[360:, 320:].min() == 200  # 16:9 fills its 180x320 slot


@pytest.mark.parametrize("change, key, words", [
    ({"observation/wrist_image_left": None}, "observation/wrist_image_left", "is missing"),
    ({"observation/joint_position": np.zeros(6)}, "observation/joint_position", "7 finite numbers"),
    ({"observation/gripper_position": np.array([np.nan])}, "observation/gripper_position", "1 finite numbers"),
    ({"observation/exterior_image_1_left": np.zeros((8, 8, 3), np.float32)}, "observation/exterior_image_1_left", "uint8"),
    ({"prompt": 3}, "prompt", "a string"),
])
def test_a_malformed_droid_observation_names_the_key(api, pack, change, key, words):
    observation = {k: v for k, v in {**droid_observation(), **change}.items() if v is not None}
    with pytest.raises(api.FieldError) as error:
        api.parse_request(serving(pack, "openpi").action_request(observation), installed(api))
    assert error.value.field == key and words in str(error.value), str(error.value)


def test_the_checkpoint_a_request_names_none_of(api, monkeypatch):
    """The request's name, else the URL's ?model=, else COSMOS3_ACTION_MODEL, else the one capable checkpoint."""
    monkeypatch.delenv("COSMOS3_ACTION_MODEL", raising=False)
    checkpoints = importlib.import_module(api.__package__ + ".checkpoints")
    two = installed(api, "Robot-A", "Robot-B", "Cosmos3-Edge", capable=("Robot-A", "Robot-B"))
    with pytest.raises(api.FieldError) as error:
        two.choose(None)
    for words in ("names no checkpoint", "`model` field", "`model` key", "?model=NAME", "COSMOS3_ACTION_MODEL",
                  "2 are installed: Robot-A, Robot-B"):
        assert words in str(error.value), str(error.value)
    assert error.value.field == "model" and two.default() is None
    by_url = checkpoints.Checkpoints(two.names, two.capable, url_choice="Robot-B")
    assert by_url.choose(None) == "Robot-B" and by_url.choose("Robot-A") == "Robot-A"
    monkeypatch.setenv("COSMOS3_ACTION_MODEL", "Robot-A")  # read at every request
    assert two.choose(None) == "Robot-A" == two.default() and by_url.choose(None) == "Robot-B"
    monkeypatch.setenv("COSMOS3_ACTION_MODEL", "Robot-C")
    with pytest.raises(api.FieldError, match="COSMOS3_ACTION_MODEL 'Robot-C' is not an installed checkpoint"):
        two.choose(None)
    with pytest.raises(api.FieldError, match="the URL's \\?model= '../x' is not an installed checkpoint"):
        checkpoints.Checkpoints(two.names, two.capable, url_choice="../x").choose(None)
    monkeypatch.delenv("COSMOS3_ACTION_MODEL")
    assert installed(api, "Robot-A", "Cosmos3-Edge", capable=("Robot-A",)).choose(None) == "Robot-A"
    with pytest.raises(api.FieldError, match="none is installed"):
        installed(api, "Cosmos3-Edge", capable=()).choose(None)


def test_capable_checkpoints_are_decided_by_their_config_not_their_name(api, tmp_path, monkeypatch, tiny_factory):
    root = tmp_path / "models"
    for name, options in {"robot-brain": dict(kind="edge", action=True), "My-Policy-DROID": dict(kind="edge"),
                          "Cosmos3-Super-4Step": dict(kind="gated", distilled=True)}.items():
        shutil.copytree(tiny_factory(**options), root / name)
    monkeypatch.setenv("COSMOS3_MODEL_DIRS", str(root))
    found = importlib.import_module(api.__package__ + ".checkpoints").action_checkpoints()
    assert found.names == ("Cosmos3-Super-4Step", "My-Policy-DROID", "robot-brain") and found.capable == ("robot-brain",)
    assert api.metadata(found)["default_model"] == "robot-brain"
