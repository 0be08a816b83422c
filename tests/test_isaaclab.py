"""Isaac Lab's Cosmos camera protocol (`cosmos3_runtime.isaaclab`) on a tiny random framewise Sim-Transfer checkpoint,
fp32 on the CPU: whole episodes through the socket equal to the batch rollout, every refusal as the protocol's error
reply (the service going on), clients that drop mid-message, the endpoints' permissions, and shutdown. With
ISAACLAB_DIR (a checkout of isaac-sim/IsaacLab), Isaac Lab's own protocol and camera client drive an episode."""

import importlib
import json
import os
import re
import socket
import stat
import statistics
import struct
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT

import cosmos3_runtime
from cosmos3_runtime import controls, isaaclab
from cosmos3_runtime.errors import InputError
from cosmos3_runtime.media import to_uint8
from cosmos3_runtime.pipeline import planner
from cosmos3_runtime.tiny import make_tiny_checkpoint, sim_bimanual_block, sim_transfer_block

W, H = 64, 32
CAPTION = "a red ball rolls across a stone floor"
ISAACLAB_DIR = os.environ.get("ISAACLAB_DIR")  # a checkout of isaac-sim/IsaacLab: its client drives the service


@pytest.fixture(scope="module")
def pipe(tiny_factory):
    """Framewise, a window of 4 latent frames with 1 sink: a 17-frame episode evicts."""
    causal = sim_transfer_block(1, window_frames=4, sink_frames=1)
    return cosmos3_runtime.load(tiny_factory(kind="gated", dtype="float32", distilled=True, reasoner=False,
                                             causal=causal), dtype="fp32")


@pytest.fixture(scope="module")
def served(pipe, tmp_path_factory):
    """A service on a Unix socket for the module's tests (episodes capped at 41 frames)."""
    url = f"unix://{tmp_path_factory.mktemp('socket')}/cosmos.sock"
    service = isaaclab.Service(pipe, 41)
    with isaaclab.listening(url) as listener:
        thread = threading.Thread(target=service.serve, args=(listener,))
        thread.start()
        yield url
        service.stopping.set()
        thread.join()


@pytest.fixture
def endpoint(served):
    """The module's service, once the session of an earlier test's connection has ended."""
    idle(served)
    return served


def controls_clip(frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (frames, H, W, 3), dtype=np.uint8)


def batch(pipe, clip, prompt=CAPTION, seed=5, hint="edge") -> np.ndarray:
    frames = pipe.generate(prompt, control_videos={hint: torch.from_numpy(clip)}, width=W, height=H, seed=seed).frames
    return to_uint8(frames)


def play(client, clip, reset_seed=None, **prompt) -> np.ndarray:
    """The clip as Isaac Lab's camera sends it: its first frame (a reset's, with `reset_seed`), then updates of 4."""
    made = [client.step(clip[:1], reset_seed, **prompt)]
    return np.concatenate(made + [client.step(clip[i : i + 4]) for i in range(1, len(clip), 4)])


def test_status_reports_ready_and_the_capabilities(endpoint):
    with isaaclab.Client(endpoint) as client:
        reply = client.status()
    assert reply["ok"] and reply["ready"] and reply["session_active"] is False
    c = reply["capabilities"]
    assert c["canvases"] == [[480, 832], [544, 736], [640, 640], [736, 544], [832, 480]]  # (height, width)
    assert (c["max_episode_frames"], c["fps"], c["kv_window"], c["attention_sink"]) == (41, 30, 4, 1)
    assert (c["initial_frames"], c["update_frames"], c["num_views"], c["max_concurrent_streams"]) == (1, 4, 1, 1)
    assert c["modalities"] == ["edge", "blur", "depth", "seg"] and c["transports"] == ["socket"]
    assert c["partial_resets"] is False and c["device"] == "cpu"


def test_episodes_over_the_socket_are_the_batch_rollout_bit_for_bit(pipe, endpoint):
    """An episode at its budget, a reset with the next prompt and seed, an episode ended early (the first frames of
    the batch over its budget: the rollout is causal), close, and a new session on the same connection."""
    first, second = controls_clip(17), controls_clip(17, seed=1)
    with isaaclab.Client(endpoint) as client:
        client.open(CAPTION, "edge", H, W, 17, seed=5)
        assert client.status()["session_active"]
        assert np.array_equal(play(client, first), batch(pipe, first))  # with eviction: 5 latent frames, window 4
        got = play(client, second[:9], reset_seed=8, prompt="a blue cube slides over sand")
        assert np.array_equal(got, batch(pipe, second, "a blue cube slides over sand", seed=8)[:9])
        assert np.array_equal(play(client, first, reset_seed=5), batch(pipe, first, "a blue cube slides over sand"))
        client.close()
        assert not client.status()["session_active"]
        client.open(None, "edge", H, W, 17, seed=5)  # no prompt: the sentences alone
        assert np.array_equal(play(client, first[:5]), batch(pipe, first, "")[:5])


def test_blur_is_derived_from_the_cameras_rgb_as_the_authors_blur(pipe, endpoint):
    rgb = controls_clip(9, seed=2)
    with isaaclab.Client(endpoint) as client:
        client.open(CAPTION, "blur", H, W, 9, seed=5)
        got = play(client, rgb)
    assert np.array_equal(got, batch(pipe, controls.blur(rgb, isaaclab.BLUR_PRESET), hint="blur"))


def message(metadata: dict, arrays=(), version=2) -> bytes:
    """A message by hand: the header, the metadata, the arrays."""
    descriptors = [{"shape": list(a.shape), "dtype": "uint8", "nbytes": a.nbytes} for a in arrays]
    body = json.dumps({"version": version, "arrays": descriptors, **metadata}).encode()
    return isaaclab.HEADER.pack(b"ILCS", len(body), sum(a.nbytes for a in arrays)) + body + b"".join(
        a.tobytes() for a in arrays)


def refused(endpoint, *raw: bytes) -> str:
    """Send raw messages; the reply to the last must be an error, after which the service ends the connection."""
    family, address = isaaclab.parse_endpoint(endpoint)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(address)
        for data in raw:
            sock.sendall(data)
            reply, arrays = isaaclab.receive(sock)
        assert reply["ok"] is False and not arrays and reply["version"] == 2
        assert sock.recv(1) == b""  # the connection ended
    with isaaclab.Client(endpoint) as client:  # and the service goes on, its model free again
        assert client.status()["ready"] and not client.status()["session_active"]
    return reply["error"]


def idle(endpoint) -> None:
    """Wait until the service has no session (a dropped connection's end is read by its own thread)."""
    deadline = time.monotonic() + 30
    while True:
        with isaaclab.Client(endpoint) as client:
            if not client.status()["session_active"]:
                return
        assert time.monotonic() < deadline, "the session outlived its connection"
        time.sleep(0.05)


def raw(metadata: bytes, body: int = 0) -> bytes:
    return isaaclab.HEADER.pack(b"ILCS", len(metadata), body) + metadata


OPEN = dict(op="open", num_views=1, seeds=[5], prompt=CAPTION, modality="edge", height=H, width=W,
            max_episode_frames=9)
ONE = np.zeros((1, H, W, 3), np.uint8)
STEP = dict(op="step", reset_rows=[], seeds=[])


@pytest.mark.parametrize("raw, error", [
    (b"XXXX" + struct.pack("!IQ", 2, 0) + b"{}", "ProtocolError: not an Isaac Lab Cosmos message: the header starts "
                                                 "with b'XXXX'"),
    (struct.pack("!4sIQ", b"ILCS", 64 * 1024 + 1, 0), "over the protocol's limits"),
    (struct.pack("!4sIQ", b"ILCS", 10, 256 * 1024 * 1024 + 1), "over the protocol's limits"),
    (struct.pack("!4sIQ", b"ILCS", 0, 0), "over the protocol's limits"),
    (raw(b"\xff\xfe{}"), "not UTF-8 JSON"),
    (raw(b"[2]"), "a JSON object with an integer protocol version"),
    (raw(b'{"op":"status"}'), "a JSON object with an integer protocol version"),
    (message({"op": "status"}, version=3), "protocol version 3: this service speaks version 2"),
    (raw(b'{"version":2,"op":"status","x":NaN}'), "not UTF-8 JSON with finite numbers"),
    (message({"op": "status", "arrays": [{"shape": [1, 2, 2, 3], "dtype": "float32", "nbytes": 12}]}),
     "uint8 THWC images"),
    (message({"op": "status", "arrays": [{"shape": [1, 2, 2, 3], "dtype": "uint8", "nbytes": 12}] * 17}),
     "at most 16 descriptors"),
    (message({"op": "status", "arrays": [{"shape": [1, 2, 2, 3], "dtype": "uint8", "nbytes": 12}]}),
     "add up to 12 bytes; the header says 0"),
    (message({"op": "run", "code": "import os"}), "unknown operation 'run'"),
    (message({"op": "status", "extra": 1}), "'status' takes the fields op, version; not extra"),
    (message({"op": "status"}, [ONE]), "'status' takes no image arrays"),
    (message({**OPEN, "prompt": None, "modality": None}) , "modality None: this checkpoint takes edge, blur"),
    (message({k: v for k, v in OPEN.items() if k != "seeds"}), "missing seeds"),
    (message({**OPEN, "num_views": 2, "seeds": [5, 6]}), "num_views 2: this service generates one camera view"),
    (message({**OPEN, "seeds": [2**31]}), "integer seed\\(s\\) in \\[0, 2\\*\\*31\\)"),
    (message({**OPEN, "transport": "cuda_ipc", "ipc": {}}), "transport 'cuda_ipc': this service moves images "
                                                            "through the socket only"),
    (message({**OPEN, "max_episode_frames": 10}), "max_episode_frames 10: an episode is its first frame and "
                                                  "updates of 4, 1 \\+ 4k frames"),
    (message({**OPEN, "max_episode_frames": 1}), "max_episode_frames 1"),
    (message({**OPEN, "max_episode_frames": 45}), "over this service's cap of 41 frames"),
    (message({**OPEN, "height": 40}), "multiple of 16"),
    (message({**OPEN, "height": True}), "height must be a positive integer"),
    (message(STEP, [ONE]), "open a session before sending controls"),
])
def test_what_the_service_cannot_take_is_an_error_reply_naming_it(endpoint, raw, error):
    assert re.search(error, refused(endpoint, raw))


@pytest.mark.parametrize("step, arrays, error", [
    (dict(reset_rows=[1], seeds=[3]), [ONE], "reset_rows \\[1\\]: \\[\\] or \\[0\\]"),
    (dict(prompt="another"), [ONE], "a prompt changes only with an episode reset"),
    (dict(), [np.zeros((4, H, W, 3), np.uint8)], "this step carries 1 control frame \\(an episode's first 1"),
    (dict(reset_rows=[0], seeds=[3]), [np.zeros((4, H, W, 3), np.uint8)], "this step carries 1 control frame"),
    (dict(), [np.zeros((1, H, W + 16, 3), np.uint8)], "one control chunk \\[T, 32, 64, 3\\] \\(the session's canvas"),
    (dict(), [ONE, ONE], "one control chunk"),
    (dict(reset_rows=[0], seeds=[]), [ONE], "a step's reset takes 1 integer seed"),
])
def test_a_step_the_session_cannot_take_is_an_error_reply_and_frees_the_model(endpoint, step, arrays, error):
    assert re.search(error, refused(endpoint, message(OPEN), message({**STEP, **step}, arrays)))


def test_a_second_session_is_refused_while_one_is_open(endpoint):
    with isaaclab.Client(endpoint) as first:
        first.open(CAPTION, "edge", H, W, 9)
        with isaaclab.Client(endpoint) as second, pytest.raises(InputError, match="the service already has an active "
                                                                                 "session \\(one at a time\\)"):
            second.open(CAPTION, "edge", H, W, 9)
        with pytest.raises(InputError, match="this connection already has a session open"):
            first.open(CAPTION, "edge", H, W, 9)
    idle(endpoint)  # the first's session ends with its connection


def test_the_episode_budget_is_a_horizon_and_a_reset_starts_the_next(pipe, endpoint):
    clip = controls_clip(9)
    with isaaclab.Client(endpoint) as client:
        client.open(CAPTION, "edge", H, W, 9, seed=5)
        play(client, clip)
        with pytest.raises(InputError, match="made all 9 frames of its budget: reset"):
            client.step(clip[1:5])
    with isaaclab.Client(endpoint) as client:
        client.open(CAPTION, "edge", H, W, 9, seed=5)
        play(client, clip)
        assert np.array_equal(play(client, clip, reset_seed=5), batch(pipe, clip))


@pytest.mark.parametrize("cut", ["header", "metadata", "arrays"])
def test_a_client_that_drops_mid_message_ends_its_session_and_the_service_goes_on(endpoint, cut):
    family, address = isaaclab.parse_endpoint(endpoint)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(address)
        sock.sendall(message(OPEN))
        assert isaaclab.receive(sock)[0]["ok"]
        step = message(STEP, [ONE])
        sock.sendall(step[: {"header": 7, "metadata": 20, "arrays": len(step) - 100}[cut]])
    idle(endpoint)  # its session freed
    with isaaclab.Client(endpoint) as client:
        client.open(CAPTION, "edge", H, W, 9)


def test_endpoints_are_checked_and_a_unix_socket_is_the_users_alone(tmp_path):
    for bad in ("unix://relative.sock", "http://127.0.0.1:5555", "tcp://127.0.0.1", "tcp://127.0.0.1:0x10",
                "unix:///" + "a" * 120, "tcp://user@127.0.0.1:5555"):
        with pytest.raises(InputError, match="must be unix:///absolute/path or tcp://host:port"):
            isaaclab.parse_endpoint(bad)
    assert isaaclab.parse_endpoint("tcp://[::1]:5555") == (socket.AF_INET6, ("::1", 5555))
    path = tmp_path / "cosmos.sock"
    with isaaclab.listening(f"unix://{path}"):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        with pytest.raises(InputError, match="a service is already running at"):
            with isaaclab.listening(f"unix://{path}"):
                pass
        assert path.exists()  # (the refused one leaves the live service's socket alone)
    assert not path.exists()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a socket file nothing listens on: a stopped service's
    stale.close()
    with isaaclab.listening(f"unix://{path}"):
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
    path.write_text("not a socket")
    with pytest.raises(InputError, match="exists and is not a socket"):
        with isaaclab.listening(f"unix://{path}"):
            pass


def test_tcp_listens_on_loopback_unless_asked(pipe):
    with pytest.raises(InputError, match="listens beyond this machine.*--allow-remote"):
        with isaaclab.listening("tcp://0.0.0.0:0"):
            pass
    with isaaclab.listening("tcp://0.0.0.0:0", allow_remote=True) as listener:
        assert listener.getsockname()[0] == "0.0.0.0"
    service = isaaclab.Service(pipe)
    with isaaclab.listening("tcp://127.0.0.1:0") as listener:
        thread = threading.Thread(target=service.serve, args=(listener,))
        thread.start()
        url = isaaclab.endpoint_of(listener)
        with isaaclab.Client(url) as client:
            assert client.status()["capabilities"]["max_episode_frames"] == 201
            client.shutdown()  # the service stops: serve returns
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_a_shutdown_ends_open_sessions_and_the_socket_file(pipe, tmp_path):
    path = tmp_path / "s.sock"
    service = isaaclab.Service(pipe, None)
    with isaaclab.listening(f"unix://{path}") as listener:
        thread = threading.Thread(target=service.serve, args=(listener,))
        thread.start()
        with isaaclab.Client(f"unix://{path}") as camera, isaaclab.Client(f"unix://{path}") as other:
            camera.open(CAPTION, "edge", H, W, 9)
            assert other.status()["capabilities"]["max_episode_frames"] is None  # no cap
            other.shutdown()
            thread.join(timeout=30)
            assert not thread.is_alive() and service.owner is None
            with pytest.raises((ConnectionError, OSError)):
                camera.status()
    assert not path.exists()


def test_checkpoints_that_cannot_take_updates_of_4_frames_are_refused_by_name(tmp_path, tiny_factory):
    chunkwise = make_tiny_checkpoint(tmp_path / "cw", kind="gated", distilled=True, reasoner=False,
                                     causal=sim_transfer_block())
    bimanual = make_tiny_checkpoint(tmp_path / "bi", kind="gated", distilled=True, reasoner=False, action=True,
                                    causal=sim_bimanual_block())
    for root, error in ((chunkwise, "a chunkwise Sim-Transfer checkpoint \\(4 latent frames, 16 frames, a chunk\\): "
                                    "Isaac Lab's camera sends updates of 4 frames, one latent frame, so its service "
                                    "needs a framewise one"),
                        (bimanual, "this one is Sim-Bimanual"), (tiny_factory(kind="gated"), "this one is not causal")):
        with pytest.raises(InputError, match=error):
            isaaclab.probe(planner(root), {})


def test_make_tiny_writes_a_framewise_sim_transfer_checkpoint(tmp_path, capsys):
    from cosmos3_runtime.__main__ import main

    assert main(["make-tiny", str(tmp_path / "fw"), "--sim-transfer", "--framewise"]) == 0
    c = planner(tmp_path / "fw").variant.causal
    assert (c.chunk_size, c.window_frames, c.sink_frames) == (1, 30, 3) and "framewise" in capsys.readouterr().out
    assert main(["make-tiny", str(tmp_path / "bi"), "--sim-bimanual", "--framewise"]) == 2
    assert "--framewise is a Sim-Transfer layout: give it with --sim-transfer" in capsys.readouterr().err


def test_request_options_causal_rollouts_refuse_and_bad_caps_are_refused_at_start(pipe):
    with pytest.raises(InputError, match="steps 8 cannot apply"):
        isaaclab.Service(pipe, steps=8)
    with pytest.raises(InputError, match="max_episode_frames 10: an episode cap is 1 \\+ 4k frames"):
        isaaclab.Service(pipe, 10)


def test_a_warm_up_runs_one_episode_through_the_window_and_keeps_nothing(pipe):
    service = isaaclab.Service(pipe, causal_history="cpu")
    opened = []
    session = pipe.session

    def counting(*args, **options):
        opened.append(options)
        return session(*args, **options)

    pipe.session = counting
    try:
        service.warm_up(W, H)
    finally:
        del pipe.session
    assert opened == [dict(control="edge", num_frames=21, width=W, height=H, causal_history="cpu")]  # window 4 + 1
    assert service.owner is None


@pytest.mark.slow  # 200 chunks through the socket
def test_a_soak_of_200_chunks_over_episodes_keeps_memory_flat(endpoint):
    """Nineteen 41-frame episodes (their first frame and 10 updates each): 209 control chunks. The process's resident
    memory from the third episode on does not grow: the last six episodes' median within 8 MiB of the six after the
    second's (a MiB an episode would break it), and no sample 32 MiB from another (one of the allocator's can be 20
    off; after the first two episodes it settles, by 15 MiB either way)."""
    rss = []
    with isaaclab.Client(endpoint) as client:
        client.open(CAPTION, "edge", H, W, 41, seed=5)
        chunks = 0
        for k in range(20):
            clip = controls_clip(41, seed=k)
            play(client, clip, reset_seed=k if k else None)
            chunks += 11
            rss.append(resident_mib())
            if chunks >= 200:
                break
    later = rss[2:]
    assert chunks >= 200 and statistics.median(later[-6:]) - statistics.median(later[:6]) < 8, rss
    assert max(later) - min(later) < 32, rss


def resident_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


# --- Isaac Lab's own client ----------------------------------------------------------------------------------------

COSMOS = ("source", "isaaclab_experimental", "isaaclab_experimental", "cosmos")


@pytest.fixture
def isaac_lab(monkeypatch):
    """Isaac Lab's `_protocol` and camera client from the checkout at ISAACLAB_DIR, imported as themselves. Stubbed,
    only what they import that the checkout's protocol client does not need: the packages' lazy `__init__`s
    (isaaclab.utils.module.lazy_export), `isaaclab.sim.BackendCfg` (a plain base) and `isaaclab.utils.configclass`
    (a dataclass)."""
    if not ISAACLAB_DIR:
        pytest.skip("set ISAACLAB_DIR to a checkout of isaac-sim/IsaacLab to drive the service with its own client")
    cosmos = Path(ISAACLAB_DIR, *COSMOS)
    if not (cosmos / "_protocol.py").is_file() or not (cosmos / "client" / "cosmos_model.py").is_file():
        pytest.fail(f"ISAACLAB_DIR={ISAACLAB_DIR} has no {Path(*COSMOS)}/_protocol.py and client/cosmos_model.py")
    for name, path in (("isaaclab_experimental", cosmos.parent), ("isaaclab_experimental.cosmos", cosmos),
                       ("isaaclab_experimental.cosmos.client", cosmos / "client")):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        monkeypatch.setitem(sys.modules, name, package)
    for name, attributes in (("isaaclab", {}), ("isaaclab.sim", {"BackendCfg": type("BackendCfg", (), {})}),
                             ("isaaclab.utils", {"configclass": dataclass})):
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attributes))
    for name in ("_protocol", "client.cosmos_model", "client.cosmos_model_cfg"):
        monkeypatch.delitem(sys.modules, f"isaaclab_experimental.cosmos.{name}", raising=False)
    return types.SimpleNamespace(
        protocol=importlib.import_module("isaaclab_experimental.cosmos._protocol"),
        model=importlib.import_module("isaaclab_experimental.cosmos.client.cosmos_model"),
        cfg=importlib.import_module("isaaclab_experimental.cosmos.client.cosmos_model_cfg"))


def test_isaac_labs_own_client_drives_a_whole_episode_equal_to_the_batch(pipe, endpoint, isaac_lab):
    """Their `CosmosModel` camera stream: the episode's first frame, updates of 4, a reset starting the next prompt of
    its list with a new seed, close; their `_protocol.request` for status and the refusals."""
    status, _ = isaac_lab.protocol.request(endpoint, {"op": "status"})
    assert status["ready"] and status["capabilities"]["max_episode_frames"] == 41
    prompts = [CAPTION, "a blue cube slides over sand"]
    cfg = isaac_lab.cfg.CosmosModelCfg(endpoint=endpoint, prompt=prompts, modality="edge", max_episode_frames=17,
                                       transport="auto", timeout=120.0)
    model = isaac_lab.model.CosmosModel(cfg)
    stream = model.open_stream(1, (5,))
    first, second = torch.from_numpy(controls_clip(17)), torch.from_numpy(controls_clip(17, seed=1))
    made = [stream.step([first[:1]], (), ())] + [stream.step([first[i : i + 4]], (), ()) for i in range(1, 17, 4)]
    assert stream.transport == "socket"
    assert np.array_equal(torch.cat([m[0] for m in made]).numpy(), batch(pipe, first.numpy()))
    made = [stream.step([second[:1]], (0,), (8,))] + [stream.step([second[i : i + 4]], (), ()) for i in (1, 5)]
    assert np.array_equal(torch.cat([m[0] for m in made]).numpy(), batch(pipe, second.numpy(), prompts[1], 8)[:9])
    stream.close()
    model.close()
    assert not isaac_lab.protocol.request(endpoint, {"op": "status"})[0]["session_active"]
    too_long = isaac_lab.cfg.CosmosModelCfg(endpoint=endpoint, prompt=CAPTION, max_episode_frames=45)
    with pytest.raises(RuntimeError, match="Cosmos service rejected the request: InputError: max_episode_frames 45 is "
                                           "over this service's cap of 41 frames"):
        isaac_lab.model.CosmosModel(too_long).open_stream(1, (0,)).step([first[:1]], (), ())


# --- the command line ---------------------------------------------------------------------------------------------


@pytest.mark.slow  # a real service in a subprocess, warmed up
def test_serve_isaaclab_serves_until_a_shutdown(tmp_path):
    root = make_tiny_checkpoint(tmp_path / "fw", kind="gated", distilled=True, reasoner=False,
                                causal=sim_transfer_block(1, window_frames=4, sink_frames=1))
    url = f"unix://{tmp_path}/cosmos.sock"
    server = subprocess.Popen([sys.executable, "-m", "cosmos3_runtime", "serve-isaaclab", "--checkpoint", str(root),
                               "--endpoint", url, "--warmup", "--max-episode-frames", "0"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        with isaaclab.Client(url, wait=120) as client:
            assert client.status()["capabilities"]["max_episode_frames"] is None
            client.open(CAPTION, "edge", H, W, 9, seed=5)
            assert play(client, controls_clip(9)).shape == (9, H, W, 3)
            client.shutdown()
        out, _ = server.communicate(timeout=120)
    finally:
        server.kill()
    assert server.returncode == 0, out
    assert "warming up" in out and f"serving Isaac Lab's Cosmos cameras at {url}" in out
    assert not (tmp_path / "cosmos.sock").exists()


@pytest.mark.slow  # a subprocess that refuses before it loads anything
def test_serve_isaaclab_refuses_a_chunkwise_checkpoint_before_reading_weights(tmp_path):
    root = make_tiny_checkpoint(tmp_path / "cw", kind="gated", distilled=True, reasoner=False,
                                causal=sim_transfer_block())
    for weights in (root / "transformer").glob("*.safetensors"):
        weights.write_bytes(b"")  # never read
    done = subprocess.run([sys.executable, "-m", "cosmos3_runtime", "serve-isaaclab", "--checkpoint", str(root),
                           "--endpoint", f"unix://{tmp_path}/s.sock"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "needs a framewise one" in done.stderr
    assert not (tmp_path / "s.sock").exists()
