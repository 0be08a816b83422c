"""Robot clients against a real ComfyUI server (tier 3): msgpack over HTTP, SGLang's realtime websocket and the
openpi policy websocket, each driven by a real client. Skipped unless COMFYUI_DIR is set (like the server tests).

The realtime and msgpack checks use the `msgpack` and `websockets` packages; the openpi check runs the real
`openpi-client` package in OPENPI_PYTHON (an interpreter where `pip install openpi-client typing_extensions`
was run: the client pins numpy < 2, so it usually lives in a virtual environment of its own) and is skipped
without it.
"""

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import msgpack
import numpy as np
import pytest

from test_comfyui_server import DROID, FAST, MAX_CONNECTIONS, UPLOAD_LIMIT_MB, _alive, _call, comfyui_server, server  # noqa: F401

websockets_sync = pytest.importorskip("websockets.sync.client")
ws_errors = pytest.importorskip("websockets.exceptions")
OPENPI_PYTHON = os.environ.get("OPENPI_PYTHON")
pytestmark = [pytest.mark.skipif(not os.environ.get("COMFYUI_DIR"), reason="set COMFYUI_DIR to run these"),
              pytest.mark.slow]

ACTIONS = "/cosmos3/v1/actions/generations"
REALTIME = "/cosmos3/v1/actions/realtime"
OPENPI = "/cosmos3/openpi/policy"
IMAGE = np.random.default_rng(3).integers(0, 256, (96, 128, 3), dtype=np.uint8)


def _array_hook(obj):  # the msgpack-numpy decoding, written the client's way (bin keys)
    if b"__ndarray__" in obj:
        return np.frombuffer(obj[b"data"], dtype=np.dtype(obj[b"dtype"])).reshape(obj[b"shape"])
    return obj


def _array_default(value):
    if isinstance(value, np.ndarray):
        return {b"__ndarray__": True, b"data": value.tobytes(), b"dtype": value.dtype.str, b"shape": list(value.shape)}
    raise TypeError(type(value))


def pack(document) -> bytes:
    return msgpack.packb(document, default=_array_default, use_bin_type=True)


def unpack(data: bytes):
    return msgpack.unpackb(data, object_hook=_array_hook, raw=False)


def request(image, **parameters) -> dict:
    return {"model": DROID, "input": {"task": "Pick up the red cube", "observation": {
        "image": image, "domain_name": "droid_lerobot"}}, "parameters": {**FAST, "seed": 11, **parameters}}


def ws_url(url: str, route: str) -> str:
    return url.replace("http://", "ws://") + route


def post_msgpack(url: str, document: dict, accept: str | None = None) -> tuple[int, str, object]:
    headers = {"Content-Type": "application/msgpack", **({"Accept": accept} if accept else {})}
    http = urllib.request.Request(f"{url}{ACTIONS}", pack(document), headers)
    try:
        with urllib.request.urlopen(http, timeout=300) as response:
            return response.status, response.headers["Content-Type"], unpack(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], unpack(exc.read())


def test_msgpack_requests_get_msgpack_answers_with_the_json_routes_values(server):
    url, _ = server
    status, json_answer = _call(f"{url}{ACTIONS}", request(IMAGE.tolist()), timeout=300)
    assert status == 200, json_answer
    status, kind, answer = post_msgpack(url, request(IMAGE))
    assert status == 200 and kind == "application/msgpack", answer
    values = answer["data"][0]["action"]["values"]
    assert isinstance(values, np.ndarray) and values.dtype == np.float32 and values.shape == (4, 10)
    np.testing.assert_array_equal(values, np.asarray(json_answer["data"][0]["action"]["values"], dtype=np.float32))
    # a JSON request that asks for msgpack
    http = urllib.request.Request(f"{url}{ACTIONS}", json.dumps(request(IMAGE.tolist())).encode(),
                                  {"Content-Type": "application/json", "Accept": "application/msgpack"})
    with urllib.request.urlopen(http, timeout=300) as response:
        assert response.headers["Content-Type"] == "application/msgpack"
        np.testing.assert_array_equal(unpack(response.read())["data"][0]["action"]["values"], values)
    status, kind, refusal = post_msgpack(url, {"model": DROID, "input": {"task": "go", "observation": {"image": IMAGE}}})
    assert status == 400 and kind == "application/msgpack" and refusal["error"]["param"] == "input.observation.domain_name"


def test_a_batch_with_two_candidates_runs_as_one_queued_prompt(server):
    url, _ = server
    body = request([IMAGE.tolist(), IMAGE[::-1].tolist()])
    body["input"]["task"] = ["Pick up the red cube", "Open the drawer"]
    status, answer = _call(f"{url}{ACTIONS}", body, timeout=600)
    assert status == 200 and [d["input_index"] for d in answer["data"]] == [0, 1], answer
    single = _call(f"{url}{ACTIONS}", request(IMAGE.tolist()), timeout=300)[1]
    assert answer["data"][0]["action"]["values"] == single["data"][0]["action"]["values"]
    status, answer = _call(f"{url}{ACTIONS}", request(IMAGE.tolist(), candidate_count=2, return_candidates=True), timeout=600)
    assert status == 200, answer
    item = answer["data"][0]
    mean = np.mean([c["action"]["values"] for c in item["candidates"]], axis=0)
    np.testing.assert_allclose(item["action"]["values"], mean, rtol=1e-6)
    assert item["candidates"][0]["action"]["values"] == single["data"][0]["action"]["values"]  # candidate 0: the seed


def test_the_realtime_websocket_answers_like_the_http_route(server):
    url, _ = server
    expected = _call(f"{url}{ACTIONS}", request(IMAGE.tolist()), timeout=300)[1]["data"][0]["action"]["values"]
    with websockets_sync.connect(ws_url(url, REALTIME), max_size=None, open_timeout=30) as ws:
        hello = unpack(ws.recv(timeout=30))
        assert hello["object"] == "action.metadata" and hello["capabilities"]["realtime_websocket"] is True
        timings = []
        for _ in range(2):
            ws.send(pack(request(IMAGE)))
            answer = unpack(ws.recv(timeout=300))
            values = answer["data"][0]["action"]["values"]
            assert isinstance(values, np.ndarray) and values.dtype == np.float32
            np.testing.assert_array_equal(values, np.asarray(expected, dtype=np.float32))
            timings.append(answer["server_timing"])
        assert "prev_total_ms" not in timings[0] and timings[1]["prev_total_ms"] >= timings[0]["infer_ms"] > 0
    _alive(url)


@pytest.mark.parametrize("frame, words", [
    (pack({"model": DROID, "input": {"task": "go", "observation": {"image": IMAGE}}}), "input.observation.domain_name"),
    ("a text frame", "binary msgpack"),
    (b"\xc1 not msgpack", "not a msgpack document"),
])
def test_realtime_errors_are_a_binary_frame_then_close_1011_and_the_server_goes_on(server, frame, words):
    url, _ = server
    with websockets_sync.connect(ws_url(url, "/api" + REALTIME), max_size=None) as ws:
        ws.recv(timeout=30)
        ws.send(frame)
        error = ws.recv(timeout=60)
        assert isinstance(error, bytes) and words in unpack(error)["error"], unpack(error)
        with pytest.raises(ws_errors.ConnectionClosed):
            ws.recv(timeout=30)
        assert ws.close_code == 1011
    with websockets_sync.connect(ws_url(url, REALTIME), max_size=None) as ws:  # the next connection works
        assert unpack(ws.recv(timeout=30))["object"] == "action.metadata"


def test_connections_are_bounded_and_a_client_that_leaves_mid_run_leaves_the_queue_clean(server):
    url, _ = server
    with contextlib.ExitStack() as stack:
        for _ in range(MAX_CONNECTIONS):
            stack.enter_context(websockets_sync.connect(ws_url(url, REALTIME), max_size=None))
        with pytest.raises(ws_errors.InvalidStatus) as refused:
            websockets_sync.connect(ws_url(url, REALTIME))
        assert refused.value.response.status_code == 503 and b"COSMOS3_API_MAX_CONNECTIONS" in refused.value.response.body
    with websockets_sync.connect(ws_url(url, REALTIME), max_size=None) as ws:  # over the message size limit: 1009
        ws.recv(timeout=30)
        ws.send(b"\x00" * (UPLOAD_LIMIT_MB * 2**20 + 1))
        with pytest.raises(ws_errors.ConnectionClosed):
            ws.recv(timeout=30)
        assert ws.close_code == 1009
    # Clients that hang up while their request waits behind a long run: their prompts leave the queue unrun.
    blocker = threading.Thread(target=_call, args=(f"{url}{ACTIONS}", request(IMAGE.tolist(), num_inference_steps=60)),
                               kwargs={"timeout": 600})
    blocker.start()
    _wait(url, lambda queue: queue["queue_running"])
    for _ in range(3):
        with websockets_sync.connect(ws_url(url, REALTIME), max_size=None) as ws:
            ws.recv(timeout=30)
            ws.send(pack(request(IMAGE, seed=99)))
    blocker.join()
    _wait(url, lambda queue: not queue["queue_running"] and not queue["queue_pending"])
    seeds = [node["inputs"].get("seed") for record in _call(f"{url}/history")[1].values()
             for node in record["prompt"][2].values() if node["class_type"] == "Cosmos3Sampler"]
    assert 11 in seeds and 99 not in seeds, seeds  # the long run ran; none of the abandoned ones did
    assert _call(f"{url}{ACTIONS}", request(IMAGE.tolist()), timeout=300)[0] == 200


def _wait(url: str, condition, timeout: float = 300) -> None:
    """Until ComfyUI's queue ({"queue_running", "queue_pending"}) meets `condition`."""
    deadline = time.monotonic() + timeout
    while not condition(queue := _call(f"{url}/queue")[1]):
        assert time.monotonic() < deadline, queue
        time.sleep(0.2)


OPENPI_CLIENT = r"""
import json, sys, time
import numpy as np
from openpi_client import action_chunk_broker, websocket_client_policy

uri = sys.argv[1]
rng = np.random.default_rng(0)
observation = {
    "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
    "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
    "observation/joint_position": np.linspace(-0.5, 0.5, 7),
    "observation/gripper_position": np.array([0.3]),
    "prompt": "put the marker in the cup",
    "action_horizon": 8, "num_inference_steps": 2,
}
report = {}
policy = websocket_client_policy.WebsocketClientPolicy(uri)
report["metadata"] = policy.get_server_metadata()
start = time.perf_counter()
first = policy.infer(observation)
report["total_ms"] = (time.perf_counter() - start) * 1000
second = policy.infer(observation)
report["shape"], report["dtype"] = list(first["actions"].shape), str(first["actions"].dtype)
report["same"] = bool(np.array_equal(first["actions"], second["actions"]))
report["timing"] = [first["server_timing"], second["server_timing"]]
broker = action_chunk_broker.ActionChunkBroker(policy, action_horizon=8)
rows = [broker.infer(observation)["actions"] for _ in range(3)]
report["broker_rows"] = [list(r.shape) for r in rows]
report["broker_first_row"] = bool(np.allclose(rows[0], first["actions"][0]))
broken = dict(observation)
del broken["observation/wrist_image_left"]
try:
    policy.infer(broken)
    report["error"] = None
except RuntimeError as exc:
    report["error"] = str(exc)
policy._ws.close()
again = websocket_client_policy.WebsocketClientPolicy(uri)
report["after_error_shape"] = list(again.infer(observation)["actions"].shape)
again._ws.close()
print(json.dumps(report))
"""


@pytest.mark.skipif(not OPENPI_PYTHON, reason="set OPENPI_PYTHON to an interpreter with openpi-client installed")
def test_the_openpi_client_drives_the_policy_websocket(server):
    url, _ = server
    done = subprocess.run([OPENPI_PYTHON, "-c", OPENPI_CLIENT, ws_url(url, OPENPI)], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    meta = report["metadata"]
    assert meta["action_space"] == "joint_position" and meta["action_dim"] == 8 and meta["n_external_cameras"] == 2
    assert report["shape"] == [8, 8] and report["dtype"] == "float32" and report["same"]
    assert report["broker_rows"] == [[8]] * 3 and report["broker_first_row"]
    assert "observation/wrist_image_left" in report["error"] and "is missing" in report["error"]
    assert report["after_error_shape"] == [8, 8]
    assert report["timing"][1]["prev_total_ms"] > 0
    _alive(url)


# Two action checkpoints, neither named like a policy: a request that names none must be told how to choose.
TWO_POLICIES = {"Robot-A": dict(kind="edge", action=True), "Robot-B": dict(kind="edge", action=True, seed=1)}
CHOOSING = r"""
import json, sys
import numpy as np
from openpi_client import websocket_client_policy

uri, mode = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
observation = {
    "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
    "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
    "observation/joint_position": np.zeros(7), "observation/gripper_position": np.zeros(1),
    "prompt": "put the marker in the cup", "action_horizon": 4, "num_inference_steps": 1,
}
if mode == "observation-key":
    observation["model"] = "Robot-A"
policy = websocket_client_policy.WebsocketClientPolicy(uri)
report = {"metadata": policy.get_server_metadata()}
try:
    report["prompt_id"] = policy.infer(observation)["prompt_id"]
except RuntimeError as exc:
    report["error"] = str(exc)
policy._ws.close()
print(json.dumps(report))
"""


def _openpi(uri: str, mode: str = "plain") -> dict:
    done = subprocess.run([OPENPI_PYTHON, "-c", CHOOSING, uri, mode], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _served_by(url: str, prompt_id: str) -> str:
    """The checkpoint the queued prompt loaded."""
    record = _call(f"{url}/history/{prompt_id}")[1][prompt_id]
    return next(n["inputs"]["model_name"] for n in record["prompt"][2].values() if n["class_type"] == "Cosmos3ModelLoader")


@pytest.mark.skipif(not OPENPI_PYTHON, reason="set OPENPI_PYTHON to an interpreter with openpi-client installed")
def test_with_two_action_checkpoints_the_openpi_client_is_told_how_to_choose_and_the_url_chooses(tmp_path, tiny_factory):
    with comfyui_server(tmp_path / "base", TWO_POLICIES, tiny_factory) as url:
        plain = _openpi(ws_url(url, OPENPI))
        assert plain["metadata"]["action_models"] == ["Robot-A", "Robot-B"] and plain["metadata"]["default_model"] is None
        for words in ("names no checkpoint", "`model` key", "?model=NAME", "COSMOS3_ACTION_MODEL", "Robot-A, Robot-B"):
            assert words in plain["error"], plain["error"]
        chosen = _openpi(ws_url(url, OPENPI) + "?model=Robot-B")
        assert chosen["metadata"]["default_model"] == "Robot-B" and _served_by(url, chosen["prompt_id"]) == "Robot-B"
        keyed = _openpi(ws_url(url, OPENPI) + "?model=Robot-B", "observation-key")
        assert _served_by(url, keyed["prompt_id"]) == "Robot-A"  # the observation's key wins
        _alive(url)


@pytest.mark.skipif(not OPENPI_PYTHON, reason="set OPENPI_PYTHON to an interpreter with openpi-client installed")
def test_the_server_setting_serves_an_unmodified_openpi_client(tmp_path, tiny_factory):
    with comfyui_server(tmp_path / "base", TWO_POLICIES, tiny_factory, env={"COSMOS3_ACTION_MODEL": "Robot-B"}) as url:
        plain = _openpi(ws_url(url, OPENPI))
        assert plain["metadata"]["default_model"] == "Robot-B" and _served_by(url, plain["prompt_id"]) == "Robot-B"
        keyed = _openpi(ws_url(url, OPENPI), "observation-key")
        assert _served_by(url, keyed["prompt_id"]) == "Robot-A"
        status, answer = _call(f"{url}{ACTIONS}", {**request(IMAGE.tolist()), "model": None}, timeout=300)
        assert status == 200 and answer["model"] == "Robot-B", answer  # the HTTP route: the same rule


def documented_clients() -> dict[str, str]:
    """The robot-client snippets of docs/http-api.md ({its "# robot client: ..." title: code})."""
    from conftest import ROOT

    text = (ROOT / "docs" / "http-api.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    return {b.splitlines()[0]: b for b in blocks if b.startswith("# robot client:")}


@pytest.mark.parametrize("title", sorted(documented_clients()))
def test_the_documented_client_snippets_run(server, title):
    url, _ = server
    python = OPENPI_PYTHON if "openpi" in title else sys.executable
    if python is None:
        pytest.skip("set OPENPI_PYTHON to an interpreter with openpi-client installed")
    done = subprocess.run([python, "-c", documented_clients()[title]], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COSMOS3_URL": url})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), title
