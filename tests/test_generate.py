"""Behaviour of Cosmos3Pipeline.generate on tiny checkpoints: CFG branches, intervals, seeds, cancellation."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cosmos3_runtime
from cosmos3_runtime import InputError
from cosmos3_runtime.schedulers import unipc_schedule

SMALL = dict(width=64, height=48)


@pytest.fixture(scope="module")
def pipe(tiny_gated):
    return cosmos3_runtime.load(tiny_gated, dtype=torch.float32)


@pytest.fixture
def forward_calls(pipe, monkeypatch):
    """Record (text length, timestep) of every transformer forward."""
    calls = []
    original = type(pipe.transformer).forward

    def spy(model, latents, timestep, text, *args, **kwargs):
        calls.append((text.length, float(timestep)))
        return original(model, latents, timestep, text, *args, **kwargs)

    monkeypatch.setattr(type(pipe.transformer), "forward", spy)
    return calls


def test_cfg_runs_each_branch_at_its_own_text_length(pipe, forward_calls):
    result = pipe.generate("a long and detailed prompt about a cat", negative_prompt="", num_frames=5, steps=3,
                           guidance_scale=4.0, **SMALL)
    _, cond_ids, uncond_ids = pipe.planner.prepare("a long and detailed prompt about a cat",
                                           cosmos3_runtime.Request(negative_prompt="", num_frames=5, **SMALL))
    assert len(cond_ids) != len(uncond_ids)
    lengths = [length for length, _ in forward_calls]
    # Two forwards per step, each with exactly its own prompt's tokens: nothing is padded.
    assert lengths == [len(cond_ids), len(uncond_ids)] * 3


def test_guidance_one_runs_a_single_forward_per_step(pipe, forward_calls):
    pipe.generate("a cat", num_frames=5, steps=3, guidance_scale=1.0, **SMALL)
    assert len(forward_calls) == 3


def test_image_guidance_interval_applies_cfg_only_at_high_noise(pipe, forward_calls):
    pipe.generate("a cat", num_frames=1, steps=8, guidance_scale=4.0, **SMALL)
    timesteps = unipc_schedule(8, 3.0).timesteps.tolist()
    expected = sum(2 if 400 <= t <= 1000 else 1 for t in timesteps)
    assert 8 < expected < 16  # the schedule crosses the interval boundary
    assert len(forward_calls) == expected
    forward_calls.clear()
    pipe.generate("a cat", num_frames=1, steps=8, guidance_scale=4.0, guidance_interval=None, **SMALL)
    assert len(forward_calls) == 16


def test_same_seed_same_bytes_other_seed_other_result(pipe):
    a = pipe.generate("a cat", num_frames=5, steps=3, seed=11, **SMALL)
    b = pipe.generate("a cat", num_frames=5, steps=3, seed=11, **SMALL)
    c = pipe.generate("a cat", num_frames=5, steps=3, seed=12, **SMALL)
    assert torch.equal(a.latents, b.latents) and torch.equal(a.frames, b.frames)
    assert not torch.equal(a.latents, c.latents)


def test_starting_noise_is_the_cpu_generator_stream(pipe, monkeypatch):
    """The first forward sees exactly torch.randn from a CPU generator seeded with the seed (float32)."""
    seen = []
    original = type(pipe.transformer).forward
    monkeypatch.setattr(type(pipe.transformer), "forward",
                        lambda model, latents, *a, **k: seen.append(latents.clone()) or original(model, latents, *a, **k))
    pipe.generate("a cat", num_frames=5, steps=1, seed=3, output="latents", **SMALL)
    expected = torch.randn((1, 48, 2, 3, 4), generator=torch.Generator("cpu").manual_seed(3), dtype=torch.float32)
    assert torch.equal(seen[0], expected)


def test_cancel_from_callback_then_next_run_is_unaffected(pipe):
    reference = pipe.generate("a dog", num_frames=5, steps=4, seed=1, **SMALL)
    progress = []

    def cancel_at_two(step, total, latents):
        progress.append((step, total))
        if step == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pipe.generate("a dog", num_frames=5, steps=4, seed=1, callback=cancel_at_two, **SMALL)
    assert progress == [(1, 4), (2, 4)]
    again = pipe.generate("a dog", num_frames=5, steps=4, seed=1, **SMALL)
    fresh = cosmos3_runtime.load(pipe.checkpoint.root, dtype="fp32").generate("a dog", num_frames=5, steps=4, seed=1,
                                                                              **SMALL)
    assert torch.equal(again.latents, fresh.latents) and torch.equal(again.frames, fresh.frames)
    assert torch.equal(reference.latents, fresh.latents)


def test_cancel_during_decode_takes_effect_within_one_latent_frame(pipe):
    latents = torch.randn(1, 48, 4, 3, 4)
    for tile in (None, cosmos3_runtime.TileSpec(2, 1)):
        calls = []

        def cancel_at_two(done, total):
            calls.append((done, total))
            if done == 2:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            pipe.decode(latents, tile=tile, progress=cancel_at_two)
        tiles = 1 if tile is None else 2 * 3  # 3x4 latents in tiles of 2 (overlap 1): 2 rows, 3 columns
        assert calls == [(1, 4 * tiles), (2, 4 * tiles)]  # stopped right after the second latent frame
    seen = []
    frames = pipe.decode(latents, progress=lambda done, total: seen.append(done))
    assert seen == [1, 2, 3, 4] and torch.equal(frames, pipe.decode(latents))  # nothing left behind
    encoded = []
    pipe.encode(frames, progress=lambda done, total: encoded.append((done, total)))
    assert encoded == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_callback_gets_the_denoised_estimate(pipe):
    """Previews show x0 = x - sigma * v; on the last step that is exactly the result."""
    seen = []
    result = pipe.generate("a dog", num_frames=5, steps=3, seed=1, output="latents",
                           callback=lambda step, total, denoised: seen.append(denoised.clone()), **SMALL)
    assert len(seen) == 3 and torch.equal(seen[-1], result.latents)
    assert (seen[0] - result.latents).abs().max() > 1e-3  # earlier estimates differ


def test_text_kv_is_computed_once_per_prompt(pipe, monkeypatch):
    pipe.denoiser.text_cache.clear()
    encoded = []
    original = pipe.transformer.encode_text
    monkeypatch.setattr(pipe.transformer, "encode_text",
                        lambda ids, device=None: encoded.append(len(ids)) or original(ids, device))
    pipe.generate("a horse", num_frames=5, steps=3, seed=1, **SMALL)
    assert len(encoded) == 2  # cond and uncond, not once per step
    pipe.generate("a horse", num_frames=5, steps=3, seed=2, **SMALL)
    assert len(encoded) == 2  # a new seed reuses them


def test_conditioned_frames_stay_exactly_at_the_image_latents(pipe):
    image = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    result = pipe.generate("a cat", image=image, num_frames=9, steps=3, output="latents", **SMALL)
    pixels = cosmos3_runtime.conditioning.preprocess_image(image, 48, 64).unsqueeze(2)
    clean = pipe.vae.normalize(pipe.vae.encode(pixels)).float()
    assert torch.equal(result.latents[:, :, :1], clean)
    assert result.settings.mode == "i2v"


def test_comfyui_image_tensor_equals_pil_and_uint8_inputs(pipe):
    from PIL import Image

    pixels = np.random.default_rng(1).integers(0, 256, (40, 72, 3), dtype=np.uint8)
    comfy = torch.from_numpy(pixels).float().div(255).unsqueeze(0)  # ComfyUI IMAGE [1, H, W, 3] in 0..1
    runs = [pipe.generate("a cat", image=img, num_frames=5, steps=2, output="latents", **SMALL).latents
            for img in (pixels, Image.fromarray(pixels), comfy)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_video_conditioning_from_a_comfyui_batch(pipe):
    video = torch.rand(7, 48, 64, 3)
    result = pipe.generate("a cat", video=video, num_frames=13, steps=2, condition_frame_indexes=(0, 1), **SMALL)
    assert result.settings.mode == "v2v" and result.frames.shape == (13, 48, 64, 3)
    last = pipe.generate("a cat", video=video, num_frames=13, steps=2, condition_video_keep="last", **SMALL)
    assert not torch.equal(result.latents[:, :, :2], last.latents[:, :, :2])


def test_t2i_returns_one_frame_and_latents_only_skips_decode(pipe):
    image = pipe.generate("a cat", num_frames=1, steps=2, **SMALL)
    assert image.frames.shape == (1, 48, 64, 3) and 0 <= image.frames.min() and image.frames.max() <= 1
    assert pipe.generate("a cat", num_frames=1, steps=2, output="latents", **SMALL).frames is None


def test_decode_with_tiles(pipe):
    latents = pipe.generate("a cat", num_frames=1, steps=1, width=256, height=128, output="latents").latents
    tile = cosmos3_runtime.vae.TileSpec(size=8, overlap=2)
    assert pipe.decode(latents, tile=tile).shape == pipe.decode(latents).shape == (1, 128, 256, 3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(width=100), "multiple of 16"),
        (dict(num_frames=1, image=np.zeros((8, 8, 3), np.uint8)), "num_frames is 1"),
        (dict(image=np.zeros((2, 8, 8, 3), np.uint8)), "one picture"),
        (dict(image=np.zeros((3, 8, 8), np.uint8)), r"channels-last \[H, W, 3\]"),
        (dict(video=torch.rand(3, 8, 8, 3) * 2), "floats in 0..1"),
        (dict(output="mp4"), "output must be"),
    ],
)
def test_bad_requests_are_clear_errors(pipe, kwargs, message):
    with pytest.raises(InputError, match=message):
        pipe.generate("a cat", **{"steps": 1, "num_frames": 5, "width": 64, "height": 48, **kwargs})


def test_distilled_checkpoint_forces_its_schedule(tiny_factory):
    pipe = cosmos3_runtime.load(tiny_factory(kind="edge", distilled=True), dtype=torch.float32)
    result = pipe.generate("a cat", num_frames=5, steps=30, guidance_scale=7.0, **SMALL)
    assert (result.settings.steps, result.settings.guidance_scale) == (4, 1.0)
    assert any("forced to 1.0" in note for note in result.settings.notes)


def test_oversized_requests_are_refused_with_the_figure_before_allocating(pipe):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InputError, match=r"needs at least [\d.]+ GiB .*VAE decode .* GiB free; lower the size"):
        pipe.generate("a cat", width=8192, height=8192, num_frames=4097)
    with pytest.raises(InputError, match="the prompt has 200[0-9]{2} tokens, more than max_prompt_tokens 16384"):
        pipe.generate("cat " * 20000, steps=1, output="latents", **SMALL)
    with pytest.raises(InputError, match="the negative_prompt has over .* tokens"):
        pipe.generate("a cat", negative_prompt="x" * 2_000_000, steps=1, output="latents", **SMALL)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 * 1024  # KiB: nothing big was built
    fresh = cosmos3_runtime.load(pipe.checkpoint.root, dtype="fp32")
    after = pipe.generate("a cat", num_frames=5, steps=2, seed=4, output="latents", **SMALL)
    assert torch.equal(after.latents, fresh.generate("a cat", num_frames=5, steps=2, seed=4, output="latents",
                                                     **SMALL).latents)


def test_the_memory_check_can_be_turned_off_and_the_estimate_follows_the_request(pipe):
    from cosmos3_runtime.request import Request
    from cosmos3_runtime.settings import resolve

    def total(**options):
        r = Request(**options)
        return pipe.planner.memory_estimate(resolve(pipe.variant, r), r, 300, 40).total

    assert total(width=1280, height=720, num_frames=81) > total(width=640, height=352, num_frames=81)
    assert total(num_frames=9, vae_tile=8) < total(num_frames=9)  # (81 frames: the output, not the tile, decides)
    assert total(num_frames=81, output="latents") < total(num_frames=81)
    assert pipe.generate("a cat", num_frames=1, steps=1, check_memory=False, output="latents", **SMALL).latents.shape


@pytest.mark.slow
def test_long_prompts_use_memory_efficient_text_attention(tiny_gated):
    """16k text tokens: an L x L score matrix per head would be 1 GiB each; the text tower must stay far below."""
    import subprocess
    import sys

    from conftest import ROOT

    script = f"""
import resource, sys, torch
sys.path.insert(0, {str(ROOT)!r})
import cosmos3_runtime
pipe = cosmos3_runtime.load({str(tiny_gated)!r}, dtype="fp32")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
pipe.transformer.encode_text(torch.arange(16384) % 500)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1]) < 256  # MiB


def test_compile_runs_one_compiled_media_block_for_every_layer(pipe, monkeypatch):
    """compile=True: every media layer goes through one torch.compile'd block (the eager backend here, so the result
    is bit-equal; benchmarks/bench_cache.py times inductor), captured once for the stack, not once per layer; it is
    the run's own (the shared model is never changed)."""
    from torch._dynamo.utils import counters

    from cosmos3_runtime import transformer
    from cosmos3_runtime.transformer import DecoderLayer, compiled_media_block

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(transformer, "compiled_media_block", lambda: compiled_media_block("eager"))
    request = dict(width=64, height=48, num_frames=5, steps=2, seed=1, output="latents", guidance_scale=1.0)
    plain = pipe.generate("a cat", **request).latents
    compiled = pipe.generate("a cat", **request, compile=True).latents
    assert torch.equal(compiled, plain)
    assert counters["stats"]["unique_graphs"] == 1  # one capture served every layer and step
    assert pipe.transformer.hooks.block is DecoderLayer.media  # a run's compiled block is its own: the model is unchanged


def test_nothing_recompiles_between_steps_or_runs_of_one_shape(pipe, monkeypatch):
    """With CFG the two passes attend over prompts of different lengths: the block is captured for the first, once
    more (with that length dynamic) for the second, and never again, not at a later step nor in a second run of the
    same size; a new size costs at most one more capture. Counted by Dynamo (its eager backend: the same guards and
    captures as inductor's, without code generation)."""
    from torch._dynamo.utils import counters

    from cosmos3_runtime import transformer
    from cosmos3_runtime.transformer import compiled_media_block

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(transformer, "compiled_media_block", lambda: compiled_media_block("eager"))
    request = dict(width=64, height=48, num_frames=5, steps=4, seed=1, output="latents", guidance_scale=4.0,
                   negative_prompt="blurry, static, low quality, distorted", cache="off", compile=True)
    first = pipe.generate("a cat", **request)
    captured = counters["stats"]["unique_graphs"]
    assert captured == 2, dict(counters["recompiles"])
    second = pipe.generate("a cat", **request)
    assert counters["stats"]["unique_graphs"] == captured and torch.equal(first.latents, second.latents)
    pipe.generate("a cat", **{**request, "width": 96})
    assert counters["stats"]["unique_graphs"] <= captured + 1


def test_compile_auto_compiles_on_a_cuda_gpu_with_triton_only(monkeypatch, caplog):
    """compile's default (None, auto): the compiled block on a CUDA GPU where torch.compile can make kernels; eager on
    the CPU (silently), on a GPU without Triton (a warning, once, with what to install), and where the run rules it
    out (said at INFO: the user asked for nothing)."""
    from cosmos3_runtime import devices, transformer
    from cosmos3_runtime.devices import DeviceFacts
    from cosmos3_runtime.transformer import DecoderLayer, EagerIfCompileFails, media_block

    monkeypatch.setattr(transformer, "compiled_media_block", lambda: "compiled")
    monkeypatch.setattr(transformer, "_eager_reasons_said", set())
    cpu = torch.device("cpu")
    assert media_block(None, cpu) is DecoderLayer.media and media_block(True, cpu) == "compiled"
    monkeypatch.setitem(devices._FACTS, ("cpu", None), DeviceFacts("cuda", (9, 0), triton=True))
    auto = media_block(None, cpu)
    assert isinstance(auto, EagerIfCompileFails) and auto.compiled == "compiled"
    assert media_block(False, cpu) is DecoderLayer.media and media_block(True, cpu) == "compiled"
    monkeypatch.setitem(devices._FACTS, ("cpu", None), DeviceFacts("cuda", (8, 6), triton=False))
    with caplog.at_level("WARNING"):
        assert media_block(None, cpu, "sequence parallelism") is DecoderLayer.media
        assert media_block(None, cpu) is DecoderLayer.media and media_block(None, cpu) is DecoderLayer.media
    said = [r.getMessage() for r in caplog.records if "compile auto" in r.getMessage()]
    assert len(said) == 1 and "triton-windows" in said[0]  # once per process; the run's own reason not a warning


def test_a_block_auto_cannot_compile_runs_eagerly(pipe, monkeypatch, caplog):
    """Where torch.compile fails after all (no C compiler for Triton, a card it cannot serve), auto runs the eager
    block from that call on and says so once: a default run never fails for compiling. Here the CPU answers like a
    GPU with Triton and the backend fails as inductor would without a compiler."""
    from cosmos3_runtime import devices, transformer
    from cosmos3_runtime.devices import DeviceFacts
    from cosmos3_runtime.transformer import DecoderLayer, EagerIfCompileFails

    def no_compiler(graph, example_inputs):
        raise RuntimeError("Failed to find C compiler")

    torch._dynamo.reset()
    monkeypatch.setitem(devices._FACTS, ("cpu", None), DeviceFacts("cuda", (9, 0), triton=True))
    monkeypatch.setattr(transformer, "compiled_media_block",
                        lambda: torch.compile(DecoderLayer.media, backend=no_compiler))
    monkeypatch.setattr(EagerIfCompileFails, "failed", False)
    request = dict(width=64, height=48, num_frames=5, steps=2, seed=1, output="latents", guidance_scale=1.0)
    eager = pipe.generate("a cat", **request, compile=False).latents
    with caplog.at_level("WARNING"):
        first = pipe.generate("a cat", **request).latents
        second = pipe.generate("a cat", **request).latents
    assert torch.equal(first, eager) and torch.equal(second, eager)
    said = [r.getMessage() for r in caplog.records if "could not compile" in r.getMessage()]
    assert len(said) == 1 and "RuntimeError: Failed to find C compiler" in said[0]
    torch._dynamo.reset()


class HostReads(TorchDispatchMode):
    """Counts the host's reads of tensor values: item, bool, float and int (aten._local_scalar_dense), tolist, cpu
    and numpy. On a GPU each waits for every kernel queued before it; a step should queue its work and move on."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.count = 0
        for name in ("tolist", "cpu", "numpy"):
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _real=real, **k: self._read() or _real(t, *a, **k))

    def _read(self):
        self.count += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self._read()
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("cache, per_step", [("off", 0), ("seacache", 1)])
def test_a_step_reads_nothing_back_but_the_caches_one_figure(pipe, monkeypatch, cache, per_step):
    """Host reads per step of a 5-step run with CFG (two passes a step): none, and SeaCache's one decision figure on
    the steps it may skip (not the first, nor the last). Before: the schedule copied to the device, a 2x2 solve with
    its error check, and SeaCache's three reads per pass."""
    reads, seen = HostReads(monkeypatch), []
    with reads:
        pipe.generate("a cat", **SMALL, num_frames=9, steps=5, guidance_scale=4.0, negative_prompt="blurry",
                      output="latents", cache=cache, callback=lambda *_: seen.append(reads.count))
    per = [b - a for a, b in zip(seen, seen[1:])]  # steps 2 to 5 (step 1 holds the setup's reads)
    assert per == [per_step] * 3 + [0], per
