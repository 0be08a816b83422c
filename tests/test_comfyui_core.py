"""Cosmos3 as a core ComfyUI model, against a real ComfyUI (COMFYUI_DIR) and diffusers 0.42.1.

Skipped unless COMFYUI_DIR points at a ComfyUI checkout; run by ComfyUI's Python (it needs ComfyUI's
requirements). The core path is exact against diffusers when given the same noise and sigmas:
ComfyUI's noise (a CPU generator seeded with the seed), the Cosmos3 Scheduler's SIGMAS, core samplers.
Tolerances: one forward 1e-5, whole runs 1e-4 (fp32), decoded frames 1/255.
"""

import shutil

import pytest
import torch

from conftest import COMFYUI_DIR, require, use_flow_match_scheduler

pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason="set COMFYUI_DIR to a ComfyUI checkout to run these")

SIZE = dict(height=48, width=64)


@pytest.fixture(scope="module")
def core(comfyui):
    import comfy.k_diffusion.sampling
    import comfy.model_management
    import comfy.samplers
    import folder_paths
    import nodes as comfy_nodes

    class Core:
        nodes, pack = comfy_nodes, comfyui.nodes
        samplers, k_sampling, mm, folders = comfy.samplers, comfy.k_diffusion.sampling, comfy.model_management, folder_paths

    return Core


@pytest.fixture(scope="module")
def models(core, tiny_factory, tmp_path_factory):
    """Tiny checkpoints under ComfyUI's models/cosmos3 names, and a loader for them."""
    root = tmp_path_factory.mktemp("cosmos3_models")
    for name, options in {"Cosmos3-Edge": dict(kind="edge"), "Cosmos3-Nano": dict(kind="gated"),
                          "Cosmos3-Super-Text2Image-4Step": dict(kind="gated", distilled=True)}.items():
        shutil.copytree(tiny_factory(**options), root / name)
    use_flow_match_scheduler(shutil.copytree(tiny_factory(kind="gated"), root / "Cosmos3-FlowMatch"))
    core.folders.add_model_folder_path("cosmos3", str(root))
    return root


def load(core, name):
    handle, _, _ = core.pack.Cosmos3ModelLoader().load(name, "fp32", "default")["result"]
    model, vae = core.pack.Cosmos3CoreModel().build(handle)
    return handle, model, vae


def encode(core, prompt, negative="", fps=24.0, templates=True):
    return core.pack.Cosmos3CoreTextEncode().encode(prompt, negative, "auto", templates, templates, True, fps)


def sample(core, model, positive, negative, latent, sigmas, sampler, cfg, seed, mask=None):
    """SamplerCustomAdvanced with CFGGuider and RandomNoise, as the node runs them."""
    guider = core.samplers.CFGGuider(model)
    guider.set_conds(positive, negative)
    guider.set_cfg(cfg)
    noise = torch.randn(latent.shape, generator=torch.manual_seed(seed), dtype=torch.float32)  # comfy.sample's noise
    return guider.sample(noise, latent, sampler, sigmas, denoise_mask=mask, disable_pbar=True, seed=seed)


def count_forwards(model):
    """Record the batch size of every network forward, through ComfyUI's DIFFUSION_MODEL wrapper."""
    import comfy.patcher_extension

    batches = []

    def wrapper(executor, *args, **kwargs):
        batches.append(args[0].shape[0])
        return executor(*args, **kwargs)

    model = model.clone()
    model.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "count", wrapper)
    return model, batches


def test_one_forward_equals_the_pack_transformer(core, models):
    handle, model, _ = load(core, "Cosmos3-Edge")
    pipe = handle.pipeline
    positive, _ = encode(core, "a red ball rolls", fps=16.0)
    x = torch.randn(1, 48, 3, 3, 4)
    sigma = torch.tensor([0.7])
    conds = model.model.extra_conds(**positive[0][1], cross_attn=positive[0][0], noise=x, device=torch.device("cpu"))
    denoised = model.model.apply_model(x, sigma, **{k: c.cond for k, c in conds.items()})
    request = dict(num_frames=9, **SIZE, fps=16.0, negative_prompt="")
    _, ids, _ = pipe.planner.prepare("a red ball rolls", core.pack.sampling.Request(**request))
    expected = pipe.transformer(x, sigma * 1000, pipe.denoiser.text_kv(ids), None, 16.0).vision
    torch.testing.assert_close((x - denoised) / sigma, expected, atol=1e-5, rtol=0)


def test_prompt_lengths_decide_batching_and_kv_is_made_once_per_run(core, models, monkeypatch):
    handle, model, _ = load(core, "Cosmos3-Edge")
    transformer = handle.pipeline.transformer
    calls = []
    real = transformer.encode_text
    monkeypatch.setattr(transformer, "encode_text", lambda ids, device=None: calls.append(1) or real(ids, device))
    sigmas = torch.tensor([1.0, 0.6, 0.3, 0.0])
    euler = core.samplers.sampler_object("euler")
    latent = torch.zeros(1, 48, 2, 3, 4)
    counted, batches = count_forwards(model)
    same = encode(core, "a cat", "a cat", templates=False)  # equal lengths: one batched forward per step
    batched = sample(core, counted, *same, latent, sigmas, euler, 4.0, seed=1)
    assert batches == [2, 2, 2] and len(calls) == 2  # text K/V: once per prompt per run, not per step
    batches.clear()
    different = encode(core, "a cat", "blurry, static, low quality, oversaturated")
    sample(core, counted, *different, latent, sigmas, euler, 4.0, seed=1)
    assert batches == [1, 1] * 3  # separate forwards: the text lengths differ
    alone = sample(core, model, *same, latent, sigmas, euler, 4.0, seed=1)
    torch.testing.assert_close(batched, alone, atol=1e-6, rtol=0)  # batching changes nothing


def test_distilled_through_sigmas_and_lcm_matches_diffusers(core, models, caplog):
    require("diffusers", minversion="0.42.1")
    import diffusers_reference as ref

    handle, model, _ = load(core, "Cosmos3-Super-Text2Image-4Step")
    positive, negative = encode(core, "A cat on a sofa.")
    _, sigmas = core.pack.Cosmos3Scheduler().build("auto", 0, 0.0, model=handle)
    assert sigmas.tolist() == pytest.approx([1.0, 0.9375, 0.8333333, 0.625, 0.0])
    seed = 3
    step_noise = torch.Generator().manual_seed(seed)
    torch.randn((1, 48, 3, 3, 4), generator=step_noise)  # diffusers draws the initial noise first, then each step's

    def noise_sampler(sigma, sigma_next):
        return torch.randn((1, 48, 3, 3, 4), generator=step_noise)

    lcm = core.samplers.KSAMPLER(core.k_sampling.sample_lcm, extra_options={"noise_sampler": noise_sampler})
    got = sample(core, model, positive, negative, torch.zeros(1, 48, 3, 3, 4), sigmas, lcm, 1.0, seed)
    with caplog.at_level("WARNING", logger="cosmos3"):  # cfg above 1 on a distilled checkpoint: said, once
        sample(core, model, positive, negative, torch.zeros(1, 48, 3, 3, 4), sigmas, lcm, 2.0, seed)
        sample(core, model, positive, negative, torch.zeros(1, 48, 3, 3, 4), sigmas, lcm, 2.0, seed)
    assert [r.message.startswith("Cosmos3: this distilled checkpoint samples with cfg 1") for r in caplog.records
            if r.name == "cosmos3"] == [True]
    expected = ref.distilled_pipeline(models / "Cosmos3-Super-Text2Image-4Step")(
        prompt="A cat on a sofa.", num_frames=9, **SIZE, generator=torch.Generator("cpu").manual_seed(seed),
        output="latents")
    latent_format = model.model.latent_format
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(latent_format.process_in(got), expected.float(), atol=1e-4, rtol=0)


def test_multi_step_euler_with_cfg_and_a_negative_matches_diffusers(core, models):
    require("diffusers", minversion="0.42.1")
    import diffusers_reference as ref

    handle, model, _ = load(core, "Cosmos3-FlowMatch")
    prompt, negative_prompt = "A robot arm stacks two cubes.", "blurry"
    positive, negative = encode(core, prompt, negative_prompt)
    _, sigmas = core.pack.Cosmos3Scheduler().build("checkpoint", 4, 0.0, model=handle)
    euler = core.samplers.sampler_object("euler")
    got = sample(core, model, positive, negative, torch.zeros(1, 48, 3, 3, 4), sigmas, euler, 4.0, seed=5)
    with torch.no_grad():
        expected = ref.omni_pipeline(models / "Cosmos3-FlowMatch")(
            prompt=prompt, negative_prompt=negative_prompt, num_frames=9, **SIZE, num_inference_steps=4,
            guidance_scale=4.0, generator=torch.Generator("cpu").manual_seed(5), output_type="latent").video
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(model.model.latent_format.process_in(got), expected.float(), atol=1e-4, rtol=0)


def test_ksampler_and_model_sampling_sd3_at_the_checkpoint_shift(core, models):
    import comfy_extras.nodes_model_advanced as advanced

    _, model, _ = load(core, "Cosmos3-Nano")
    assert model.get_model_object("model_sampling").shift == 10.0
    positive, negative = encode(core, "a cat", "blurry")
    latent = {"samples": torch.zeros(1, 48, 2, 3, 4)}
    plain = core.nodes.common_ksampler(model, 7, 3, 4.0, "euler", "simple", positive, negative, latent)[0]
    (shifted,) = advanced.ModelSamplingSD3().patch(model, 10.0)
    again = core.nodes.common_ksampler(shifted, 7, 3, 4.0, "euler", "simple", positive, negative, latent)[0]
    assert torch.equal(plain["samples"], again["samples"])
    (other,) = advanced.ModelSamplingSD3().patch(model, 3.0)
    changed = core.nodes.common_ksampler(other, 7, 3, 4.0, "euler", "simple", positive, negative, latent)[0]
    assert (changed["samples"] - plain["samples"]).abs().max() > 1e-3  # the shift really is the model's


def test_image_to_video_keeps_the_clean_frame_and_gives_it_no_time_embedding(core, models, monkeypatch):
    from comfy_extras.nodes_wan import Wan22ImageToVideoLatent

    handle, model, vae = load(core, "Cosmos3-Edge")
    image = torch.rand(1, 48, 64, 3)
    latent = Wan22ImageToVideoLatent.execute(vae, 64, 48, 9, 1, start_image=image).args[0]
    assert latent["noise_mask"][0, 0, :, 0, 0].tolist() == [0.0, 1.0, 1.0]
    seen = []
    transformer = handle.pipeline.transformer
    real = transformer.forward
    monkeypatch.setattr(transformer, "forward", lambda *a, **k: seen.append(a[3]) or real(*a, **k))
    positive, negative = encode(core, "a cat walks", "")
    sigmas = torch.tensor([1.0, 0.5, 0.0])
    out = sample(core, model, positive, negative, latent["samples"], sigmas, core.samplers.sampler_object("euler"),
                 3.0, seed=2, mask=latent["noise_mask"])
    assert seen and all(frames == [1, 2] for frames in seen)  # frame 0 is never noisy
    encoded = vae.encode(image)
    torch.testing.assert_close(out[:, :, :1], encoded, atol=1e-5, rtol=0)  # and comes back as it went in


def test_condition_frames_node_masks_the_chosen_latent_frames(core, models):
    latent = {"samples": torch.zeros(1, 48, 4, 3, 4)}
    (masked,) = core.pack.Cosmos3ConditionFrames().mask(latent, "0,2")
    assert masked["noise_mask"][0, 0, :, 0, 0].tolist() == [0.0, 1.0, 0.0, 1.0]
    with pytest.raises(core.pack.vae.InputError, match="at least 5 latent frames"):
        core.pack.Cosmos3ConditionFrames().mask(latent, "4")


def test_core_vae_decodes_and_encodes_like_the_pack(core, models):
    handle, _, vae = load(core, "Cosmos3-Edge")
    pipe = handle.pipeline
    raw = torch.randn(1, 48, 2, 3, 4)
    ours = pipe.decode(raw, raw=True)
    theirs = vae.decode(raw)[0]
    assert theirs.shape == ours.shape == (5, 48, 64, 3)
    assert (theirs - ours).abs().max() <= 1 / 255
    frames = torch.rand(5, 48, 64, 3)
    torch.testing.assert_close(vae.encode(frames), pipe.encode(frames, raw=True), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_core_vae_at_the_released_widths(core):
    """ComfyUI's own Wan 2.2 VAE class at dim 160 (the released build) with the pack VAE's weights (random,
    in the released shapes: about 2.8 GB of fp32 for the two copies)."""
    from cosmos3_tier2.nodes.core.vae import core_vae

    from cosmos3_runtime.tiny import vae_config
    from cosmos3_runtime.vae import VAEConfig, WanVAE

    torch.manual_seed(0)
    ours = WanVAE(VAEConfig.from_dict({**vae_config(0), "base_dim": 160, "decoder_base_dim": 256})).eval()
    vae = core_vae(ours)
    assert vae.first_stage_model.dim == 160
    raw = torch.randn(1, 48, 2, 2, 2)
    with torch.no_grad():
        expected = (ours.decode(raw).float() / 2 + 0.5).clamp(0, 1)[0].permute(1, 2, 3, 0)
    got = vae.decode(raw)[0]
    assert got.shape == expected.shape == (5, 32, 32, 3) and expected.std() > 0.01
    assert (got - expected).abs().max() <= 1 / 255


def test_refusals_name_the_problem_and_the_next_run_works(core, models):
    import comfy.model_management

    _, model, _ = load(core, "Cosmos3-Edge")
    positive, negative = encode(core, "a cat", "blurry")
    sigmas = torch.tensor([1.0, 0.5, 0.0])
    euler = core.samplers.sampler_object("euler")
    with pytest.raises(core.pack.vae.InputError, match="48-channel Wan 2.2 video latents.*16"):
        sample(core, model, positive, negative, torch.zeros(1, 16, 2, 3, 4), sigmas, euler, 3.0, seed=1)
    for edit in (lambda: core.nodes.ConditioningZeroOut().zero_out(negative),
                 lambda: core.nodes.ConditioningConcat().concat(positive, negative),
                 lambda: core.nodes.ConditioningAverage().addWeighted(positive, negative, 0.5)):
        with pytest.raises(RuntimeError, match="holds a prompt, not text embeddings"):
            edit()
    with pytest.raises(RuntimeError, match="only a Cosmos3 MODEL"):  # what any other core model does with c[0]
        comfy.model_management.cast_to_device(positive[0][0], torch.device("cpu"), torch.float16)
    clip_like = [[torch.zeros(1, 77, 768), {}]]
    with pytest.raises(core.pack.vae.InputError, match="Cosmos3 Text Encode"):
        sample(core, model, clip_like, negative, torch.zeros(1, 48, 2, 3, 4), sigmas, euler, 3.0, seed=1)
    out = sample(core, model, positive, negative, torch.zeros(1, 48, 2, 3, 4), sigmas, euler, 3.0, seed=1)
    assert out.shape == (1, 48, 2, 3, 4) and torch.isfinite(out).all()


def test_the_model_is_the_loaded_weights_and_an_independent_copy_can_be_made(core, models):
    """Same tensors (checkpoint names, so LoRA keys match); `cached_patcher_init` (what ComfyUI calls for a
    non-dynamic delegate under dynamic VRAM: TorchCompileModel, hooks) gives an independent copy that samples the same."""
    handle, model, _ = load(core, "Cosmos3-Edge")
    transformer = handle.pipeline.transformer
    weights = model.model.state_dict()
    key = "diffusion_model.layers.0.self_attn.add_q_proj.weight"
    assert weights[key].data_ptr() == transformer.layers[0].self_attn.add_q_proj.weight.data_ptr()
    assert sum(k.startswith("diffusion_model.") for k in weights) == len(transformer.state_dict())
    factory, args = model.cached_patcher_init
    copy = factory(*args, disable_dynamic=True)
    assert type(copy).__name__ == "ModelPatcher" and copy.model.diffusion_model.runtime[0] is not transformer
    positive, negative = encode(core, "a cat", "blurry")
    sigmas, euler = torch.tensor([1.0, 0.5, 0.0]), core.samplers.sampler_object("euler")
    latent = torch.zeros(1, 48, 2, 3, 4)
    assert torch.equal(sample(core, model, positive, negative, latent, sigmas, euler, 3.0, seed=4),
                       sample(core, copy, positive, negative, latent, sigmas, euler, 3.0, seed=4))


def test_media_attention_runs_on_comfyuis_backend_and_matches_sdpa(core, models, monkeypatch):
    """Inside ComfyUI the media attention calls ComfyUI's optimized_attention (what --use-sage-attention and
    --use-flash-attention select); outside, SDPA; same velocities. The causal text prefill stays SDPA."""
    import comfy.ldm.modules.attention as attention

    handle, model, _ = load(core, "Cosmos3-Edge")
    transformer = handle.pipeline.transformer
    assert transformer.layers[0].self_attn.media_attention is not None
    calls = []
    real = attention.optimized_attention
    monkeypatch.setattr(attention, "optimized_attention", lambda *a, **k: calls.append(k) or real(*a, **k))
    x, t = torch.randn(1, 48, 2, 3, 4), torch.tensor(600.0)
    text = transformer.encode_text(torch.arange(20))
    ours = transformer(x, t, text, None, 24.0).vision
    assert len(calls) == len(transformer.layers)  # media attention only
    transformer.use_media_attention(None)  # the runtime's own SDPA
    try:
        torch.testing.assert_close(ours, transformer(x, t, text, None, 24.0).vision, atol=1e-5, rtol=0)
    finally:
        transformer.use_media_attention(core.pack.services.memory.media_attention())
    assert len(calls) == len(transformer.layers)


def test_every_attention_backend_gets_kv_it_can_take(core, monkeypatch):
    """Grouped K/V (fewer key/value heads than query heads) go as they are only to ComfyUI's PyTorch backend, where
    SDPA runs them in a fused kernel; every other backend gets them expanded to the query heads (xformers, split and
    sub-quadratic attention assumed equal head counts before ComfyUI's grouped-query support). Each backend ComfyUI
    0.33 registers that runs on this CPU equals SDPA on the grouped inputs."""
    import comfy.ldm.modules.attention as attention
    import comfy.ops

    from cosmos3_tier2.cosmos3_runtime.devices import facts
    from cosmos3_tier2.cosmos3_runtime.transformer import attention as sdpa

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(40, 8, 64, generator=g), torch.randn(56, 2, 64, generator=g), torch.randn(56, 2, 64, generator=g)
    expected = sdpa(q, k, v)
    attend = core.pack.services.memory.media_attention()
    tried = []
    for name in ("pytorch", "split", "sub_quad", "basic", "xformers", "sage", "flash"):
        backend = attention.REGISTERED_ATTENTION_FUNCTIONS.get(name, attention.attention_basic if name == "basic" else None)
        if backend is None:
            continue  # not installed here (xformers, sage, flash need their packages and a GPU)
        seen = []

        def spy(q, k, v, heads, *args, backend=backend, **kwargs):
            seen.append((k.shape[1], kwargs.get("enable_gqa", False)))
            return backend(q, k, v, heads, *args, **kwargs)

        if name == "pytorch":  # the backend itself (recognised by identity); its SDPA call is what we watch
            real = comfy.ops.scaled_dot_product_attention
            monkeypatch.setattr(comfy.ops, "scaled_dot_product_attention", lambda q, k, v, *a, **kw: seen.append(
                (k.shape[1], kw.get("enable_gqa", False))) or real(q, k, v, *a, **kw))
        monkeypatch.setattr(attention, "optimized_attention", backend if name == "pytorch" else spy)
        out = attend(q, k, v)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0, msg=name)
        grouped = name == "pytorch" and facts(torch.device("cpu")).grouped_kv(torch.float32, 64)
        assert seen == [(2, True) if grouped else (8, False)], (name, seen)  # grouped, or eight key heads
        tried.append(name)
    assert {"pytorch", "split", "sub_quad", "basic"} <= set(tried), tried


def count_transformer_forwards(monkeypatch, handle) -> list:
    transformer, calls = handle.pipeline.transformer, []
    real = transformer.forward
    monkeypatch.setattr(transformer, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("cache", ["EasyCache", "LazyCache"])
@pytest.mark.parametrize("mode", ["t2v", "i2v"])
def test_step_caches_skip_forwards_and_keep_clean_frames_clean(core, models, monkeypatch, cache, mode):
    """EasyCache (a DIFFUSION_MODEL wrapper: it needs the network's forward behind the executor) and LazyCache
    (a PREDICT_NOISE wrapper) skip transformer forwards; the prompt and negative differ in length, so each
    has its own forwards and cache entries; on I2V the clean frame stays as encoded."""
    import comfy_extras.nodes_easycache as easycache
    from comfy_extras.nodes_wan import Wan22ImageToVideoLatent

    handle, model, vae = load(core, "Cosmos3-Edge")
    node = {"EasyCache": easycache.EasyCacheNode, "LazyCache": easycache.LazyCacheNode}[cache]
    cached = node.execute(model, 3.0, 0.1, 0.95, False).args[0]  # a threshold that lets it skip
    image = torch.rand(1, 48, 64, 3)
    latent = Wan22ImageToVideoLatent.execute(vae, 64, 48, 9, 1, start_image=image if mode == "i2v" else None).args[0]
    positive, negative = encode(core, "a cat walks", "blurry, static")
    sigmas = core.pack.Cosmos3Scheduler().build("unipc", 20, 0.0, model=handle)[1]
    calls = count_transformer_forwards(monkeypatch, handle)
    out = sample(core, cached, positive, negative, latent["samples"], sigmas, core.samplers.sampler_object("euler"),
                 4.0, seed=3, mask=latent.get("noise_mask"))
    assert len(calls) <= 2 * 20 * 2 / 3, len(calls)  # at least a third of the 40 forwards skipped
    assert torch.isfinite(out).all()
    if mode == "i2v":
        torch.testing.assert_close(out[:, :, :1], vae.encode(image), atol=1e-5, rtol=0)



def test_torch_compile_model_gives_the_plain_output_without_recompiling(core, models, monkeypatch):
    import comfy.ldm.modules.attention as attention
    import torch._dynamo
    from comfy_extras.nodes_torch_compile import TorchCompileModel

    # (ComfyUI's CPU default, sub-quadratic attention, reads free memory inside the graph: a guard that changes)
    monkeypatch.setattr(attention, "optimized_attention", attention.attention_pytorch)
    _, model, _ = load(core, "Cosmos3-Edge")
    compiled = TorchCompileModel.execute(model, "inductor").args[0]
    positive, negative = encode(core, "a cat", "blurry")
    sigmas, euler = torch.tensor([1.0, 0.7, 0.4, 0.0]), core.samplers.sampler_object("euler")
    latent = torch.zeros(1, 48, 2, 3, 4)
    plain = sample(core, model, positive, negative, latent, sigmas, euler, 3.0, seed=8)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    first = sample(core, compiled, positive, negative, latent, sigmas, euler, 3.0, seed=8)
    frames = dict(torch._dynamo.utils.counters["frames"])
    second = sample(core, compiled, positive, negative, latent, sigmas, euler, 3.0, seed=8)
    assert dict(torch._dynamo.utils.counters["frames"]) == frames  # the second run compiled nothing new
    torch.testing.assert_close(first, plain, atol=1e-4, rtol=0)
    assert torch.equal(first, second)
    assert not torch._dynamo.utils.counters["graph_break"]  # text-to-video: the whole forward is one graph


LORA_MODULES = ("layers.0.self_attn.add_q_proj", "layers.0.self_attn.to_k", "layers.1.mlp_moe_gen.down_proj")


def write_lora(path, transformer, prefix, rank=4, seed=0, modules=LORA_MODULES):
    """A PEFT-style LoRA (lora_A [r, in], lora_B [out, r], no alpha: scale 1) and its merged deltas."""
    from safetensors.torch import save_file

    generator, tensors, deltas = torch.Generator().manual_seed(seed), {}, {}
    for name in modules:
        weight = transformer.get_submodule(name).weight
        a = torch.randn(rank, weight.shape[1], generator=generator) * 0.3
        b = torch.randn(weight.shape[0], rank, generator=generator) * 0.3
        tensors[f"{prefix}{name}.lora_A.weight"], tensors[f"{prefix}{name}.lora_B.weight"] = a, b
        deltas[name] = b @ a
    save_file(tensors, str(path))
    return deltas


@pytest.fixture
def loras(core, tmp_path):
    core.folders.add_model_folder_path("loras", str(tmp_path))
    return tmp_path


def merged_model(core, models, name, deltas, strength):
    """The same checkpoint loaded again with the LoRA merged into its weights (the reference)."""
    import sys

    runtime = sys.modules["cosmos3_tier2.cosmos3_runtime"]
    pipe = runtime.load(models / name, dtype=torch.float32)
    pipe.transformer.use_media_attention(core.pack.services.memory.media_attention())
    with torch.no_grad():
        for module, delta in deltas.items():
            pipe.transformer.get_submodule(module).weight += strength * delta
    from cosmos3_tier2.nodes.core.model import model_patcher

    return model_patcher(pipe, torch.device("cpu"), torch.device("cpu")), pipe


@pytest.mark.parametrize("style", ["core loader, diffusion_model.*", "pack node, transformer.*",
                                   "pack node, base_model.model.*"])
def test_a_lora_equals_the_same_lora_merged_into_the_weights(core, models, loras, style):
    handle, model, _ = load(core, "Cosmos3-Edge")
    prefix = {"core": "diffusion_model.", "pack node, t": "transformer.", "pack node, b": "base_model.model."}[
        next(p for p in ("core", "pack node, t", "pack node, b") if style.startswith(p))]
    deltas = write_lora(loras / "cosmos3_test.safetensors", handle.pipeline.transformer, prefix)
    if style.startswith("core"):
        (patched,) = core.nodes.LoraLoaderModelOnly().load_lora_model_only(model, "cosmos3_test.safetensors", 0.7)
    else:
        result = core.pack.Cosmos3LoraLoader().load(model, "cosmos3_test.safetensors", 0.7)
        patched, report = result["result"]
        assert report.startswith("cosmos3_test.safetensors: 3 modules patched") and "not placed" not in report
    reference, _ = merged_model(core, models, "Cosmos3-Edge", deltas, 0.7)
    positive, negative = encode(core, "a cat", "blurry")  # to_k is on the text tower: the prompt's K/V change
    sigmas, euler = torch.tensor([1.0, 0.6, 0.3, 0.0]), core.samplers.sampler_object("euler")
    latent = torch.zeros(1, 48, 2, 3, 4)
    got = sample(core, patched, positive, negative, latent, sigmas, euler, 3.0, seed=6)
    expected = sample(core, reference, positive, negative, latent, sigmas, euler, 3.0, seed=6)
    plain = sample(core, model, positive, negative, latent, sigmas, euler, 3.0, seed=6)
    assert (expected - plain).abs().max() > 1e-2  # the LoRA does something
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)
    if not style.startswith("core"):
        (zero, _) = core.pack.Cosmos3LoraLoader().load(model, "cosmos3_test.safetensors", 0.0)["result"]
        assert torch.equal(sample(core, zero, positive, negative, latent, sigmas, euler, 3.0, seed=6), plain)


def test_lora_refusals_name_the_problem(core, models, loras):
    from safetensors.torch import save_file

    handle, model, _ = load(core, "Cosmos3-Edge")
    node = core.pack.Cosmos3LoraLoader()
    save_file({"double_blocks.0.img_attn.qkv.lora_A.weight": torch.zeros(4, 8),
               "double_blocks.0.img_attn.qkv.lora_B.weight": torch.zeros(8, 4)}, str(loras / "flux.safetensors"))
    with pytest.raises(core.pack.vae.InputError, match="looks like a LoRA for Flux"):
        node.load(model, "flux.safetensors", 1.0)
    save_file({"something.else.lora_A.weight": torch.zeros(4, 8)}, str(loras / "nothing.safetensors"))
    with pytest.raises(core.pack.vae.InputError, match="none of the 1 keys"):
        node.load(model, "nothing.safetensors", 1.0)
    transformer = handle.pipeline.transformer
    write_lora(loras / "shaped.safetensors", transformer, "transformer.", modules=LORA_MODULES[:1])
    from safetensors.torch import load_file

    tensors = load_file(str(loras / "shaped.safetensors"))
    tensors["transformer.layers.0.self_attn.add_q_proj.lora_A.weight"] = torch.zeros(4, 7)  # another model's width
    save_file(tensors, str(loras / "shaped.safetensors"))
    with pytest.raises(core.pack.vae.InputError, match="add_q_proj.weight.*does not fit"):
        node.load(model, "shaped.safetensors", 1.0)
    with pytest.raises(core.pack.vae.InputError, match="not a .safetensors file"):
        node.load(model, "../../etc/passwd", 1.0)
    positive, negative = encode(core, "a cat", "")
    out = sample(core, model, positive, negative, torch.zeros(1, 48, 2, 3, 4), torch.tensor([1.0, 0.0]),
                 core.samplers.sampler_object("euler"), 1.0, seed=1)
    assert torch.isfinite(out).all()  # the model is unharmed


def test_easycache_at_its_most_eager_still_ends_with_a_sensible_result(core, models, monkeypatch):
    import comfy_extras.nodes_easycache as easycache

    handle, model, _ = load(core, "Cosmos3-Edge")
    eager = easycache.EasyCacheNode.execute(model, 3.0, 0.0, 1.0, False).args[0]
    positive, negative = encode(core, "a cat", "blurry")
    sigmas = core.pack.Cosmos3Scheduler().build("unipc", 20, 0.0, model=handle)[1]
    calls = count_transformer_forwards(monkeypatch, handle)
    out = sample(core, eager, positive, negative, torch.zeros(1, 48, 2, 3, 4), sigmas,
                 core.samplers.sampler_object("euler"), 4.0, seed=3)
    assert 2 <= len(calls) < 40 and torch.isfinite(out).all() and out.abs().max() < 100
    plain = sample(core, model, positive, negative, torch.zeros(1, 48, 2, 3, 4), sigmas,
                   core.samplers.sampler_object("euler"), 4.0, seed=3)
    assert torch.isfinite(plain).all()  # and the model without the cache is untouched


def test_a_lora_on_the_core_model_leaves_the_pack_sampler_unchanged(core, models, loras):
    """Both paths share one patcher: ComfyUI unpatches the LoRA'd clone when the pack's sampler loads the model."""
    handle, model, _ = load(core, "Cosmos3-Edge")
    write_lora(loras / "shared.safetensors", handle.pipeline.transformer, "transformer.")
    text = core.pack.Cosmos3TextEncode().encode("a cat", "blurry", "auto", True, True, True)["result"][0]

    def pack_sample():
        return core.pack.Cosmos3Sampler().sample(handle, text, 64, 48, 5, 0.0, 3.0, "auto", 1)["result"][0]["samples"]

    before = pack_sample()
    patched, _ = core.pack.Cosmos3LoraLoader().load(model, "shared.safetensors", 1.0)["result"]
    positive, negative = encode(core, "a cat", "blurry")
    sample(core, patched, positive, negative, torch.zeros(1, 48, 2, 3, 4), torch.tensor([1.0, 0.5, 0.0]),
           core.samplers.sampler_object("euler"), 3.0, seed=1)
    assert torch.equal(pack_sample(), before)


def test_a_gguf_transformer_from_diffusion_models_runs_on_the_core_path(core, models, loras, tmp_path):
    """A .gguf picked in the loader's transformer_file: ComfyUI's memory manager counts its quantized bytes, core
    sampling runs on the quantized weights (close to the safetensors run), and a LoRA is refused."""
    from cosmos3_runtime.weights.gguf_convert import convert

    convert(models / "Cosmos3-Edge", tmp_path / "cosmos3-edge-q8_0.gguf", "q8_0")
    core.folders.add_model_folder_path("diffusion_models", str(tmp_path))
    loader = core.pack.Cosmos3ModelLoader()
    assert "cosmos3-edge-q8_0.gguf" in loader.INPUT_TYPES()["optional"]["transformer_file"][0]
    with pytest.raises(core.pack.vae.InputError, match="not a .gguf file in models/diffusion_models"):
        loader.load("Cosmos3-Edge", "fp32", "default", transformer_file="../cosmos3-edge-q8_0.gguf")
    whole = (tmp_path / "cosmos3-edge-q8_0.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(core.pack.loader.CheckpointError, match="truncated"):  # and nothing half-loaded is kept:
        loader.load("Cosmos3-Edge", "fp32", "default", transformer_file="cut.gguf")
    handle, _, info = loader.load("Cosmos3-Edge", "fp32", "default", transformer_file="cosmos3-edge-q8_0.gguf")["result"]
    assert "cosmos3-edge-q8_0.gguf" in info
    model, _ = core.pack.Cosmos3CoreModel().build(handle)
    transformer = handle.pipeline.transformer
    quantized = sum(p.numel() for p in transformer.parameters() if p.dtype == torch.uint8)
    assert quantized > 0.9 * sum(p.numel() * p.element_size() for p in transformer.parameters()) / 4
    held = sum(p.numel() * p.element_size() for p in transformer.parameters())
    assert held <= model.model_size() <= held + 4096  # the transformer's bytes (plus the sampling's sigma table)

    positive, negative = encode(core, "a red cube", "blurry")
    latent, sigmas = torch.zeros(1, 48, 2, 3, 4), torch.tensor([1.0, 0.6, 0.0])
    core_run = sample(core, model, positive, negative, latent, sigmas, core.samplers.sampler_object("euler"), 3.0, 2)
    _, plain_model, _ = load(core, "Cosmos3-Edge")
    plain = sample(core, plain_model, positive, negative, latent, sigmas, core.samplers.sampler_object("euler"), 3.0, 2)
    error = ((core_run - plain).abs().mean() / plain.abs().mean()).item()
    assert 1e-5 < error < 0.05, error  # Q8_0 weights: used, and close
    write_lora(loras / "on_gguf.safetensors", transformer, "transformer.", modules=LORA_MODULES[:1])
    with pytest.raises(core.pack.vae.InputError, match="stored quantized .*GGUF"):
        core.pack.Cosmos3LoraLoader().load(model, "on_gguf.safetensors", 1.0)


@pytest.fixture(scope="module")
def sim_transfer(core, tmp_path_factory):
    """Tiny framewise and chunkwise Sim-Transfer checkpoints under ComfyUI's models/cosmos3 names."""
    from cosmos3_runtime.tiny import make_tiny_checkpoint, sim_transfer_block

    root = tmp_path_factory.mktemp("cosmos3_sim")
    for name, block in {"Cosmos3-Nano-Sim-Transfer-Framewise": sim_transfer_block(1, window_frames=4, sink_frames=1),
                        "Cosmos3-Nano-Sim-Transfer": sim_transfer_block()}.items():
        make_tiny_checkpoint(root / name, kind="gated", dtype="float32", distilled=True, causal=block, reasoner=False)
    core.folders.add_model_folder_path("cosmos3", str(root))
    return root


def ar_video(core, name, frames, seed, num_frame_per_block=1, sigmas=None):
    """SamplerCustomAdvanced with BasicGuider, RandomNoise and SamplerARVideo (ComfyUI's own nodes) on a causal
    Sim-Transfer checkpoint: its edge control through Cosmos3 Sim Control (core), its sigmas from Cosmos3 Scheduler."""
    handle, model, _ = load(core, name)
    control = torch.rand(frames, 32, 48, 3, generator=torch.Generator().manual_seed(0))
    controls = core.pack.Cosmos3EdgeControl().add(control, core.pack.transfer.GIVEN)["result"][0]
    positive, _ = encode(core, "a robot arm stacks cubes", fps=30.0)
    positive, = core.pack.Cosmos3CoreSimControl().attach(positive, controls)
    if sigmas is None:
        _, sigmas = core.pack.Cosmos3Scheduler().build("auto", 0, 0.0, handle)
    latent = {"samples": torch.zeros(1, 48, (frames - 1) // 4 + 1, 2, 3)}
    return handle.pipeline, control, sample_ar(model, positive, latent, sigmas, seed, num_frame_per_block)


def sample_ar(model, positive, latent, sigmas, seed, num_frame_per_block):
    """ComfyUI's SamplerCustomAdvanced with BasicGuider, RandomNoise and SamplerARVideo -> the pack's normalised
    latents."""
    from comfy_extras.nodes_ar_video import SamplerARVideo
    from comfy_extras.nodes_custom_sampler import BasicGuider, RandomNoise, SamplerCustomAdvanced

    out = SamplerCustomAdvanced.execute(RandomNoise.execute(seed).result[0],
                                        BasicGuider.execute(model, positive).result[0],
                                        SamplerARVideo.execute(num_frame_per_block).result[0], sigmas, latent).result
    return model.model.process_latent_in(out[0]["samples"])


def test_a_framewise_sim_transfer_on_sampler_ar_video_equals_the_pack_rollout(core, sim_transfer):
    pipe, control, got = ar_video(core, "Cosmos3-Nano-Sim-Transfer-Framewise", 25, seed=7)
    expected = pipe.generate("a robot arm stacks cubes", control_videos={"edge": control}, width=48, height=32,
                             fps=30.0, seed=7, causal_seeds="comfyui").latents
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_what_sampler_ar_video_cannot_run_on_a_causal_checkpoint_is_refused(core, sim_transfer):
    InputError = core.pack.vae.InputError
    with pytest.raises(InputError, match="set num_frame_per_block to 1"):
        ar_video(core, "Cosmos3-Nano-Sim-Transfer-Framewise", 9, 1, num_frame_per_block=2)
    with pytest.raises(InputError, match="chunkwise Sim-Transfer.*Cosmos3 Sim-Transfer Sampler"):
        ar_video(core, "Cosmos3-Nano-Sim-Transfer", 17, 1, num_frame_per_block=4)
    with pytest.raises(InputError, match="fixed sigmas"):
        ar_video(core, "Cosmos3-Nano-Sim-Transfer-Framewise", 9, 1, sigmas=torch.tensor([1.0, 0.5, 0.0]))


@pytest.fixture(scope="module")
def sim_bimanual(core, tmp_path_factory):
    """A tiny Sim-Bimanual checkpoint (a window of 6 latent frames) under ComfyUI's models/cosmos3 names."""
    from cosmos3_runtime.tiny import make_tiny_checkpoint, sim_bimanual_block

    root = tmp_path_factory.mktemp("cosmos3_bimanual")
    make_tiny_checkpoint(root / "Cosmos3-Nano-Sim-Bimanual", kind="gated", dtype="float32", distilled=True,
                         action=True, reasoner=False, causal=sim_bimanual_block(window_frames=6))
    core.folders.add_model_folder_path("cosmos3", str(root))
    return root


def sim_actions(core, rows, seed, steps=0, num_frame_per_block=4, sigmas=None, size=(32, 64)):
    """Sim-Bimanual on SamplerARVideo: Cosmos3 Action's first image (8-bit, as Load Image's) and actions through
    Cosmos3 Sim Actions (core) (the MODEL's first image, the conditioning, the latent: at 832x480, the trained canvas
    nearest 2:1), sigmas from Cosmos3 Scheduler."""
    handle, model, _ = load(core, "Cosmos3-Nano-Sim-Bimanual")
    image = torch.randint(0, 256, (1, *size, 3), generator=torch.Generator().manual_seed(0)) / 255
    table = torch.randn(rows, 29, generator=torch.Generator().manual_seed(1))
    action, = core.pack.Cosmos3Action().build("forward_dynamics", "agibotworld", 0, "auto", "auto", "auto",
                                              image=image, actions={"actions": table})
    positive, _ = encode(core, "the robot folds a towel", fps=30.0)
    model, positive, latent = core.pack.Cosmos3CoreSimActions().attach(model, positive, action)
    if sigmas is None:
        _, sigmas = core.pack.Cosmos3Scheduler().build("auto", steps, 0.0, handle)
    got = sample_ar(model, positive, latent, sigmas, seed, num_frame_per_block)
    return handle.pipeline, action, got


@pytest.mark.parametrize("steps", [0, 4])  # NVIDIA's two steps a chunk ("step42"), the whole t_list
def test_sim_bimanual_on_sampler_ar_video_equals_the_pack_rollout(core, sim_bimanual, steps):
    pipe, action, got = sim_actions(core, 48, seed=5, steps=steps)  # 1 + 12 latent frames: the window evicts
    expected = pipe.generate("the robot folds a towel", action=action, fps=30.0, seed=5, steps=steps or None,
                             causal_seeds="comfyui", output="latents").latents
    assert got.shape == expected.shape == (1, 48, 13, 30, 52)  # 832x480: the trained canvas nearest 2:1
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_sim_bimanual_takes_its_first_image_from_arvideoi2v_too(core, sim_bimanual):
    """ARVideoI2V's MODEL (the image encoded by the core VAE) with the latent of Cosmos3 Sim Actions (core): the
    rollout is the pack's for an 8-bit image at the canvas's size. (The pack resizes with antialiasing and rounds to 8
    bits before encoding, as diffusers' PIL path does; ARVideoI2V resizes bilinearly and encodes the floats.)"""
    from comfy_extras.nodes_ar_video import ARVideoI2V

    pipe, action, expected = sim_actions(core, 16, seed=3, size=(480, 832))
    handle, model, vae = load(core, "Cosmos3-Nano-Sim-Bimanual")
    positive, _ = encode(core, "the robot folds a towel", fps=30.0)
    _, positive, latent = core.pack.Cosmos3CoreSimActions().attach(model, positive, action)
    model, _ = ARVideoI2V.execute(model, vae, action.image, 832, 480, 17, 1).result
    _, sigmas = core.pack.Cosmos3Scheduler().build("auto", 0, 0.0, handle)
    got = sample_ar(model, positive, latent, sigmas, 3, 4)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_what_sampler_ar_video_cannot_run_on_sim_bimanual_is_refused(core, sim_bimanual, sim_transfer):
    InputError = core.pack.vae.InputError
    with pytest.raises(InputError, match="set num_frame_per_block to 4"):
        sim_actions(core, 16, 1, num_frame_per_block=2)
    with pytest.raises(InputError, match="fixed sigmas"):
        sim_actions(core, 16, 1, sigmas=torch.tensor([1.0, 0.5, 0.0]))
    handle, model, _ = load(core, "Cosmos3-Nano-Sim-Bimanual")
    positive, _ = encode(core, "the robot folds a towel", fps=30.0)
    with pytest.raises(InputError, match="connect Cosmos3 Action through Cosmos3 Sim Actions \\(core\\)"):
        sample_ar(model, positive, {"samples": torch.zeros(1, 48, 5, 2, 4)}, torch.tensor([1.0, 0.0]), 1, 4)
    with pytest.raises(InputError, match="rolls out from its first image"):
        action, = core.pack.Cosmos3Action().build("forward_dynamics", "agibotworld", 0, "auto", "auto", "auto",
                                                  image=torch.rand(1, 32, 64, 3), actions={"actions": torch.randn(16, 29)})
        _, with_actions, latent = core.pack.Cosmos3CoreSimActions().attach(model, positive, action)
        _, sigmas = core.pack.Cosmos3Scheduler().build("auto", 0, 0.0, handle)
        sample_ar(model, with_actions, latent, sigmas, 1, 4)  # the MODEL without its first image
    _, transfer, _ = load(core, "Cosmos3-Nano-Sim-Transfer-Framewise")
    with pytest.raises(InputError, match="conditions a causal Sim-Bimanual checkpoint"):
        core.pack.Cosmos3CoreSimActions().attach(transfer, positive, action)
