"""Low-VRAM loading: text tower offload and block swap (bit-identical), fp8 weights (bounded error, half the bytes)."""

from dataclasses import replace

import pytest
import torch

import cosmos3_runtime
from conftest import needs_cpu_scaled_fp8
from cosmos3_runtime.transformer import tower_of
from cosmos3_runtime.weights.format import weight_bytes
from cosmos3_runtime.weights.local_fp8 import Fp8Linear
from cosmos3_runtime.weights.modelopt_fp8 import ModelOptFp8Linear

REQUEST = dict(width=64, height=48, num_frames=9, steps=3, seed=1, output="latents", negative_prompt="blurry")


@pytest.fixture(scope="module")
def reference(tiny_gated):
    return cosmos3_runtime.load(tiny_gated, dtype="bf16", device="cpu").generate("a cat", **REQUEST).latents


@pytest.mark.parametrize("options", [dict(offload_text=True), dict(blocks_to_swap=1),
                                     dict(offload_text=True, blocks_to_swap=2)], ids=str)
def test_offload_text_and_block_swap_are_bit_identical(tiny_gated, reference, options):
    pipe = cosmos3_runtime.load(tiny_gated, dtype="bf16", device="cpu", **options)
    assert torch.equal(pipe.generate("a cat", **REQUEST).latents, reference)


def test_block_swap_keeps_at_most_two_swapped_layers_on_the_device(tiny_factory):
    """The placement is the bookkeeping's: which swapped layers have device copies, checked at every layer."""
    root = tiny_factory(kind="edge", overrides={"num_hidden_layers": 4})
    pipe = cosmos3_runtime.load(root, dtype="fp32", device="cpu", offload_text=True, blocks_to_swap=3)
    swap, seen = pipe.block_swap, []
    original = type(pipe.transformer.layers[0]).media

    def media(layer, *args, **kwargs):
        i = list(pipe.transformer.layers).index(layer)
        seen.append((i, swap.resident(), pipe.denoiser.text_offload.on_compute))
        return original(layer, *args, **kwargs)

    type(pipe.transformer.layers[0]).media = media
    try:
        pipe.generate("a cat", **{**REQUEST, "steps": 1})
    finally:
        type(pipe.transformer.layers[0]).media = original
    assert [i for i, _, _ in seen] == [0, 1, 2, 3] * 2  # one step, CFG: two forwards
    for i, resident, text_on_device in seen:
        assert len(resident) <= 2 and (i not in swap.swapped or i in resident) and not text_on_device
    assert [r for i, r, _ in seen[:4]] == [[0, 1], [1, 2], [2], []]  # the next one prefetched, the last dropped
    assert swap.resident() == [] and swap.most_resident == 2
    for p in swap.held() + pipe.denoiser.text_offload.held():  # back in CPU memory after the run
        assert p.device.type == "cpu"


def test_the_text_tower_visits_the_device_only_while_encoding(tiny_gated, monkeypatch):
    """Once per request for both prompts, and its home copies are kept, never copied back."""
    from cosmos3_runtime.offload import TextOffload

    pipe = cosmos3_runtime.load(tiny_gated, dtype="fp32", device="cpu", offload_text=True)
    during, visits = [], []
    pipe.transformer.embed_tokens.register_forward_pre_hook(lambda *_: during.append(pipe.denoiser.text_offload.on_compute))
    homes = [home.data_ptr() for _, home in pipe.denoiser.text_offload.homes]
    original = TextOffload._point_home
    monkeypatch.setattr(TextOffload, "_point_home", lambda self: visits.append(1) or original(self))
    pipe.generate("a cat", **REQUEST)
    assert during == [True, True] and not pipe.denoiser.text_offload.on_compute  # cond and uncond prompts
    assert len(visits) == 1  # one visit for both
    assert [p.data.data_ptr() for p in pipe.denoiser.text_offload.held()] == homes  # the same home copies as before
    names = {name for name, _ in pipe.transformer.named_parameters() if tower_of(name) == "text tower"}
    assert "embed_tokens.weight" in names and "layers.0.self_attn.to_k.weight" in names
    assert not any("moe_gen" in name or ".add_" in name for name in names)


def test_fp8_weights(tiny_factory, tiny_gated, reference):
    """Error against bf16 (stated in the README) and the bytes it saves, on released-like proportions."""
    small = tiny_factory(kind="edge", size="small")
    bf16 = cosmos3_runtime.load(small, dtype="bf16", device="cpu")
    fp8 = cosmos3_runtime.load(small, dtype="bf16", device="cpu", quantize="fp8")
    assert weight_bytes(fp8.transformer) <= 0.55 * weight_bytes(bf16.transformer)
    assert all(not isinstance(m, Fp8Linear) for m in fp8.transformer.time_embedder.modules())  # kept fp32
    latents = torch.randn(1, 48, 2, 4, 6, generator=torch.Generator().manual_seed(0))
    text = bf16.transformer.encode_text(torch.arange(40) % 500)
    text8 = fp8.transformer.encode_text(torch.arange(40) % 500)
    v16 = bf16.transformer(latents, torch.tensor(900), text).vision.float()
    v8 = fp8.transformer(latents, torch.tensor(900), text8).vision.float()
    relative = (v8 - v16).abs() / v16.abs().max()
    assert relative.max() < 0.1 and relative.mean() < 0.02, (relative.max(), relative.mean())
    tiny8 = cosmos3_runtime.load(tiny_gated, dtype="bf16", device="cpu", quantize="fp8")
    end = tiny8.generate("a cat", **REQUEST).latents
    assert (end - reference).abs().mean() < 0.1 * reference.abs().mean()  # end to end, 3 steps


def test_bad_low_vram_options(tiny_gated):
    with pytest.raises(cosmos3_runtime.InputError, match="quantize must be None, 'fp8' or 'fp8_scaled'"):
        cosmos3_runtime.load(tiny_gated, quantize="int4")
    with pytest.raises(cosmos3_runtime.InputError, match="blocks_to_swap must be 0 or more"):
        cosmos3_runtime.load(tiny_gated, blocks_to_swap=-1)


def test_modelopt_fp8_checkpoints_are_read_with_their_scales(tiny_gated, tmp_path):
    """A weight-only ModelOpt file (`*.weight_quantizer._scale` and `_amax`, no input range): the per-tensor scales
    applied, the model equals a bf16 checkpoint holding the dequantized weights. (Calibrated files, with input
    ranges, run W8A8: tests/test_weights_modelopt_fp8.py.)"""
    import shutil

    from safetensors.torch import load_file, save_file

    quantized = shutil.copytree(tiny_gated, tmp_path / "modelopt")
    dequantized = shutil.copytree(tiny_gated, tmp_path / "dequantized")
    for shard in sorted((quantized / "transformer").glob("*.safetensors")):
        tensors, plain = load_file(str(shard)), {}
        for name in [n for n in tensors if n.startswith("layers.") and n.endswith("proj.weight")]:
            w = tensors[name].float()
            scale = w.abs().max() / 448
            tensors[name] = (w / scale).to(torch.float8_e4m3fn)
            base = name[: -len(".weight")]
            tensors[base + ".weight_quantizer._scale"] = scale.reshape(())
            tensors[base + ".weight_quantizer._amax"] = w.abs().max().reshape(())
            plain[name] = tensors[name].to(torch.bfloat16) * scale.to(torch.bfloat16)
        save_file(tensors, str(shard))
        original = load_file(str(dequantized / "transformer" / shard.name))
        save_file({**original, **plain}, str(dequantized / "transformer" / shard.name))
    ours = cosmos3_runtime.load(quantized, dtype="bf16", device="cpu")
    assert any(isinstance(m, ModelOptFp8Linear) for m in ours.transformer.modules())
    reference = cosmos3_runtime.load(dequantized, dtype="bf16", device="cpu")
    request = {**REQUEST, "steps": 2}
    assert torch.equal(ours.generate("a cat", **request).latents, reference.generate("a cat", **request).latents)


@needs_cpu_scaled_fp8
def test_the_scaled_fp8_matmul_path(tiny_factory):
    """fp8_scaled (per-token activation scales, one fp8 matmul in the media blocks but the first and last) run on the
    CPU's implementation: close to the upcast path it replaces."""
    root = tiny_factory(kind="edge", size="small")
    upcast = cosmos3_runtime.load(root, dtype="bf16", device="cpu", quantize="fp8")
    fast = cosmos3_runtime.load(root, dtype="bf16", device="cpu", quantize="fp8_scaled")
    scaled = sorted(name for name, m in fast.transformer.named_modules() if isinstance(m, Fp8Linear) and m.scaled)
    last = fast.transformer.config.num_hidden_layers - 1
    assert scaled and all(name.startswith("layers.") for name in scaled)
    assert not any(name.startswith(("layers.0.", f"layers.{last}.")) for name in scaled)
    assert {name.split(".", 2)[2] for name in scaled} == {  # the media pathway only (Edge: no gate projection)
        "self_attn.add_q_proj", "self_attn.add_k_proj", "self_attn.add_v_proj", "self_attn.to_add_out",
        "mlp_moe_gen.up_proj", "mlp_moe_gen.down_proj"}
    latents = torch.randn(1, 48, 2, 4, 6, generator=torch.Generator().manual_seed(0))
    v = [p.transformer(latents, torch.tensor(900), p.transformer.encode_text(torch.arange(40) % 500)).vision.float()
         for p in (upcast, fast)]
    relative = (v[1] - v[0]).abs() / v[0].abs().max()
    assert 0 < relative.mean() < 0.02 and relative.max() < 0.1, (relative.mean(), relative.max())


@needs_cpu_scaled_fp8
def test_linears_reading_one_input_quantize_it_once(tiny_factory, monkeypatch):
    """fp8_scaled: q, k and v (and an MLP's gate and up) read one tensor, quantized once; the result is bit-equal
    to quantizing it for each linear."""
    from cosmos3_runtime.weights import fp8

    root = tiny_factory(kind="gated", size="small")
    pipe = cosmos3_runtime.load(root, dtype="bf16", device="cpu", quantize="fp8_scaled")
    calls = []
    real = fp8.quantize_rows
    monkeypatch.setattr(fp8.shared_quantized, "quantize", lambda rows: calls.append(rows.shape) or real(rows))
    latents = torch.randn(1, 48, 2, 4, 6, generator=torch.Generator().manual_seed(0))
    text = pipe.transformer.encode_text(torch.arange(40) % 500)
    shared = pipe.transformer(latents, torch.tensor(900), text).vision
    scaled_layers = pipe.transformer.config.num_hidden_layers - 2
    assert len(calls) == 4 * scaled_layers  # q/k/v, out, gate/up, down: not 7 a layer
    monkeypatch.setattr(fp8.SharedQuantized, "__call__", lambda self, x: real(x.reshape(-1, x.shape[-1])))
    assert torch.equal(pipe.transformer(latents, torch.tensor(900), text).vision, shared)


def test_fp8_scaled_runs_weight_only_where_row_wise_fp8_matmuls_are_refused(tiny_factory, monkeypatch, caplog):
    """cuBLAS refuses row-wise scaled fp8 matmuls on some cards with fp8 GEMMs (compute capability 12.x: RTX 50xx,
    CUBLAS_STATUS_NOT_SUPPORTED at the first matmul). The device's probe (one tiny call, here against a
    `torch._scaled_mm` that refuses as cuBLAS does there) finds it at load: fp8_scaled runs weight-only fp8, with a
    note, equal to quantize='fp8'."""
    from cosmos3_runtime import devices

    real = torch._scaled_mm

    def like_cublas_on_12x(a, b, scale_a, scale_b, **kwargs):
        if scale_a.numel() > 1:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul")
        return real(a, b, scale_a=scale_a, scale_b=scale_b, **kwargs)

    monkeypatch.setattr(torch, "_scaled_mm", like_cublas_on_12x)
    monkeypatch.delitem(devices._FACTS, ("cpu", None), raising=False)  # probed again at the load
    root = tiny_factory(kind="edge", size="small")
    with caplog.at_level("WARNING"):
        pipe = cosmos3_runtime.load(root, dtype="bf16", device="cpu", quantize="fp8_scaled")
    assert pipe.weights.name == "fp8" and "needs row-wise scaled fp8 matmuls" in caplog.text
    assert not any(isinstance(m, Fp8Linear) and m.scaled for m in pipe.transformer.modules())
    weight_only = cosmos3_runtime.load(root, dtype="bf16", device="cpu", quantize="fp8")
    latents = torch.randn(1, 48, 2, 4, 6, generator=torch.Generator().manual_seed(0))
    text = torch.arange(40) % 500
    outputs = [p.transformer(latents, torch.tensor(900), p.transformer.encode_text(text)).vision
               for p in (pipe, weight_only)]
    assert torch.equal(*outputs)


@needs_cpu_scaled_fp8
@pytest.mark.parametrize("triton", [True, False])
def test_the_fused_quantization_needs_triton(tiny_factory, monkeypatch, triton):
    """On a GPU fp8_scaled quantizes each activation in one compiled kernel, which needs Triton (often missing on
    Windows): without it the same quantization runs eagerly."""
    from cosmos3_runtime import devices
    from cosmos3_runtime.weights import fp8

    pipe = cosmos3_runtime.load(tiny_factory(kind="gated", size="small"), dtype="bf16", device="cpu",
                                quantize="fp8_scaled")
    monkeypatch.setitem(devices._FACTS, ("cpu", None), devices.DeviceFacts("cuda", (9, 0), fp8_rowwise=True,
                                                                           triton=triton))
    fused = []
    monkeypatch.setattr(fp8, "fused_quantize_rows", lambda: lambda rows: fused.append(1) or fp8.quantize_rows(rows))
    latents = torch.randn(1, 48, 2, 4, 6, generator=torch.Generator().manual_seed(0))
    out = pipe.transformer(latents, torch.tensor(900), pipe.transformer.encode_text(torch.arange(40) % 500)).vision
    assert torch.isfinite(out).all() and bool(fused) is triton


class RecordedCuda:
    """torch.cuda's streams and events as a log, so that the block swap's GPU path runs with the CPU as its device."""

    def __init__(self):
        self.log, self.current = [], "compute"
        recorded = self

        class Stream:
            def __init__(self, device):
                self.device, self.name = device, "side"

            def wait_event(self, event):
                recorded.log.append((self.name, "wait", event.name))

        class Event:
            count = 0

            def __init__(self):
                Event.count += 1
                self.name = f"e{Event.count}"

            def record(self, stream):
                recorded.log.append((stream.name, "record", self.name))

        self.Stream, self.Event = Stream, Event
        self.compute = Stream(None)
        self.compute.name = "compute"

    def current_stream(self, device=None):
        return self.compute if self.current == "compute" else self.side

    def stream(self, stream):
        from contextlib import contextmanager

        @contextmanager
        def using():
            self.side, self.current = stream, stream.name
            yield
            self.current = "compute"

        return using()


def test_block_swap_fills_two_device_buffers_in_turn_after_their_last_reader(tiny_factory, monkeypatch):
    """The GPU path with streams and events recorded: two buffers for any number of swapped layers; a copy into a
    buffer waits for the event recorded after the layer that read it last; a layer waits for its copy."""
    from cosmos3_runtime import offload

    root = tiny_factory(kind="edge", overrides={"num_hidden_layers": 4})
    pipe = cosmos3_runtime.load(root, dtype="fp32", device="cpu", blocks_to_swap=4)
    swap = pipe.block_swap
    cuda = RecordedCuda()
    monkeypatch.setattr(offload.torch, "cuda", cuda)
    monkeypatch.setattr(offload.BlockSwap, "STREAMED", ("cpu",))
    homes = {home.untyped_storage()._cdata for _, home in [pair for pairs in swap.home.values() for pair in pairs]}
    copies = []
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src, non_blocking=False: copies.append(
        (cuda.current, src.untyped_storage()._cdata in homes, non_blocking)) or self)
    storages, waits = {}, []
    for forward in range(2):
        for i in range(4):
            swap.before(i)
            storages.setdefault(i, {p.data.untyped_storage()._cdata for p, _ in swap.home[i]})
            waits.append(list(cuda.log))
            assert not storages[i] & homes  # the layer runs on a device buffer
            swap.after(i)
            assert all(p.data_ptr() == home.data_ptr() for p, home in swap.home[i])
    assert storages[0] == storages[2] and storages[1] == storages[3] and not storages[0] & storages[1]
    assert len(copies) == 8 * len(swap.home[0]) and all(c == ("side", True, True) for c in copies)  # home -> buffer,
    # asynchronous, on the side stream
    log = cuda.log
    copied = [e for s, what, e in log if s == "side" and what == "record"]
    released = [e for s, what, e in log if s == "compute" and what == "record"]
    assert len(copied) == 8 and len(released) == 8  # a copy and a release per layer per forward
    for k in range(2, 8):  # the copy of the k-th swapped run waits for the release after run k - 2
        at = log.index(("side", "record", copied[k]))
        assert ("side", "wait", released[k - 2]) in log[:at]
        assert log.index(("side", "wait", released[k - 2])) > log.index(("compute", "record", released[k - 2]))
    for k in range(8):  # each layer waits for its own copy before running
        assert ("compute", "wait", copied[k]) in waits[k]
    assert swap.most_resident == 2 and pipe.block_swap.buffers[0] is not None


def _next_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_slabs_keep_pinned_memory_near_the_parameter_bytes():
    """The caching host allocator rounds each pinned block up to a power of two: pinned parameter by parameter, Nano's
    text tower (bf16, shapes from the meta device) took 30% more than its bytes; in slabs, within 0.1%."""
    from cosmos3_runtime import offload
    from cosmos3_runtime.tiny import RELEASED
    from cosmos3_runtime.transformer import Cosmos3Transformer, TransformerConfig

    with torch.device("meta"):
        model = Cosmos3Transformer(TransformerConfig(**RELEASED["nano"]))
    sizes = [p.numel() * 2 for name, p in model.named_parameters() if tower_of(name) == "text tower"]
    plan = offload._slab_plan(sizes)
    assert sorted(i for slab in plan for i in slab) == list(range(len(sizes)))
    slabs = [sum(sizes[i] for i in slab) for slab in plan]
    assert sum(map(_next_power_of_two, sizes)) > 1.25 * sum(sizes)  # 19.19 GB for 14.77 GB
    assert sum(map(_next_power_of_two, slabs)) < 1.001 * sum(sizes) and len(slabs) <= 16


@pytest.mark.parametrize("slab_bytes", [1 << 30, 1 << 18], ids=["default slabs", "256 KiB slabs"])
def test_pinned_homes_are_views_into_a_few_slabs(tiny_factory, monkeypatch, slab_bytes):
    """BlockSwap(pin=True) and the text tower's first visit to a (stand-in) GPU pin through `_pinned_slab`, recorded
    here: a few blocks holding the parameters' bytes within 5%, each home a view into one, with its values, none
    overlapping another, and a forward bit-identical to the one before."""
    from cosmos3_runtime import offload

    model = cosmos3_runtime.load(tiny_factory(kind="edge", overrides={"num_hidden_layers": 4}), dtype="fp32",
                                 device="cpu").transformer
    latents = torch.randn(1, 48, 2, 4, 6, generator=torch.Generator().manual_seed(0))
    ids = torch.arange(40) % 500
    reference = model(latents, torch.tensor(900), model.encode_text(ids)).vision
    values = {id(p): p.detach().clone() for p in model.parameters()}
    slabs = []
    monkeypatch.setattr(offload, "_pinned_slab", lambda nbytes: slabs.append(torch.empty(nbytes, dtype=torch.uint8))
                        or slabs[-1])
    monkeypatch.setattr(offload, "SLAB_BYTES", slab_bytes)
    monkeypatch.setattr(offload.TextOffload, "PINNED_FOR", ("cpu",))
    swap = offload.BlockSwap(model, 3, pin=True)
    model.hooks = replace(model.hooks, layer=swap)
    text = offload.TextOffload(model, torch.device("cpu"))
    swapped = len(slabs)
    for _ in range(2):  # pinned on the first visit only
        with text.on(torch.device("cpu")):
            kv = model.encode_text(ids)
    assert torch.equal(model(latents, torch.tensor(900), kv).vision, reference)

    homes = [pair for pairs in swap.home.values() for pair in pairs] + text.homes
    held = sum(p.nbytes for p, _ in homes)
    assert sum(s.nbytes for s in slabs) <= 1.05 * held
    if slab_bytes == 1 << 30:
        assert swapped == 1 and len(slabs) == 2  # one slab for the swapped layers, one for the text tower
    else:  # several, each a power of two but a small tail: what the caching host allocator reserves is within 5% too
        assert 2 < len(slabs) <= len(homes) / 6
        assert sum(_next_power_of_two(s.nbytes) for s in slabs) <= 1.05 * held
    starts = {s.data_ptr(): s.nbytes for s in slabs}
    spans = []
    for p, home in homes:
        assert p.data.data_ptr() == home.data_ptr() and torch.equal(home, values[id(p)])
        assert home.untyped_storage().data_ptr() in starts and home.data_ptr() % offload.ALIGN == 0
        start = home.untyped_storage().data_ptr()
        assert home.data_ptr() + home.nbytes <= start + starts[start]
        spans.append((home.data_ptr(), home.data_ptr() + home.nbytes))
    spans.sort()
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))


def test_a_tensor_subclass_is_pinned_alone(monkeypatch):
    """A view of a slab's bytes would lose a subclass (a host's quantized tensor type): such a parameter keeps its type,
    pinned on its own; the rest share a slab."""
    from cosmos3_runtime import offload

    class Tagged(torch.Tensor):
        pass

    params = [torch.nn.Parameter(torch.randn(3, 5), requires_grad=False),
              torch.nn.Parameter(torch.randn(7).as_subclass(Tagged), requires_grad=False),
              torch.nn.Parameter(torch.randint(0, 255, (9,), dtype=torch.uint8), requires_grad=False)]
    values = [p.detach().clone() for p in params]
    slabs, alone = [], []
    monkeypatch.setattr(offload, "_pinned_slab", lambda nbytes: slabs.append(torch.empty(nbytes, dtype=torch.uint8))
                        or slabs[-1])
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: alone.append(type(self)) or self.clone())
    offload._pin_in_slabs(params)
    assert alone == [Tagged] and type(params[1].data) is Tagged and len(slabs) == 1
    assert [p.untyped_storage().data_ptr() == slabs[0].data_ptr() for p in params] == [True, False, True]
    assert all(torch.equal(p.data.as_subclass(torch.Tensor), value.as_subclass(torch.Tensor))
               for p, value in zip(params, values))
