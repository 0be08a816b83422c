"""What only a GPU would show, shown on the CPU: fp8 with the action and sound heads, the attention kernel a GPU gets,
CUDA's rule for scaled fp8 matmul outputs, the sound tokenizer's and the VAE statistics' precision, and runs whose
small modules a host's memory manager left in CPU memory (checked on a virtual device, `virtual_device.py`), up to
whole forwards at the released shapes.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import needs_cpu_scaled_fp8
from PIL import Image
from virtual_device import DeviceMix, VirtualDevice, place_like_a_host

import cosmos3_runtime
from cosmos3_runtime.action import ActionRequest
from cosmos3_runtime.geometry import RunGeometry
from cosmos3_runtime.weights.local_fp8 import Fp8Linear, per_row_fp8, scaled_fp8_linear
from cosmos3_runtime.tiny import RELEASED
from cosmos3_runtime import devices
from cosmos3_runtime.devices import DeviceFacts
from cosmos3_runtime.transformer import Cosmos3Transformer, Segment, TransformerConfig, attention

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def picture(seed, height=120, width=160):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


ACTIONS = {
    "policy": dict(mode="policy", image=picture(1)),
    "forward_dynamics": dict(mode="forward_dynamics", image=picture(2),
                             actions=torch.randn(4, 10, generator=torch.Generator().manual_seed(2))),
    "inverse_dynamics": dict(mode="inverse_dynamics", video=[picture(10 + i) for i in range(5)]),
}


@pytest.mark.parametrize("mode", ACTIONS)
def test_fp8_runs_the_action_head(tiny_factory, mode):
    """The per-domain tables are weight matrices (`x @ table[domain]`): they stay in full precision under fp8, so
    an fp8 action run works (it failed with 'BFloat16 != Float8_e4m3fn') and stays near the bf16 one."""
    root = tiny_factory(kind="edge", action=True)
    request = dict(action=ActionRequest(chunk_size=4, domain="droid_lerobot", resolution_tier=256, **ACTIONS[mode]),
                   steps=2, seed=3, output="latents")
    fp8 = cosmos3_runtime.load(root, dtype="bf16", device="cpu", quantize="fp8")
    assert fp8.transformer.action_proj_in.fc.weight.dtype == BF16
    bf16 = cosmos3_runtime.load(root, dtype="bf16", device="cpu")
    got, expected = fp8.generate("pick up the cube", **request), bf16.generate("pick up the cube", **request)
    assert (got.latents - expected.latents).abs().mean() < 0.1 * expected.latents.abs().mean()
    if mode == "forward_dynamics":
        assert got.actions is None
    else:
        assert torch.isfinite(got.actions).all()
        assert (got.actions - expected.actions).abs().mean() < 0.2 * expected.actions.abs().mean()


@pytest.mark.parametrize("quantize", ["fp8", pytest.param("fp8_scaled", marks=[needs_cpu_scaled_fp8, pytest.mark.slow])])
def test_fp8_runs_the_sound_head(tiny_factory, quantize):
    root = tiny_factory(kind="gated", sound=True)
    request = dict(width=64, height=48, num_frames=9, steps=2, seed=1, sound=True)
    got = cosmos3_runtime.load(root, dtype="bf16", device="cpu", quantize=quantize).generate("rain", **request)
    expected = cosmos3_runtime.load(root, dtype="bf16", device="cpu").generate("rain", **request)
    assert got.sound.shape == expected.sound.shape and torch.isfinite(got.sound).all()
    assert (got.sound_latents - expected.sound_latents).abs().mean() < 0.1 * expected.sound_latents.abs().mean()


def gpu(capability, **facts) -> DeviceFacts:
    return DeviceFacts("cuda", capability, **facts)


# (device, dtype) -> grouped K/V go to SDPA as they are (True) or expanded, and the dtype attention runs in
KERNEL_RULE = [
    (DeviceFacts("cpu", grouped_sdp=True), FP32, True, FP32),  # torch 2.9+: the CPU flash kernel takes groups
    (DeviceFacts("cpu", grouped_sdp=True), BF16, True, BF16),
    (DeviceFacts("cpu", grouped_sdp=False), BF16, False, BF16),  # torch 2.7 and 2.8: grouped inputs go to math
    (gpu((9, 0)), BF16, True, BF16),  # H100/H200: flash
    (gpu((8, 0)), FP16, True, FP16),  # A100
    (gpu((8, 6)), BF16, True, BF16),  # RTX 30xx
    (gpu((12, 0)), BF16, True, BF16),  # RTX 50xx
    (gpu((9, 0)), FP32, False, FP32),  # fp32 on any GPU: no flash, math would hold the scores
    (gpu((8, 9)), FP32, False, FP32),
    (gpu((7, 5)), FP16, False, FP16),  # T4, RTX 20xx: no flash
    (gpu((7, 5)), BF16, False, FP16),  # ... and no bf16 in the memory-efficient kernel: it runs in fp16
    (gpu((7, 0)), BF16, False, FP16),  # V100
    (gpu((7, 0)), FP32, False, FP32),
    (gpu((6, 1)), FP32, False, FP32),  # GTX 10xx
    (gpu((9, 0), flash_sdp=False), BF16, False, BF16),  # flash turned off by the user
    (gpu((9, 4), rocm=True), BF16, False, BF16),  # ROCm
    (DeviceFacts("mps"), FP16, False, FP16),
    (DeviceFacts("meta"), BF16, False, BF16),
]


@pytest.mark.parametrize("device, dtype, grouped, attention_dtype", KERNEL_RULE)
def test_which_attention_inputs_each_gpu_gets(device, dtype, grouped, attention_dtype):
    assert device.grouped_kv(dtype, 128) is grouped
    assert device.attention_dtype(dtype) == attention_dtype


def test_the_rule_on_odd_head_dims_and_masks():
    assert not gpu((9, 0)).grouped_kv(BF16, 320)  # flash takes head dims up to 256
    assert not gpu((9, 0)).grouped_kv(BF16, 128, masked=True)  # nor masks (the Reasoner's fixed-shape step)


@pytest.mark.parametrize("causal, masked", [(False, False), (True, False), (False, True)])
def test_the_runtime_attention_never_runs_the_math_kernel_on_this_torch(causal, masked):
    """What SDPA does with grouped K/V depends on the torch release (the CPU's flash kernel takes them from 2.9 on;
    2.7 and 2.8 fall back to the math kernel, 9 GB for a 16k-token prompt): on the installed torch the runtime's
    attention runs a fused kernel, grouped or expanded, in every case it uses."""
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(64, 8, 64, generator=g), torch.randn(64, 2, 64, generator=g), torch.randn(64, 2, 64, generator=g)
    mask = torch.arange(64) < 40 if masked else None
    with profile(activities=[ProfilerActivity.CPU]) as p:
        attention(q, k, v, causal=causal, mask=mask)
    names = {e.name for e in p.events() if "scaled_dot_product" in e.name}
    assert not any("math" in n for n in names) and len(names) > 1, names


def test_expanded_keys_give_the_grouped_result(monkeypatch):
    """Expansion repeats each K/V head for its query group, as SDPA's grouped mode pairs them."""
    import cosmos3_runtime.transformer as transformer

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(50, 8, 32, generator=g), torch.randn(70, 2, 32, generator=g), torch.randn(70, 2, 32, generator=g)
    grouped = attention(q, k, v)
    seen = []
    original = F.scaled_dot_product_attention

    def sdpa(q, k, v, **kwargs):
        seen.append((k.shape[1], kwargs.get("enable_gqa", False)))
        return original(q, k, v, **kwargs)

    monkeypatch.setitem(devices._FACTS, ("cpu", None), DeviceFacts("cpu"))  # a device whose SDPA takes no groups
    monkeypatch.setattr(transformer.F, "scaled_dot_product_attention", sdpa)
    torch.testing.assert_close(attention(q, k, v), grouped, atol=1e-6, rtol=0)
    assert seen == [(8, False)]  # eight key heads, no grouped mode: a memory-efficient kernel can take it


def test_a_card_without_bf16_attention_runs_it_in_fp16(monkeypatch):
    """On a T4 or V100 the bf16 attention call goes to SDPA in fp16 (and K/V expanded) and comes back in bf16."""
    import cosmos3_runtime.transformer as transformer

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(40, h, 32, generator=g).to(BF16) for h in (8, 2, 2))
    seen = []
    original = F.scaled_dot_product_attention

    def sdpa(q, k, v, **kwargs):
        seen.append((q.dtype, k.dtype, k.shape[1]))
        return original(q, k, v, **kwargs)

    expected = attention(q.float(), k.float(), v.float())
    monkeypatch.setitem(devices._FACTS, ("cpu", None), gpu((7, 5)))
    monkeypatch.setattr(transformer.F, "scaled_dot_product_attention", sdpa)
    out = attention(q, k, v)
    assert seen == [(FP16, FP16, 8)] and out.dtype == BF16
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=0)


@needs_cpu_scaled_fp8
def test_scaled_fp8_matmul_outputs_bf16_as_cuda_requires(monkeypatch):
    """CUDA's row-wise scaled matmul makes bf16 outputs only (fp16/fp32 are refused): the scaled path asks for bf16
    whatever the activations' dtype and casts afterwards. `torch._scaled_mm` is wrapped with CUDA's rule here."""
    original = torch._scaled_mm

    def cuda_rule(a, b, scale_a, scale_b, out_dtype=None, **kwargs):
        if scale_a.numel() > 1 and out_dtype != BF16:
            raise RuntimeError("Only bf16 high precision output types are supported for row-wise scaling.")
        return original(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", cuda_rule)
    weight, scale = per_row_fp8(torch.randn(32, 64, generator=torch.Generator().manual_seed(0)) / 8)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1))
    reference = x @ (weight.float() * scale[:, None]).t()
    for dtype in (FP32, FP16, BF16):
        out = scaled_fp8_linear(x.to(dtype), weight, scale, None)
        assert out.dtype == dtype
        assert (out.float() - reference).abs().mean() < 0.05 * reference.abs().mean()


def test_the_sound_tokenizer_decodes_in_fp32_under_a_bf16_model(tiny_factory):
    pipe = cosmos3_runtime.load(tiny_factory(kind="gated", sound=True), dtype="bf16", device="cpu")
    assert pipe.sound_tokenizer.dtype == FP32 and pipe.vae.dtype == BF16


def held_by_a_host(root, **options):
    """A pipeline whose big linears are on the virtual device and every other module's parameters in CPU memory."""
    pipe = cosmos3_runtime.load(root, dtype="bf16", device="cpu", **options)
    place_like_a_host(pipe.transformer, streamed=(torch.nn.Linear, Fp8Linear))
    return pipe


@pytest.mark.parametrize("kind, heads", [("edge", dict(action=True)), ("gated", dict(sound=True))])
@pytest.mark.parametrize("quantize", [None, "fp8"])
def test_a_forward_runs_where_its_inputs_are_when_small_modules_stay_in_ram(tiny_factory, kind, heads, quantize):
    """ComfyUI's low-VRAM loading streams only its cast layers and leaves norms, embeddings, the time embedder,
    modality embeddings and action tables in RAM. Before: a norm mixed devices, or the run followed such a module
    to the CPU. Now the run stays on its inputs' device and every small parameter comes to it."""
    model = held_by_a_host(tiny_factory(kind=kind, **heads), quantize=quantize).transformer
    meta = torch.device("meta")
    assert model.layers[0].input_layernorm.weight.device.type == "cpu"
    tracks = [Segment("action", torch.randn(5, 64, device=meta), domain=3) if "action" in heads else
              Segment("sound", torch.randn(7, 16, device=meta))]
    with torch.inference_mode(), VirtualDevice() as virtual:
        text = model.encode_text(torch.arange(12), meta)
        out = model(torch.randn(1, 48, 2, 4, 6, device=meta), torch.tensor(900), text, tracks=tracks)
    assert out.vision.device == meta and len(out.tracks) == 1 and out.tracks[0].device == meta
    assert virtual.ops > 100


def test_the_checker_refuses_what_a_gpu_refuses():
    with VirtualDevice(), pytest.raises(DeviceMix, match="mixes devices"):
        torch.empty(4, 3, device="meta") * torch.ones(4, 3)
    with VirtualDevice(), pytest.raises(DeviceMix, match="mixes devices"):  # the meta kernel alone lets this pass
        torch.empty(4, 3, device="meta") @ torch.ones(3, 2)
    with VirtualDevice(), pytest.raises(DeviceMix, match="mixes dtypes"):
        torch.empty(4, 3, device="meta", dtype=BF16) @ torch.empty(3, 2, device="meta", dtype=torch.float8_e4m3fn)
    with VirtualDevice():  # a CPU scalar and CPU indices are fine, as on CUDA
        torch.empty(4, 3, device="meta")[torch.tensor([0, 2])] * torch.tensor(2.0)


@pytest.mark.parametrize("kind", ["gated", "edge"])
def test_the_reasoner_runs_where_its_inputs_are_when_small_modules_stay_in_ram(tiny_factory, kind):
    """The Reasoner's vision tower (layer norms, patch convolution, position table) and its language model (norm
    gains) under the same placement."""
    from cosmos3_runtime.reasoner.language import KVCache

    pipe = cosmos3_runtime.load(tiny_factory(kind=kind), dtype="bf16", device="cpu", parts="reasoner")
    reasoner, meta = pipe.reasoner, torch.device("meta")
    for part in (pipe.transformer, *reasoner.parts):
        place_like_a_host(part)
    patch_dim = reasoner.vision.config.in_channels if kind == "gated" else reasoner.vision.config.num_channels
    patch_dim *= reasoner.vision.config.patch_size**2 * (reasoner.vision.config.temporal_patch_size if kind == "gated"
                                                         else 1)
    with torch.inference_mode(), VirtualDevice():
        tokens, _ = reasoner.vision(torch.randn(16, patch_dim, device=meta), [(1, 4, 4)])
        x = reasoner.language.embed(torch.arange(6), meta)
        cache = KVCache(reasoner.language.config, 8, x.dtype, meta)
        logits = reasoner.language.forward(x, torch.zeros(3, 6, dtype=torch.long, device=meta), cache)
    assert tokens.device == meta and logits.device == meta


HEADS = {"edge": dict(action_gen=True, action_dim=64), "nano": dict(sound_gen=True, sound_dim=64), "super": {}}


@pytest.mark.parametrize("variant, size", [("edge", (832, 480, 81)), ("nano", (1280, 720, 81)),
                                           ("super", (1280, 720, 121))])
@pytest.mark.parametrize("precision", ["bf16", "fp32", "fp8"])
def test_a_virtual_gpu_runs_the_released_shapes(variant, size, precision):
    """A whole forward at a released size on the virtual device, weights there too: no device or dtype mix, and the
    activations' peak within the runtime's estimate (the planner refuses from it) plus a quarter."""
    from cosmos3_runtime import budget
    from cosmos3_runtime.weights.local_fp8 import quantize_fp8

    config = TransformerConfig(**RELEASED[variant], **HEADS[variant])
    dtype = FP32 if precision == "fp32" else BF16
    with torch.device("meta"):
        model = Cosmos3Transformer(config).to(dtype)
    model.time_embedder.float()
    if precision == "fp8":
        quantize_fp8(model)
    meta = torch.device("meta")
    w, h, f = size
    tracks = [Segment("action", torch.randn(16, 64, device=meta), domain=0)] if config.action_gen else \
        [Segment("sound", torch.randn(126, 64, device=meta))] if config.sound_gen else []
    with torch.inference_mode(), VirtualDevice() as virtual:
        text = model.encode_text(torch.arange(300) % 1000, meta)
        out = model(torch.randn(1, 48, 1 + (f - 1) // 4, h // 16, w // 16, device=meta), torch.tensor(900), text,
                    tracks=tracks)
    assert out.vision.shape == (1, 48, 1 + (f - 1) // 4, h // 16, w // 16)
    parts = budget.estimate(config, None, RunGeometry(h, w, f, f), 300, 300, dtype, device=meta).parts
    planned = parts["media tower"] + parts["rotary tables"] + parts["text K/V cache"]
    assert virtual.peak <= 1.25 * planned, (virtual.peak / 2**30, planned / 2**30)


@pytest.mark.parametrize("size, tile", [((832, 480, 17), None), ((1280, 720, 9), None), ((1280, 720, 9), 32)])
def test_the_planned_vae_decode_holds_what_a_decode_takes_at_the_released_width(size, tile):
    """The VAE decode at the released width on the virtual device: its peak within the planner's decode estimate
    (working set plus output) and not far under it."""
    from cosmos3_runtime import budget
    from cosmos3_runtime.tiny import vae_config
    from cosmos3_runtime.vae import TileSpec, VAEConfig, WanVAE

    config = VAEConfig.from_dict(vae_config(base_dim=160, decoder_base_dim=256))
    with torch.device("meta"):
        vae = WanVAE(config).to(BF16)
    w, h, f = size
    latents = torch.empty(1, 48, 1 + (f - 1) // 4, h // 16, w // 16, device="meta")
    spec = None if tile is None else TileSpec(size=tile, overlap=8)
    with torch.inference_mode(), VirtualDevice() as virtual:
        vae.decode(latents, tile=spec)
    parts = budget.estimate(TransformerConfig(**RELEASED["edge"]), config, RunGeometry(h, w, f, f), 10, 10, BF16,
                            spec).parts
    planned = parts["VAE decode"]  # the working set and the decode's own output
    assert virtual.peak <= planned <= 1.1 * virtual.peak, (virtual.peak / 2**30, planned / 2**30)


def released_pipeline(tiny_factory, variant: str, tmp_path=None, official_fp8: bool = False, layers: int = 4, **tiny):
    """A pipeline whose transformer (the released shapes, `layers` of them: a run holds one layer's activations at a time)
    and VAE (the released widths) live on the virtual device, with the tiny checkpoint's tokenizer and configs (`official_fp8`: its config declares NVIDIA's FP8, and every
    layer's linears are calibrated fp8 shells, so the run quantizes its activations as such a checkpoint does; `tiny`:
    more options of the tiny checkpoint, a causal block)."""
    import json
    import shutil

    from cosmos3_runtime.tiny import vae_config
    from cosmos3_runtime.transformer import pathway_of
    from cosmos3_runtime.vae import VAEConfig, WanVAE
    from cosmos3_runtime.weights.modelopt_fp8 import ModelOptFp8Linear

    root = tiny_factory(kind="edge" if variant == "edge" else "gated", **tiny)
    if official_fp8:
        root = shutil.copytree(root, tmp_path / "fp8")
        config = root / "transformer" / "config.json"
        config.write_text(json.dumps({**json.loads(config.read_text()),
                                      "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}}))
    pipe = cosmos3_runtime.load(root, device="cpu", dtype="bf16")
    config = TransformerConfig(**{**RELEASED[variant], "num_hidden_layers": layers})
    vae = VAEConfig.from_dict(vae_config(base_dim=160, decoder_base_dim=256))
    with torch.device("meta"):
        pipe.transformer, pipe.vae = Cosmos3Transformer(config).to(BF16), WanVAE(vae).to(BF16)
    pipe.transformer.time_embedder.float()
    if official_fp8:
        for name, module in list(pipe.transformer.named_modules()):
            for child, linear in list(module.named_children()):
                full = f"{name}.{child}" if name else child
                if isinstance(linear, torch.nn.Linear) and full.startswith("layers."):
                    shell = ModelOptFp8Linear(linear, calibrated=True, pathway=pathway_of(full))
                    shell.input_key = 1.0
                    setattr(module, child, shell)
    pipe.device = pipe.planner.device = torch.device("meta")
    pipe.planner.transformer_config, pipe.planner.vae_config = config, vae
    return pipe


CLIP = dict(width=832, height=480, seed=0, check_memory=False)


def own_peaks(monkeypatch, owner, name: str, virtual: VirtualDevice, peaks: list) -> None:
    """Each call of `owner.name` appends its own peak on `virtual` to `peaks` (the run's peak kept as well)."""
    run = getattr(owner, name)

    def measured(*args, **kwargs):
        before, virtual.peak = virtual.peak, virtual.allocated
        try:
            return run(*args, **kwargs)
        finally:
            peaks.append(virtual.peak)
            virtual.peak = max(before, virtual.peak)

    monkeypatch.setattr(owner, name, measured)


def steps_plan(estimate) -> int:
    """The plan's peak during the steps: what it holds throughout, and the steps' own parts."""
    from cosmos3_runtime import budget

    held = estimate.total - max(sum(estimate.parts.get(n, 0) for n in phase) for phase in estimate.phases)
    return held + sum(estimate.parts.get(n, 0) for n in estimate.phases[budget.STEPS])


@pytest.mark.parametrize("run", ["long video", "transfer with SeaCache", "official FP8 without fp8 matmuls"])
def test_a_whole_run_peaks_where_the_plan_says(tiny_factory, tmp_path, monkeypatch, run):
    """A whole run at the released shapes on the virtual device (weights there too; what leaves it reads as zeros)
    peaks within 10 % of the plan the memory check refuses from. Before, the plan missed SeaCache's stored residuals,
    the previous chunk's whole float32 decode kept through the next chunk (now only the frames the next one starts
    from), W8A8's float32 temporaries and the VAE encode."""
    from cosmos3_runtime import running, step_cache

    monkeypatch.setattr(step_cache, "relative_l1", lambda a, b: torch.tensor(0.1))  # no values here: skip 3 in 4
    monkeypatch.setattr(running.FiniteCheck, "check", lambda self: None)  # nor anything to find infinite
    if run == "long video":
        pipe = released_pipeline(tiny_factory, "edge")
        request = dict(num_frames=73, chunk_frames=41, steps=2, guidance_scale=5.0, cache="off")
    elif run == "transfer with SeaCache":
        pipe = released_pipeline(tiny_factory, "nano")
        controls = {"edge": torch.rand(33, 480, 832, 3), "depth": torch.rand(33, 480, 832, 3)}
        request = dict(control_videos=controls, chunk_frames=17, steps=6, guidance_scale=3.0, cache="seacache")
    else:  # an A100: W8A8 runs its fp8 products unfused, through float32 copies
        monkeypatch.setitem(devices._FACTS, ("meta", None), DeviceFacts("cuda", (8, 0)))
        pipe = released_pipeline(tiny_factory, "nano", tmp_path, official_fp8=True)
        request = dict(num_frames=61, steps=2, guidance_scale=5.0, output="latents", cache="off")
    plan = pipe.plan("A robot arm stacks two cubes on a table.", **CLIP, **request)
    steps, virtual = [], VirtualDevice(readable=True)  # each sampling loop's own peak (the run's is often the decode's)
    own_peaks(monkeypatch, pipe.denoiser, "denoise", virtual, steps)
    with torch.inference_mode(), virtual:
        pipe.generate(plan)
    estimate = plan.estimate
    planned_steps = steps_plan(estimate)
    for measured, planned in ((virtual.peak, estimate.total), (max(steps), planned_steps)):
        assert 0.9 * planned <= measured <= 1.1 * planned, (measured / 2**30, planned / 2**30, estimate.describe())
    if run == "official FP8 without fp8 matmuls":
        assert "W8A8 products" in plan.estimate.parts


def test_fp16_keeps_what_overflows_in_bf16(tiny_factory, caplog):
    """fp16, honestly: the text tower (and the Reasoner on it) overflows fp16 as Qwen3's activations do, and Edge's
    squared-ReLU MLPs once |u| > 256 (relu(u)^2 > 65504): those stay in bf16, the released precision, with a note;
    the gated checkpoints' media pathway runs in fp16."""
    from cosmos3_runtime.transformer import relu_squared, tower_of

    assert torch.isinf(relu_squared(torch.tensor(257.0, dtype=FP16)))
    assert not torch.isinf(relu_squared(torch.tensor(255.0, dtype=FP16)))
    with caplog.at_level("WARNING"):
        gated = cosmos3_runtime.load(tiny_factory(kind="gated"), dtype="fp16", device="cpu")
        edge = cosmos3_runtime.load(tiny_factory(kind="edge"), dtype="fp16", device="cpu")
    assert "the text tower stays in bf16" in caplog.text and "Edge runs in bf16" in caplog.text
    dtypes = {(tower_of(n), p.dtype) for n, p in gated.transformer.named_parameters() if p.dtype != FP32}
    assert dtypes == {("text tower", BF16), ("media tower", FP16), ("embeddings and heads", FP16)}
    assert (gated.transformer.dtype, gated.transformer.text_dtype, gated.reasoner.head.norm.weight.dtype) == \
        (FP16, BF16, BF16)
    assert {p.dtype for p in edge.transformer.parameters()} == {BF16, FP32}
    result = gated.generate("a cat", width=64, height=48, num_frames=5, steps=2, output="latents")
    assert torch.isfinite(result.latents).all()
    assert gated.reason("What is this?", max_new_tokens=3, temperature=0.0).token_ids


@pytest.mark.parametrize("part, dtype", [("the media tower", "float16"), ("the text tower", "bfloat16"),
                                         ("the VAE decoder", "float16")])
def test_a_run_that_overflows_names_the_part(tiny_factory, part, dtype):
    """One finite check per run (read once, at its end) names the part whose values overflowed and its dtype,
    instead of returning a black or noisy clip."""
    pipe = cosmos3_runtime.load(tiny_factory(kind="gated"), dtype="fp16", device="cpu")
    module = {"the media tower": pipe.transformer.layers[0].mlp_moe_gen.down_proj,
              "the text tower": pipe.transformer.layers[0].mlp.down_proj,
              "the VAE decoder": pipe.vae.decoder.conv_in}[part]
    with torch.no_grad():
        module.weight.fill_(torch.finfo(module.weight.dtype).max)  # every output of that layer past its range
    with pytest.raises(cosmos3_runtime.NumericalError, match=f"{part} produced inf or NaN values in {dtype}"):
        pipe.generate("a cat", width=64, height=48, num_frames=5, steps=2)


@pytest.mark.parametrize("history, card", [("device", (9, 0)), ("cpu", (9, 0)), ("fp8", (9, 0)), ("device", (7, 5))])
def test_a_causal_chunk_peaks_where_the_plan_says(tiny_factory, monkeypatch, history, card):
    """A framewise Sim-Transfer rollout (window 30, 3 sinks) at the released 480p shape on a virtual GPU (one Nano
    layer: the history per layer is what differs): each chunk's sampling and commits peak within 10 % of the plan's
    steps. Attention reads a history on the device in place, so on an H100 (grouped K/V in SDPA) the plan counts no
    joined [text ; history ; media] copy (it did: 24 % over here), on a T4 only the fp16 and query-head copies SDPA
    gets; a CPU-held or fp8 history is read through one workspace the layers share, held from the first forward on;
    the streamed decode's causal state (here in line, the meta device not being CUDA) is held from chunk to chunk.
    The CPU-held history stays in host memory beside the device's forwards, with no device mix in any op.
    (FakeTensorMode cannot stand in for a CUDA device here: on a torch built without CUDA, slicing a fake CUDA
    tensor fails with "PyTorch is not linked with support for cuda devices".)"""
    from cosmos3_runtime import causal_run, running
    from cosmos3_runtime.tiny import FRAMEWISE, sim_transfer_block

    monkeypatch.setattr(running.FiniteCheck, "check", lambda self: None)
    monkeypatch.setitem(devices._FACTS, ("meta", None), DeviceFacts("cuda", card))
    pipe = released_pipeline(tiny_factory, "nano", layers=1, distilled=True, causal=sim_transfer_block(**FRAMEWISE),
                             reasoner=False)
    plan = pipe.plan("A robot arm stacks two cubes on a table.", **CLIP, control_videos={"edge": torch.rand(49, 480, 832, 3)},
                     causal_history=history)
    peaks, caches, virtual = [], [], VirtualDevice(readable=True)
    own_peaks(monkeypatch, pipe.denoiser, "denoise", virtual, peaks)
    own_peaks(monkeypatch, causal_run.KVHistory, "commit", virtual, peaks)
    media_kv = causal_run.MediaKV
    monkeypatch.setattr(causal_run, "MediaKV", lambda *args, **kwargs: caches.append(media_kv(*args, **kwargs)) or
                        caches[-1])
    with torch.inference_mode(), virtual:
        pipe.generate(plan)
    # (its window never fills in 49 frames: no chunk is captured in a CUDA graph, whose pool the plan holds for later)
    planned = steps_plan(plan.estimate) - plan.estimate.parts.get("chunk step graph", 0)
    assert 0.9 * planned <= max(peaks) <= 1.1 * planned, (max(peaks) / 2**30, planned / 2**30, plan.estimate.describe())
    assert caches[0].keys.device.type == ("cpu" if history == "cpu" else "meta")
    assert (caches[0].workspace is None) == (history == "device")
