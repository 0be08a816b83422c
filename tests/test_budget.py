"""What a request holds, where: the device's peak per chunk, and the output in host memory (`budget`), refused with the
same figures by the CLI's planner, a loaded pipeline and the ComfyUI sampler, before any weight is read."""

import pytest
from dataclasses import replace

import torch

import cosmos3_runtime
from cosmos3_runtime import budget, chunks, devices
from cosmos3_runtime.errors import InputError
from cosmos3_runtime.pipeline import planner

GIB = 2**30
HUGE = dict(num_frames=4097, width=8192, height=8192)  # a long video of 41 chunks at 8192 x 8192
HUGE_LATENTS = 48 * 1025 * 512 * 512 * 4  # its latents, float32: 51.6 GB


def test_a_long_videos_output_is_counted_in_host_memory(tiny_gated):
    planning = planner(tiny_gated, "cpu", "fp32")
    latents_out = planning.plan("a cat", **HUGE, output="latents").estimate
    assert latents_out.host == {"output latents": HUGE_LATENTS}
    frames_out = planning.plan("a cat", **HUGE).estimate
    assert frames_out.host == {"output latents": HUGE_LATENTS, "output frames": 4097 * 8192 * 8192 * 3 * 4}
    assert frames_out.total == latents_out.total  # the device holds one chunk either way (each is decoded)
    one_window = planning.plan("a cat", num_frames=93, width=1280, height=704).estimate
    assert "output frames" not in one_window.host  # on the CPU the decode phase counts the frames where they stay


def test_on_the_cpu_the_output_and_the_run_share_one_memory(tiny_gated, monkeypatch):
    planning = planner(tiny_gated, "cpu", "fp32")
    plan = planning.plan("a cat", **HUGE, output="latents")
    monkeypatch.setattr(budget, "available_bytes", lambda device: 32 * GIB)
    with pytest.raises(InputError, match=r"needs at least [\d.]+ GiB \(.*output latents 48.05 GiB\) on cpu, which has "
                                         r"32.00 GiB free"):
        planning.check(plan)


def test_on_a_gpu_the_output_is_checked_against_the_host_first(tiny_gated, monkeypatch):
    """Before ComfyUI makes room on the GPU only the output's part is checked (the host's memory); the whole check
    after it names the device's figure."""
    monkeypatch.setitem(devices._FACTS, ("cuda", 0), devices.DeviceFacts("cuda", (9, 0)))
    planning = planner(tiny_gated, "cpu", "bf16")
    planning.device = torch.device("cuda", 0)
    plan = planning.plan("a cat", **HUGE, output="latents")
    free = {"cuda": 1024 * GIB, "cpu": 32 * GIB}
    monkeypatch.setattr(budget, "available_bytes", lambda device: free[device.type])
    message = r"this request's output needs 48.05 GiB of host memory \(output latents 48.05 GiB\), and the host has 32.00"
    with pytest.raises(InputError, match=message):
        planning.check(plan, output_only=True)
    free.update(cpu=64 * GIB, cuda=GIB // 4)
    planning.check(plan, output_only=True)  # the device is ComfyUI's to make room on
    with pytest.raises(InputError, match=r"needs at least .* on cuda:0, which has 0.25 GiB free"):
        planning.check(plan)


def test_the_sampler_refuses_it_before_a_run_with_the_clis_figures(pack, models_dir, monkeypatch):
    """The ComfyUI sampler plans as the CLI does and refuses before anything moves or runs; a handle whose weights were
    released (/free, another checkpoint loaded) plans from the config files and refuses without reading a weight."""
    import importlib

    runtime = importlib.import_module("cosmos3_pack.cosmos3_runtime")  # the pack's own copy of the runtime
    pack.loader._loaded.clear()
    model = pack.Cosmos3ModelLoader().load("Cosmos3-Nano", "fp32", "default")["result"][0]
    text = pack.Cosmos3TextEncode().encode("a cat", "", "auto", True, True, True)["result"][0]
    for module in (runtime.budget, budget):
        monkeypatch.setattr(module, "available_bytes", lambda device: 32 * GIB)
    monkeypatch.setattr(pack.loader.services.memory, "load_managed", lambda *a: pytest.fail("weights moved"))
    with pytest.raises(runtime.InputError, match="output latents 48.05 GiB") as refused:
        pack.Cosmos3Sampler().sample(model, text, 8192, 8192, 4097, 0.0, 0.0, "auto", 1, chunk_frames=93)
    cli = planner(models_dir / "Cosmos3-Nano", "cpu", "fp32")
    with pytest.raises(InputError) as refused_by_cli:
        cli.check(cli.plan("a cat", cosmos3_runtime.Request(**HUGE, chunk_frames=93, output="latents")))
    figures = [str(error.value).split(";")[0] for error in (refused, refused_by_cli)]  # (the node words its advice)
    assert figures[0] == figures[1]

    pack.loader.release_all()
    monkeypatch.setattr(runtime.weights.files, "_tensors", lambda *a: pytest.fail("a weight was read before the refusal"))
    with pytest.raises(runtime.InputError, match="output latents 48.05 GiB"):
        model.plan("a cat", runtime.Request(**HUGE, output="latents"))
    assert model.holder.loaded is None
    monkeypatch.undo()
    small = runtime.Request(num_frames=9, width=64, height=48, output="latents")
    assert model.plan("a cat", small).estimate == model.pipeline.plan("a cat", small).estimate


def test_a_long_video_handing_back_latents_keeps_no_frames(tiny_gated, monkeypatch):
    """Its chunks are decoded to seed the next, but only their overlap frames are kept: no clip of frames in host
    memory (the sampler's LATENT output)."""
    made = []
    monkeypatch.setattr(chunks, "Stitched", lambda *a: made.append(a) or pytest.fail("frames kept"))
    pipe = cosmos3_runtime.load(tiny_gated, dtype="fp32")
    result = pipe.generate("a cat", num_frames=13, chunk_frames=5, width=32, height=32, steps=2, output="latents")
    assert result.frames is None and result.latents.shape[2] == 4 and not made


def test_media_kv_kept_across_forwards_is_held_throughout_and_attended():
    """A causal rollout's history: Nano at 480p keeping 151 latent frames of control and RGB K/V (302 frames) holds
    about 17 GB in bf16 (the figure NVIDIA's Sim-Transfer notes give) with the prompt's K/V before it in each layer's
    slab. Attention reads it in place: no joined copy of it (the plan counted one, 3.2 GB here), only the copy
    expanded to the query heads where SDPA needs that (a device without grouped K/V)."""
    from cosmos3_runtime.geometry import RunGeometry
    from cosmos3_runtime.tiny import RELEASED
    from cosmos3_runtime.transformer import TransformerConfig

    config = TransformerConfig(**RELEASED["nano"])
    chunk = RunGeometry(480, 832, 13, 13)
    plain = budget.estimate(config, None, chunk, 300, 0, torch.bfloat16)
    held = budget.estimate(config, None, RunGeometry(480, 832, 13, 13, history_frames=302), 300, 0, torch.bfloat16)
    tokens = 302 * (480 // 32) * (832 // 32)  # 2 x 2 patches of 16-pixel latents
    assert held.parts["media K/V cache"] == 36 * (tokens + 300) * 2 * 8 * 128 * 2
    assert 17e9 < held.parts["media K/V cache"] < 18e9 and "media K/V cache" not in plain.parts
    assert held.parts["media tower"] == plain.parts["media tower"]  # the chunk's MLP, not a copy of the history
    assert held.total - plain.total == held.parts["media K/V cache"]
    expanded = budget.estimate(config, None, RunGeometry(480, 832, 13, 13, history_frames=302), 300, 0,
                               torch.bfloat16, device=torch.device("meta"))  # (SDPA there: K/V expanded)
    assert expanded.parts["media tower"] > (tokens + 300) * 2 * 32 * 128 * 2  # one layer's, at the query heads


def test_the_chunk_steps_cuda_graph_pool_is_counted_where_it_is_made():
    """On an NVIDIA GPU with the history on the device, a rollout's steady chunks replay a CUDA graph whose pool keeps
    one denoising forward's activations beside the eager commits' (`chunk_step.for_run`); nowhere else."""
    from cosmos3_runtime import devices
    from cosmos3_runtime.devices import DeviceFacts
    from cosmos3_runtime.geometry import RunGeometry
    from cosmos3_runtime.tiny import RELEASED
    from cosmos3_runtime.transformer import TransformerConfig

    config, meta = TransformerConfig(**RELEASED["nano"]), torch.device("meta")

    def plan(history: str, facts: DeviceFacts):
        g = RunGeometry(480, 832, 13, 13, history_frames=302, history_memory=history)
        with devices.answering_as(meta, facts):
            return budget.estimate(config, None, g, 300, 0, torch.bfloat16, device=meta).parts

    graphed = plan("device", DeviceFacts("cuda", (9, 0)))
    assert graphed["chunk step graph"] == graphed["media tower"] > 0
    assert "chunk step graph" not in plan("cpu", DeviceFacts("cuda", (9, 0)))
    assert "chunk step graph" not in plan("device", DeviceFacts("cuda", (9, 0), rocm=True))


def test_a_rollouts_streamed_decode_runs_beside_the_steps_on_a_gpu(monkeypatch):
    """A causal rollout decodes each chunk as it is made (`codec.ChunkDecode`): on a CUDA GPU on a second stream while
    the next chunk samples, so the plan holds one chunk's decode beside the steps; in line (the CPU) it stays a phase
    of its own, its causal state held from chunk to chunk; tiled, the clip is decoded once at the end."""
    from cosmos3_runtime import devices
    from cosmos3_runtime.geometry import RunGeometry
    from cosmos3_runtime.tiny import RELEASED, vae_config
    from cosmos3_runtime.transformer import TransformerConfig
    from cosmos3_runtime.vae import TileSpec, VAEConfig

    gpu = torch.device("cuda", 0)
    monkeypatch.setitem(devices._FACTS, ("cuda", 0), devices.DeviceFacts("cuda", (9, 0)))
    config, vae = TransformerConfig(**RELEASED["nano"]), VAEConfig.from_dict(vae_config(base_dim=160, decoder_base_dim=256))
    rollout = RunGeometry(480, 832, 16, 97, 7, history_frames=50, decoded_frames=97, decoded_piece=17)
    on_gpu, in_line = (budget.estimate(config, vae, rollout, 300, 0, torch.bfloat16, device=d) for d in (gpu, None))
    beside = on_gpu.parts["VAE decode beside the steps"]
    assert beside == in_line.parts["VAE decode"] and "VAE decode" not in on_gpu.parts
    rest = budget.Estimate({name: n for name, n in on_gpu.parts.items() if name != "VAE decode beside the steps"})
    assert on_gpu.total == rest.total + beside  # held with the steps' peak, not a phase after them
    tiled = budget.estimate(config, vae, rollout, 300, 0, torch.bfloat16, TileSpec(32, 8), device=gpu)
    whole = budget.estimate(config, vae, replace(rollout, decoded_piece=None), 300, 0, torch.bfloat16, device=gpu)
    assert "VAE decode beside the steps" not in tiled.parts and tiled.parts["VAE decode"] > 0
    assert whole.parts["VAE decode"] > beside  # the whole clip's frames at once
