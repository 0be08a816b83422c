"""Latency of each robot transport against the model run it carries, from one run against a live server.

    python benchmarks/bench_transports.py --url http://127.0.0.1:8188 [--requests 5]

The server needs a Policy-DROID checkpoint in models/cosmos3 (a tiny one works: the overhead does not depend on
the model). For each transport (HTTP JSON, HTTP msgpack, the realtime websocket, the openpi websocket, each
with the same observation; and the chat completions route, the same image as a data URL with a question, 8
greedy tokens from the same checkpoint's Reasoner), the median over the requests of: the client's round trip,
ComfyUI's execution of the queued prompt (from its history: execution start to success), and their
difference, which is what the transport adds (encoding, the wire, parsing, queueing, the answer). Needs
`websockets` and `msgpack`.
Not a test: numbers depend on the machine.
"""

import argparse
import importlib.util
import json
import statistics
import time
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
from websockets.sync.client import connect

# the pack's msgpack-numpy codec (a module without imports of the pack, loaded by path)
_spec = importlib.util.spec_from_file_location("msgpack_numpy", Path(__file__).resolve().parents[1] / "nodes" / "serving"
                                               / "msgpack_numpy.py")
codec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(codec)
packb, unpackb = codec.packb, codec.unpackb

IMAGE = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
PARAMETERS = {"action_horizon": 8, "num_inference_steps": 2, "seed": 1}


def sglang_request() -> dict:
    return {"input": {"task": "pick up the cup", "observation": {"image": IMAGE, "domain_name": "droid_lerobot"}},
            "parameters": {**PARAMETERS, "height": 256}}


def droid_observation() -> dict:
    return {"observation/exterior_image_1_left": IMAGE, "observation/wrist_image_left": IMAGE,
            "observation/joint_position": np.zeros(7), "observation/gripper_position": np.zeros(1),
            "prompt": "pick up the cup", **PARAMETERS}


def execution_ms(url: str, prompt_id: str) -> float:
    with urllib.request.urlopen(f"{url}/history/{prompt_id}") as response:
        messages = json.loads(response.read())[prompt_id]["status"]["messages"]
    stamps = {event: data["timestamp"] for event, data in messages}
    return stamps["execution_success"] - stamps["execution_start"]


def http(url: str, encoding: str):
    body = sglang_request()
    if encoding == "json":
        body["input"]["observation"]["image"] = IMAGE.tolist()
        data, kind = json.dumps(body).encode(), "application/json"
    else:
        data, kind = packb(body), "application/msgpack"
    request = urllib.request.Request(f"{url}/cosmos3/v1/actions/generations", data, {"Content-Type": kind})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        raw = response.read()
    total = (time.perf_counter() - start) * 1000
    answer = json.loads(raw) if encoding == "json" else unpackb(raw)
    return total, answer["cosmos3"]["prompt_id"]


def chat(url: str, model: str):
    from PIL import Image
    import base64
    import io

    buffer = io.BytesIO()
    Image.fromarray(IMAGE).save(buffer, format="PNG")
    image = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    body = {"model": model, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "What is on the table?"}]}]}
    request = urllib.request.Request(f"{url}/cosmos3/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        raw = response.read()
    return (time.perf_counter() - start) * 1000, json.loads(raw)["cosmos3"]["prompt_id"]


def websocket(url: str, route: str, document: dict, count: int, prompt_id_of):
    rows = []
    with connect(url.replace("http", "ws", 1) + route, max_size=None, compression=None) as ws:
        ws.recv()  # metadata
        for _ in range(count):
            start = time.perf_counter()
            ws.send(packb(document))
            answer = unpackb(ws.recv())
            rows.append(((time.perf_counter() - start) * 1000, prompt_id_of(answer)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8188")
    parser.add_argument("--requests", type=int, default=5)
    args = parser.parse_args()
    http(args.url, "json")  # warm-up: the checkpoint loads
    with urllib.request.urlopen(f"{args.url}/cosmos3/v1/models") as response:
        model = json.loads(response.read())["data"][0]["id"]
    chat(args.url, model)  # warm-up: the Reasoner's parts load
    runs = {
        "HTTP JSON (pixel lists)": [http(args.url, "json") for _ in range(args.requests)],
        "HTTP msgpack": [http(args.url, "msgpack") for _ in range(args.requests)],
        "realtime websocket": websocket(args.url, "/cosmos3/v1/actions/realtime", sglang_request(), args.requests,
                                        lambda a: a["cosmos3"]["prompt_id"]),
        "openpi websocket": websocket(args.url, "/cosmos3/openpi/policy", droid_observation(), args.requests,
                                      lambda a: a["prompt_id"]),
        "chat completions (image data URL, 8 tokens)": [chat(args.url, model) for _ in range(args.requests)],
    }
    print(f"{args.requests} requests each, 224x224 observation, medians in ms")
    print("| transport | round trip | ComfyUI execution | transport overhead |")
    print("|---|---|---|---|")
    for name, rows in runs.items():
        total = statistics.median(t for t, _ in rows)
        run = statistics.median(execution_ms(args.url, p) for _, p in rows)
        print(f"| {name} | {total:.0f} | {run:.0f} | {total - run:.0f} ({(total - run) / total:.0%}) |")
    print(json.dumps({"msgpack": msgpack.version}))


if __name__ == "__main__":
    main()
