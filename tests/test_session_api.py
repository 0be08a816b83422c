"""The session route without a server: vLLM-Omni's typed ticks checked against the open session (refused by field and
status before anything is queued), and the tick graph run like a workflow, equal to the runtime's session. Over real
HTTP inside ComfyUI it is tested in test_comfyui_server.py, with the client docs/http-api.md shows."""

import importlib
import shutil

import numpy as np
import pytest
import torch

import cosmos3_runtime
from comfy_harness import CORE_NODES, execute
from cosmos3_runtime.action import ActionRequest
from cosmos3_runtime.tiny import make_tiny_checkpoint, sim_bimanual_block

MODEL = "Cosmos3-Nano-Sim-Bimanual"
W, H = 64, 32


@pytest.fixture(scope="module")
def ticks(pack):
    return importlib.import_module(f"{pack.serving.__name__}.ticks")


@pytest.fixture(scope="module")
def registry(pack):
    return importlib.import_module(f"{pack.serving.__name__}.session_registry")


@pytest.fixture
def bimanual(tmp_path, monkeypatch, registry):
    root = tmp_path / "models"
    make_tiny_checkpoint(root / MODEL, kind="gated", distilled=True, action=True, reasoner=False, dtype="float32",
                         causal=sim_bimanual_block(6))
    monkeypatch.setenv("COSMOS3_MODEL_DIRS", str(root))
    registry.SESSIONS.clear()
    yield root / MODEL
    registry.SESSIONS.clear()


def image() -> np.ndarray:
    return (np.random.default_rng(0).random((H, W, 3)) * 255).astype(np.uint8)


def values(seed: int = 0) -> list:
    return np.random.default_rng(seed).normal(size=(16, 29)).tolist()


def body(chunk=0, session="s1", seed=0, **extra) -> dict:
    tick = {"session_id": session, "request_id": f"r{chunk}", "chunk_index": chunk, "applied_event_ids": [chunk],
            "controls": [{"track": "robot_action", "schema": "robot_action.v1", "data": {"values": values(seed)}}]}
    tick.update(extra.pop("tick", {}))
    opening = {"prompt": "the robot folds a towel", "image": image().tolist(), "width": W, "height": H,
               "seed": 3} if chunk == 0 else {}
    return {"extra_args": {"ar_diffusion_tick": tick}, **opening, **extra}


def parse(ticks, payload):
    """A tick read and claimed (its session marked busy), as the route does before queueing it."""
    return ticks.claim(ticks.read_tick(payload, {}, ticks.session_checkpoints()))


def run(ticks, pack, payload) -> torch.Tensor:
    """What the route does around ComfyUI's queue: claim, run the tick graph (by the harness), finish."""
    call, result = parse(ticks, payload), None
    assert call.claim.replay is None
    try:
        with pack.serving.jobs.Job({"tick": call}, 1) as job:
            execute(ticks.tick_graph(call, job.key), {**pack.NODE_CLASS_MAPPINGS, **CORE_NODES})
            frames, fps = job.results[0]
        result = (ticks.to_pixels(frames), fps)
    finally:
        ticks.finish(call, result)
    return frames


def test_ticks_through_the_graph_give_the_runtime_sessions_frames(ticks, pack, bimanual):
    got = [run(ticks, pack, body(k, seed=k)) for k in range(3)]
    pipe = cosmos3_runtime.load(bimanual, dtype="fp32")
    frame = torch.from_numpy(image()).float().div(255)[None]
    with pipe.session("the robot folds a towel", action=ActionRequest(mode="forward_dynamics", image=frame,
                                                                      domain="agibotworld"),
                      width=W, height=H, seed=3) as s:
        want = [s.tick(torch.tensor(values(k), dtype=torch.float32)) for k in range(3)]
    assert [g.shape[0] for g in got] == [17, 16, 16]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=0)


def test_the_answer_follows_the_typed_tick(ticks, pack, bimanual):
    call = parse(ticks, body(0))
    frames = torch.rand(17, H, W, 3)
    answer = ticks.reply(call, ticks.to_pixels(frames), 30.0, numpy=True)
    assert answer["ar_diffusion"] == {"session_id": "s1", "request_id": "r0", "chunk_index": 0,
                                      "applied_event_ids": [0]}
    assert (answer["frame_index"], answer["first_frame"], answer["num_frames"]) == (0, 0, 17)
    assert answer["frames"].dtype == np.uint8 and answer["frames"].shape == (17, H, W, 3)
    call.tick["chunk_index"] = 2
    later = ticks.reply(call, ticks.to_pixels(frames[:16]), 30.0, numpy=False)
    assert (later["frame_index"], later["first_frame"]) == (9, 33) and "b64_json" in later["frames"][0]


@pytest.mark.parametrize("payload, field, status", [
    ({"prompt": "x"}, "ar_diffusion_tick", 400),
    (body(0, tick={"session_id": ""}), "ar_diffusion_tick.session_id", 400),
    (body(0, tick={"chunk_index": -1}), "ar_diffusion_tick.chunk_index", 400),
    (body(0, tick={"applied_event_ids": [3, 2]}), "ar_diffusion_tick.applied_event_ids", 400),
    (body(0, tick={"controls": []}), "ar_diffusion_tick.controls", 400),
    (body(0, tick={"controls": [{"track": "camera", "schema": "robot_action.v1", "data": {"values": values()}}]}),
     "ar_diffusion_tick.controls[0]", 400),
    (body(0, tick={"controls": [{"track": "robot_action", "schema": "robot_action.v1",
                                 "data": {"values": np.zeros((16, 9)).tolist()}}]}),
     "ar_diffusion_tick.controls[0].data.values", 400),
    (body(0, tick={"controls": [{"track": "robot_action", "schema": "robot_action.v1",
                                 "data": {"values": [[float("nan")] * 29] * 16}}]}),
     "ar_diffusion_tick.controls[0].data.values", 400),
    ({**body(0), "image": None}, "image", 400),
    ({**body(0), "prompt": ""}, "prompt", 400),
    (body(0, domain="droid_lerobot"), "domain", 400),
    (body(1), "ar_diffusion_tick.session_id", 404),
])
def test_bad_ticks_are_refused_by_field(ticks, bimanual, payload, field, status):
    with pytest.raises(ticks.FieldError) as refused:
        parse(ticks, payload)
    assert (refused.value.field, refused.value.status) == (field, status)


@pytest.mark.slow  # a session's ticks run between the refusals
def test_ticks_against_the_open_session_are_refused_by_field(ticks, pack, bimanual):
    run(ticks, pack, body(0))
    for payload, field, status, text in [
        (body(0, session="s2"), "ar_diffusion_tick.session_id", 409, "has session 's1' open"),
        (body(2), "ar_diffusion_tick.chunk_index", 409, "takes chunk 1 next"),
        (body(1, prompt="another prompt"), "prompt", 409, "needs reset"),
        (body(1, fps=15), "fps", 409, "needs reset"),
        ({**body(1), "image": image().tolist()}, "image", 400, "send reset with it"),
    ]:
        with pytest.raises(ticks.FieldError, match=text) as refused:
            parse(ticks, payload)
        assert (refused.value.field, refused.value.status) == (field, status)
    assert run(ticks, pack, body(1)).shape[0] == 16  # the session is still there, at chunk 1


@pytest.mark.slow
def test_a_later_tick_takes_the_width_of_the_sessions_embodiment(ticks, pack, bimanual):
    camera = {"controls": [{"track": "robot_action", "schema": "robot_action.v1",
                            "data": {"values": np.zeros((16, 9)).tolist()}}]}
    assert run(ticks, pack, body(0, domain="camera_pose", tick=camera)).shape[0] == 17
    assert run(ticks, pack, body(1, tick=camera)).shape[0] == 16  # no domain on the later tick: the session's


def test_a_tick_after_the_model_was_loaded_again_closes_the_session(ticks, registry, pack, bimanual):
    run(ticks, pack, body(0))
    registry.SESSIONS[MODEL].session.parts = object()  # as if another checkpoint's workflow had unloaded it
    with pytest.raises(Exception, match="loaded again since session 's1' opened"):
        run(ticks, pack, body(1))
    assert MODEL not in registry.SESSIONS


def test_a_claimed_session_refuses_a_second_tick_until_it_finishes(ticks, registry, pack, bimanual):
    run(ticks, pack, body(0))
    call = parse(ticks, body(1))
    with pytest.raises(ticks.FieldError, match="is running a tick") as refused:
        parse(ticks, body(1))
    assert refused.value.status == 409 and registry.reap(call.claim.open.used + 10**6) == []  # busy: not reaped
    ticks.finish(call, None)  # a failed tick closes its session
    assert MODEL not in registry.SESSIONS


@pytest.mark.slow
def test_a_retried_tick_gets_the_same_answer_and_runs_nothing(ticks, registry, pack, bimanual):
    run(ticks, pack, body(0))
    first = run(ticks, pack, body(1))
    retry = parse(ticks, body(1))  # the same request_id and chunk: the client did not get the answer
    replay = retry.claim.replay
    assert replay is not None and torch.equal(replay[0], ticks.to_pixels(first)) and not retry.claim.open.busy
    assert registry.SESSIONS[MODEL].next_chunk == 2
    with pytest.raises(ticks.FieldError, match="takes chunk 2 next"):
        parse(ticks, body(1, tick={"request_id": "another"}))  # a different request for a chunk that ran


def test_idle_sessions_are_closed_and_their_cache_freed(ticks, registry, pack, bimanual, monkeypatch):
    run(ticks, pack, body(0))
    opened = registry.SESSIONS[MODEL]
    assert opened.session.run is not None
    monkeypatch.setenv(registry.IDLE_ENV, "10")
    assert registry.reap(opened.used + 5) == [] and registry.reap(opened.used + 11) == [MODEL]
    assert MODEL not in registry.SESSIONS and opened.session is None
    with pytest.raises(ticks.FieldError) as refused:
        parse(ticks, body(1))
    assert refused.value.status == 404


def test_other_checkpoints_do_not_run_sessions(ticks, bimanual, tiny_factory):
    shutil.copytree(tiny_factory(kind="edge"), bimanual.parent / "Cosmos3-Edge")
    with pytest.raises(ticks.FieldError, match="does not run sessions") as refused:
        parse(ticks, {**body(0), "model": "Cosmos3-Edge"})
    assert refused.value.field == "model"
