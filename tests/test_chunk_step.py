"""The fixed-shape chunk step (`chunk_step`): a causal rollout's steady-state denoising forward captured once over
static buffers and replayed, on the CPU. A CUDA graph replays the kernels its capture recorded, over the same static
buffers; here a stand-in replays by calling the captured forward again on them (`Rerun`), or by a torch.compile'd
whole graph of it (`Traced`, fullgraph: a host read or a graph break in the captured region fails it). The rollouts
and a session through it equal the eager ones bit for bit; the CUDA capture itself runs on the meta device with
torch.cuda's stream and graph calls recorded, and no host read or host data inside it; and compile applies to causal
rollouts, the compiled block's history equal to the eager one."""

from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch
from torch._dynamo.utils import counters
from test_causal import H, W, chunkwise, clip, framewise, rollout  # noqa: F401 (fixtures)
from virtual_device import TO_HOST, VirtualDevice

import cosmos3_runtime
from cosmos3_runtime import chunk_step, devices, transformer
from cosmos3_runtime.action import ActionRequest
from cosmos3_runtime.devices import DeviceFacts
from cosmos3_runtime.tiny import make_tiny_checkpoint, sim_bimanual_block, transformer_config
from cosmos3_runtime.transformer import Cosmos3Transformer, DecoderLayer, MediaKV, Segment, TransformerConfig

META = torch.device("meta")


@pytest.fixture(scope="module")
def bimanual(tmp_path_factory):
    root = make_tiny_checkpoint(tmp_path_factory.mktemp("bi") / "ckpt", kind="gated", dtype="float32",
                                distilled=True, action=True, reasoner=False, causal=sim_bimanual_block(5))
    return cosmos3_runtime.load(root, dtype="fp32")


class Rerun:
    """`CudaGraph`'s interface on the CPU: the capture calls the forward over the static buffers (its warm-up), each
    replay calls it again on them and returns what it made, as a replay returns the capture's outputs."""

    events: list[str]

    def __init__(self, fn):
        self.fn = fn
        self.events.append("capture")
        fn()

    def __call__(self):
        self.events.append("replay")
        return self.fn()


class Traced(Rerun):
    """The captured forward compiled whole (fullgraph, the eager backend: the same ops, traced): a host read (.item(),
    bool(tensor), .tolist()) or anything else that breaks the graph inside the captured region raises, and so does a
    replay whose inputs no longer pass the trace's guards (a recompile: what a CUDA graph would replay stale)."""

    def __init__(self, fn):
        torch._dynamo.reset()
        super().__init__(torch.compile(fn, fullgraph=True, backend="eager"))

    def __call__(self):
        with torch._dynamo.config.patch(error_on_recompile=True):
            return super().__call__()


@pytest.fixture
def stepped(monkeypatch):
    """Rollouts on the CPU run their chunks through the fixed-shape step, replayed by `how`; -> its events."""
    events = []

    def use(how):
        monkeypatch.setattr(how, "events", events, raising=False)
        monkeypatch.setattr(chunk_step, "for_run", lambda model, device, history: chunk_step.ChunkStep(model, how))
        return events

    return use


@pytest.fixture(scope="module")
def eager_framewise(framewise):
    return rollout(framewise, 21).latents


def test_a_framewise_rollout_through_the_traced_step_is_bit_identical(framewise, eager_framewise, stepped):
    """Window 4 with 1 sink: chunks 3 to 5 hold the same history; chunk 3 runs eagerly, 4 is captured, 4 and 5
    replay. Chunks before (more history each time) and the commits run eagerly."""
    events = stepped(Traced)
    assert torch.equal(rollout(framewise, 21).latents, eager_framewise)
    assert events == ["capture"] + ["replay"] * 8  # 2 chunks of 4 steps


def test_a_chunkwise_rollout_with_eviction_through_the_step_is_bit_identical(chunkwise, stepped):
    """Chunks of 4 in a window of 5: the chunks at 1, 5 and 9 each keep 1 latent frame of history."""
    eager = rollout(chunkwise, 49, causal_window=5).latents
    events = stepped(Rerun)
    assert torch.equal(rollout(chunkwise, 49, causal_window=5).latents, eager)
    assert events == ["capture"] + ["replay"] * 8


def test_a_rollout_that_keeps_all_history_never_captures(chunkwise, stepped):
    events = stepped(Rerun)
    rollout(chunkwise, 33)
    assert events == []


def test_sim_bimanual_ticks_through_the_step_equal_the_eager_batch(bimanual, stepped, compiled_block):
    """Window 5, chunks of 4: from the tick at latent frame 5 on each holds 5 frames of history; its actions (rows
    beside the video, their positions moving with the chunk) go through static buffers too. The ticks run compiled:
    a session's block is made once (made each tick, a new one each time, no shape repeated and nothing was captured)."""
    table = torch.randn(64, 29, generator=torch.Generator().manual_seed(1))
    first = torch.rand(1, H, W, 3, generator=torch.Generator().manual_seed(0))

    def request(actions=None, compile=False):
        return dict(action=ActionRequest(mode="forward_dynamics", image=first, actions=actions, domain="agibotworld"),
                    width=W, height=H, seed=7, compile=compile)

    eager = bimanual.generate("the robot folds a towel", **request(table)).frames
    events = stepped(Rerun)
    with bimanual.session("the robot folds a towel", **request(compile=True)) as s:
        ticks = torch.cat([s.tick(table[16 * k : 16 * (k + 1)]) for k in range(4)])
    assert torch.equal(ticks, eager)
    assert events == ["capture"] + ["replay"] * 4  # ticks 3 and 4, two steps each


def test_the_step_is_chosen_once_a_run_from_the_device(framewise, monkeypatch):
    model = framewise.transformer
    assert chunk_step.for_run(model, torch.device("cpu"), "device") is None  # no CUDA graphs here: eager
    monkeypatch.setitem(devices._FACTS, ("meta", None), DeviceFacts("cuda", (9, 0)))
    step = chunk_step.for_run(model, META, "device")
    assert isinstance(step, chunk_step.ChunkStep) and step.graph is chunk_step.CudaGraph
    assert chunk_step.for_run(model, META, "cpu") is None and chunk_step.for_run(model, META, "fp8") is None
    monkeypatch.setitem(devices._FACTS, ("meta", None), DeviceFacts("cuda", (9, 4), rocm=True))
    assert chunk_step.for_run(model, META, "device") is None


class HostRead(AssertionError):
    pass


class Captured(VirtualDevice):
    """What a CUDA graph's capture refuses or gets wrong, on the meta device: a host read (it waits for the device:
    illegal while capturing), a copy of host data to the device (recorded once, replayed stale), a mix of devices."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default):
            raise HostRead(f"{func} reads a value back inside the captured region")
        if func is torch.ops.aten.copy_.default:
            source, target = args[1], args[0].device
        elif func in TO_HOST:  # (the same ops copy to the device)
            source, target = args[0], (kwargs or {}).get("device", args[1] if len(args) > 1 else None)
        else:
            source = target = None
        if source is not None and source.device.type == "cpu" and target == META:
            raise HostRead(f"{func} copies host data into the captured region")
        return super().__torch_dispatch__(func, types, args, kwargs)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's stream and graph calls (a CPU-only torch has none), recording what the capture does; the warm-up
    on the side stream and the capture run under `Captured` (the warm-up calls what is captured)."""
    events = []

    class Stream:
        def wait_stream(self, other):
            pass

    class CUDAGraph:
        def replay(self):
            events.append("replay")

    @contextmanager
    def stream(s):
        events.append("side stream")
        with Captured():
            yield

    @contextmanager
    def graph(g):
        events.append("capture")
        with Captured():
            yield

    for name, value in (("Stream", Stream), ("stream", stream), ("current_stream", Stream), ("CUDAGraph", CUDAGraph),
                        ("graph", graph)):
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setitem(devices._FACTS, ("meta", None), DeviceFacts("cuda", (9, 0)))
    return events


def meta_step(hooks_change=lambda hooks: hooks, timesteps=META):
    """A Sim-Bimanual-shaped step on the meta device (a tiny model with an action head, 6 frames of history held)
    driven over three chunks of two steps, its timesteps on `timesteps`; -> its velocities."""
    config = TransformerConfig.from_dict(transformer_config("gated", action=True))
    with META:
        model = Cosmos3Transformer(config)
    step = chunk_step.for_run(model, META, "device")
    tokens = 6 + 4  # 3 x 2 patches and 4 action rows a frame
    cache = MediaKV(config, 11 * tokens, model.dtype, META)
    cache.frames = torch.arange(6).repeat_interleave(tokens)
    out = []
    with torch.inference_mode():
        text = model.encode_text(torch.arange(12), META)
        for start in (9, 13, 17):
            hooks = hooks_change(replace(model.hooks, cache=cache, start_frame=start))
            actions = Segment("action", torch.empty(16, 64, device=META), [], 30.0, 4, 4 * (start - 1) + 1, 15)
            for sigma in (1.0, 0.83):
                out.append(step(torch.empty(1, 48, 4, 4, 6, device=META), torch.tensor(1000 * sigma, device=timesteps),
                                text, [0, 1, 2, 3], 30.0, [actions], hooks=hooks))
    return out


def test_the_cuda_capture_runs_on_the_meta_device_without_host_reads(fake_cuda):
    """The chunk at 9 runs eagerly, the one at 13 is warmed up on a side stream and captured (no host read nor host
    data inside), then it and the chunk at 17 replay; the velocities come out on the device in their shapes."""
    out = meta_step()
    assert fake_cuda == ["side stream", "capture"] + ["replay"] * 4
    assert all(v.vision.shape == (1, 48, 4, 4, 6) and v.vision.device == META for v in out)
    assert all(len(v.tracks) == 1 and v.tracks[0].shape == (16, 64) and v.tracks[0].device == META for v in out)


def test_weights_a_host_left_in_cpu_memory_keep_the_media_forward_eager(fake_cuda):
    """A module of the media forward in CPU memory (ComfyUI leaves small ones there) would copy its weights in inside
    the capture: no graph for that run. The text tower is not run by a denoising forward: it may be anywhere."""
    config = TransformerConfig.from_dict(transformer_config("gated", action=True))
    with META:
        model = Cosmos3Transformer(config)
    model.embed_tokens.to_empty(device="cpu")
    assert chunk_step.for_run(model, META, "device") is not None
    model.time_embedder.to_empty(device="cpu")
    assert chunk_step.for_run(model, META, "device") is None


def test_a_capture_that_fails_leaves_the_run_eager(fake_cuda, monkeypatch, caplog):
    @contextmanager
    def refusing(g):
        raise RuntimeError("operation not permitted when stream is capturing")
        yield

    monkeypatch.setattr(torch.cuda, "graph", refusing)
    out = meta_step()
    assert len(out) == 6 and fake_cuda == ["side stream"]  # warmed up, refused, then every step eager
    assert "runs eagerly: its CUDA graph capture failed" in caplog.text


def test_steps_whose_shapes_alternate_inside_each_chunk_stop_recapturing(fake_cuda):
    """A step policy at 16 bits on a chunk's first and last steps and fp8 between (A B B A a chunk) would recapture
    every chunk; after `CAPTURES` the other shape runs eagerly and the captured one replays."""
    config = TransformerConfig.from_dict(transformer_config("gated"))
    with META:
        model = Cosmos3Transformer(config)
    step = chunk_step.for_run(model, META, "device")
    cache = MediaKV(config, 12 * 6, model.dtype, META)
    cache.frames = torch.arange(6).repeat_interleave(6)
    with torch.inference_mode():
        text = model.encode_text(torch.arange(12), META)
        for start in range(6, 12):
            hooks = replace(model.hooks, cache=cache, start_frame=start)
            for noisy in ([0], [], [], [0]):  # (the noisy frames stand in for the precision: part of the shape)
                step(torch.empty(1, 48, 1, 4, 6, device=META), torch.tensor(900.0, device=META), text, noisy, 24.0,
                     hooks=hooks)
    assert fake_cuda.count("capture") == chunk_step.CAPTURES and fake_cuda.count("replay") > 6


def reads(hidden, run):
    """A layer stack that reads a value back, as a step cache's decision does."""
    return run(hidden) if bool(hidden.abs().sum() > 0) else hidden


@pytest.mark.parametrize("fault, message", [("a host read", "reads a value back"),
                                            ("a timestep on the host", "copies host data")])
def test_what_a_capture_cannot_hold_is_caught(fake_cuda, fault, message):
    """The check above can fail: a value read back in the chunk captured, or a timestep left on the host (its copy to
    the device would be recorded once and replayed with the captured value)."""
    with pytest.raises(HostRead, match=message):
        if fault == "a host read":
            meta_step(lambda hooks: replace(hooks, stack=reads) if hooks.start_frame == 13 else hooks)
        else:
            meta_step(timesteps=torch.device("cpu"))
    assert fake_cuda == ["side stream"]


@pytest.fixture
def compiled_block(monkeypatch):
    """compile=True's block compiled by AOTAutograd without code generation (aot_eager: what inductor's graphs go
    through, its mutations of inputs included), fullgraph: a graph break in the block raises."""
    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(transformer, "compiled_media_block",
                        lambda: torch.compile(DecoderLayer.media, backend="aot_eager", fullgraph=True))
    yield
    torch._dynamo.reset()


def test_compile_applies_to_a_causal_rollout_and_equals_eager(framewise, eager_framewise, compiled_block):
    """The compiled block writes each layer's rows into that layer's history (under AOTAutograd every layer's went to
    the first layer's rows: the history's view and the slab's aliased, pytorch#139789)."""
    assert torch.equal(rollout(framewise, 21, compile=True).latents, eager_framewise)
    assert counters["stats"]["unique_graphs"] and not counters["graph_break"]


def test_compile_applies_to_a_session(framewise, compiled_block):
    def ticks(compile):
        with framewise.session("a robot arm", control="edge", num_frames=9, width=W, height=H, seed=3,
                               compile=compile) as s:
            return torch.cat([s.tick(clip(9)[:1]), s.tick(clip(9)[1:5])])

    assert torch.equal(ticks(True), ticks(False))
    assert counters["stats"]["unique_graphs"] and not counters["graph_break"]
