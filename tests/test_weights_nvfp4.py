"""NVFP4 weights (`weights.nvfp4`): tiny checkpoints written by nvidia-modelopt itself (its NVFP4 config, calibrated on
diffusers' forward, its real unified export, on the CPU; `modelopt_files.make_nvfp4`), kept packed and run W4A16,
against diffusers 0.42.1's NVFP4 dequantization of the same files (`quantizers/bfl`, the layout it reads for BFL
checkpoints, set up by its own quantizer's steps); refusals from the headers; the memory plan; the FP4 matmul path,
which no GPU here runs, traced on the meta device and its arithmetic checked against an emulated kernel."""

import json
import shutil
import weakref

import pytest
import torch
import torch.nn.functional as F
from conftest import require

import cosmos3_runtime
from cosmos3_runtime import budget, devices
from cosmos3_runtime.devices import DeviceFacts
from cosmos3_runtime.errors import CheckpointError, InputError
from cosmos3_runtime.pipeline import planner
from cosmos3_runtime.transformer import Cosmos3Transformer
from cosmos3_runtime.weights import nvfp4, precision
from cosmos3_runtime.weights.format import planned_bytes
from cosmos3_runtime.weights.nvfp4 import NVFP4Linear

require("diffusers", minversion="0.42.1")
import diffusers_reference as ref  # noqa: E402
from modelopt_files import calibration_inputs, make_nvfp4, shard_tensors, write_shards  # noqa: E402

TOL = 1e-4  # end to end in fp32, as the pipeline parity (tests/test_pipeline_parity.py)
B200 = DeviceFacts("cuda", (10, 0), triton=True, fp4=True)


@pytest.fixture(scope="module", params=["gated", "edge"])
def nvfp4_checkpoint(request, tiny_factory, tmp_path_factory):
    """(the dense tiny checkpoint, its copy with the transformer in ModelOpt's NVFP4 export)."""
    root = tiny_factory(kind=request.param)
    return root, make_nvfp4(root, tmp_path_factory.mktemp("nvfp4") / request.param)[0]


@pytest.fixture(scope="module")
def ours(nvfp4_checkpoint):
    return cosmos3_runtime.load(nvfp4_checkpoint[1], dtype="fp32")


def bfl_transformer(root, path):
    """diffusers' transformer with the files' NVFP4 linears as its BFL quantizer builds them (`BFLNVFP4Linear`, which
    dequantizes into the compute dtype on a CPU): the state dict bundled (`maybe_update_state_dict`), the linears
    replaced, the packed tensors set (`create_quantized_param`), every other tensor of the files loaded as it is."""
    from diffusers.quantizers.bfl.bfl_quantizer import BFLQuantizer
    from diffusers.quantizers.quantization_config import BFLQuantizationConfig

    quantizer = BFLQuantizer(BFLQuantizationConfig(torch.float32))
    model = ref.load_transformer(root)
    state = quantizer.maybe_update_state_dict(shard_tensors(path))
    quantizer._process_model_before_weight_loading(model, None, keep_in_fp32_modules=list(
        model._keep_in_fp32_modules or []), state_dict=state)
    dense = {}
    for name, value in state.items():
        if quantizer.check_if_quantized_param(model, value, name, state):
            quantizer.create_quantized_param(model, value, name, torch.device("cpu"), state)
        else:
            dense[name] = value
    _, unexpected = model.load_state_dict(dense, strict=False, assign=True)
    assert not unexpected and not any(t.is_meta for t in (*model.parameters(), *model.buffers()))
    return model.eval()


def test_the_export_is_read_packed_in_both_towers(nvfp4_checkpoint, ours):
    """ModelOpt's NVFP4 export quantizes every linear of both towers and the patch projection (its ignore list: the
    embeddings, heads and time embedder): each is an NVFP4 layer holding the files' packed bytes and scales."""
    _, path = nvfp4_checkpoint
    config = json.loads((path / "transformer" / "config.json").read_text())["quantization_config"]
    assert config["quant_algo"] == "NVFP4" and "time_embedder*" in config["ignore"]
    assert "ModelOpt NVFP4 (W4A4 throughout (no step policy); W4A4 needs FP4 matmuls" in ours.variant.describe()
    layers = {name: m for name, m in ours.transformer.named_modules() if isinstance(m, NVFP4Linear)}
    assert {m.pathway for m in layers.values()} == {"media", "text", None} and "proj_in" in layers
    files = shard_tensors(path)
    for name, m in layers.items():
        assert torch.equal(m.weight, files[f"{name}.weight"]) and m.weight.dtype == torch.uint8
        assert torch.equal(m.weight_scale.view(torch.uint8), files[f"{name}.weight_scale"].view(torch.uint8))
        assert m.weight_scale_2.dtype == m.input_scale.dtype == torch.float32


def test_each_layer_expands_as_diffusers_dequantizes(nvfp4_checkpoint, ours):
    """Bit for bit, in float32 and rounded once into bf16 (diffusers' `dequantize_nvfp4(...).to(compute_dtype)`)."""
    from diffusers.quantizers.bfl.utils import dequantize_nvfp4

    theirs = bfl_transformer(*nvfp4_checkpoint)
    for name, m in ours.transformer.named_modules():
        if isinstance(m, NVFP4Linear):
            layer = theirs.get_submodule(name)
            expected = dequantize_nvfp4(layer.weight, layer.weight_scale, layer.weight_scale_2)
            assert torch.equal(m.dequantized(torch.float32, torch.device("cpu")), expected)
            assert torch.equal(m.dequantized(torch.bfloat16, torch.device("cpu")), expected.bfloat16())


def test_a_forward_equals_diffusers(nvfp4_checkpoint, ours):
    theirs = bfl_transformer(*nvfp4_checkpoint)
    ids, latents = calibration_inputs(seed=3)[0]
    with torch.no_grad():
        expected = ref.velocity(theirs, ids, latents, 600, [1], 24.0)[0]
        model = ours.transformer
        got = model(latents, torch.tensor(600), model.encode_text(torch.tensor(ids)), [1], 24.0).vision
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=0)  # measured 1.5e-6 (gated)


def test_a_generation_equals_diffusers_end_to_end(nvfp4_checkpoint, ours):
    """diffusers' task pipeline with its BFL NVFP4 transformer against the pack on the same files: same latents within
    fp32 rounding (4 steps with guidance, 9 frames)."""
    root, path = nvfp4_checkpoint
    pipe = ref.omni_pipeline(root)
    pipe.transformer = bfl_transformer(root, path)
    common = dict(prompt="A robot arm stacks two cubes.", negative_prompt="blurry, static", num_frames=9, fps=16.0,
                  height=48, width=64)
    with torch.no_grad():
        expected = pipe(**common, num_inference_steps=4, guidance_scale=4.0,
                        generator=torch.Generator("cpu").manual_seed(5), output_type="latent").video
    got = ours.generate(**common, steps=4, guidance_scale=4.0, seed=5, schedule="checkpoint", guidance_interval=None,
                        json_captions=False, output="latents", cache="off").latents
    assert expected.abs().max() > 0.5
    torch.testing.assert_close(got, expected.float(), atol=TOL, rtol=0)


def test_one_layer_is_expanded_at_a_time(ours, monkeypatch):
    """The weights stay packed: a forward expands a layer's weight, uses it and lets it go before the next one is
    expanded (never a whole dequantized copy of the model)."""
    alive, widest = [], []
    real = nvfp4.dequantize

    def watched(*args):
        held = [ref_() for ref_ in alive if ref_() is not None]
        widest.append(len(held))
        out = real(*args)
        alive.append(weakref.ref(out))
        return out

    monkeypatch.setattr(nvfp4, "dequantize", watched)
    ids, latents = calibration_inputs(seed=3)[0]
    model = ours.transformer
    with torch.no_grad():
        model(latents, torch.tensor(600), model.encode_text(torch.tensor(ids)), [1], 24.0)
    assert len(widest) > 10 and max(widest) == 0
    assert all(m.weight.dtype == torch.uint8 for m in model.modules() if isinstance(m, NVFP4Linear))


def test_the_memory_plan_counts_four_and_a_half_bits_a_weight(ours):
    """A packed weight with its e4m3 block scales is 4.5 bits a value, two float32 scales a layer besides; the memory
    plan (`planned_bytes`, what `bench_memory.py --released-sizes` and `info` count) holds what the loaded layers
    hold, and the steps' plan the one layer expanded at a time."""
    layers = {n: m for n, m in ours.transformer.named_modules() if isinstance(m, NVFP4Linear)}
    with torch.device("meta"):
        dense = Cosmos3Transformer(ours.transformer.config)
    plan = planned_bytes(dense, ours.weights, torch.float32)
    for name, m in layers.items():
        held = sum(t.numel() * t.element_size() for t in (m.weight, m.weight_scale, m.weight_scale_2, m.input_scale))
        assert held == m.out_features * m.in_features * 4.5 / 8 + 2 * 4 == plan[f"{name}.weight"]
    released = torch.nn.Linear(4096, 12288, device="meta")  # Nano's MLP
    assert ours.weights.resident_bytes("layers.0.mlp.up_proj", released) * 8 / released.weight.numel() == \
        pytest.approx(4.5, abs=1e-5)
    estimate = ours.plan("a cat", num_frames=5, width=64, height=64).estimate
    assert "NVFP4 weights at work" in estimate.phases[budget.STEPS] and estimate.parts["NVFP4 weights at work"] > 0


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("layers.0.self_attn.to_k.weight_scale_2"),  # the text tower
     "layers.0.self_attn.to_k.weight is packed NVFP4 but layers.0.self_attn.to_k.weight_scale_2 is missing"),
    (lambda t: t.update({"layers.1.mlp_moe_gen.down_proj.weight_scale":  # the media tower
                         t["layers.1.mlp_moe_gen.down_proj.weight_scale"][:, :4].contiguous()}),
     r"layers.1.mlp_moe_gen.down_proj.weight_scale has shape \[64, 4\]; NVFP4 needs \[64, 8\] \(one per 16 values\)"),
    (lambda t: t.update({"proj_in.weight_scale": t["proj_in.weight_scale"].float()}),
     "proj_in.weight_scale is stored as F32, not F8_E4M3"),
    (lambda t: t.update({"layers.0.self_attn.add_q_proj.pre_quant_scale": torch.ones(64)}),
     "layers.0.self_attn.add_q_proj.pre_quant_scale: a quantization tensor this pack does not read"),
    (lambda t: t.update({"proj_out.weight_scale_2": torch.ones(())}),
     "proj_out.weight_scale_2: an NVFP4 scale beside a weight that is not packed"),
])
def test_malformed_files_are_refused_by_name_before_any_weight_is_read(nvfp4_checkpoint, tmp_path, monkeypatch,
                                                                       change, message):
    from cosmos3_runtime.weights import files

    path = shutil.copytree(nvfp4_checkpoint[1], tmp_path / "broken")
    tensors = shard_tensors(path)
    change(tensors)
    write_shards(path, [tensors])
    monkeypatch.setattr(files, "_tensors", lambda *a: pytest.fail("a weight was read before the refusal"))
    with pytest.raises(CheckpointError, match=message):
        cosmos3_runtime.load(path, dtype="fp32")


def test_the_reasoners_head_is_checked_as_the_towers_are(nvfp4_checkpoint, tmp_path):
    """The last layer's text tail (read by the Reasoner only) was quantized too: a missing global scale there is
    refused by name when the Reasoner's parts are read, before it answers; generation never reads it."""
    path = shutil.copytree(nvfp4_checkpoint[1], tmp_path / "head")
    tensors = shard_tensors(path)
    del tensors["layers.1.mlp.down_proj.weight_scale_2"]
    write_shards(path, [tensors])
    pipe = cosmos3_runtime.load(path, dtype="fp32")
    pipe.generate("a cat", num_frames=5, width=64, height=64, steps=1, output="latents", cache="off")
    with pytest.raises(CheckpointError, match="layers.1.mlp.down_proj.weight_scale_2 is missing"):
        pipe.reason("What is in the picture?", max_new_tokens=1, temperature=0)


def test_the_reasoner_expands_the_text_tower_once_per_answer(ours, monkeypatch):
    calls = []
    real = NVFP4Linear.dequantized
    monkeypatch.setattr(NVFP4Linear, "dequantized", lambda self, *a: calls.append(self) or real(self, *a))
    answer = ours.reason("Tell me a story.", max_new_tokens=4, temperature=0)
    text_layers = [m for m in ours.reasoner.language.tower.modules() if isinstance(m, NVFP4Linear)]
    assert answer.text is not None and text_layers and len(calls) == len(set(map(id, calls)))


def test_detection_from_the_headers_and_what_cannot_apply(nvfp4_checkpoint, ours, tmp_path):
    """Without a declaration (no quantization_config, no hf_quant_config.json) the packed weights say NVFP4, with the
    same result; quantize cannot apply to quantized files; a config that declares another format is refused."""
    path = shutil.copytree(nvfp4_checkpoint[1], tmp_path / "undeclared")
    config_file = path / "transformer" / "config.json"
    raw = json.loads(config_file.read_text())
    block = raw.pop("quantization_config")
    config_file.write_text(json.dumps(raw))
    (path / "hf_quant_config.json").unlink()
    undeclared = cosmos3_runtime.load(path, dtype="fp32")
    assert undeclared.weights.describe() == "ModelOpt NVFP4 (undeclared)"
    ids, latents = calibration_inputs(seed=3)[0]
    out = [p.transformer(latents, torch.tensor(600), p.transformer.encode_text(torch.tensor(ids)), [1], 24.0).vision
           for p in (undeclared, ours)]
    assert torch.equal(*out)
    with pytest.raises(InputError, match="quantize='fp8' cannot apply to .*already quantized \\(ModelOpt NVFP4\\)"):
        planner(nvfp4_checkpoint[1], quantize="fp8")
    config_file.write_text(json.dumps({**raw, "quantization_config": {**block, "quant_algo": "FP8",
                                                                      "config_groups": {}}}))
    with pytest.raises(CheckpointError, match="stored as NVFP4, the config declares FP8"):
        cosmos3_runtime.load(path)


# --- the FP4 matmul path (W4A4), which needs a GPU of compute capability 10.x or 12.x ---------------------------------

def test_activations_quantize_as_modelopt_quantizes_them():
    """Codes and block scales bit-equal to ModelOpt's `NVFP4QTensor.quantize` over a static global scale (the input
    scale): a zero block, values on the rounding midpoints (ties to even) and beyond the range included."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    global_scale = torch.tensor(2.0**-10)
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * global_scale * 100
    x[0, :16] = 0
    midpoints = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 6.0, -2.0]
    x[1, :16] = torch.tensor(midpoints) * global_scale  # block scale 1: each value on a midpoint, exactly
    x[2, :16] = x[2, :16] * 1e5  # beyond the calibrated range: the block scale clamps at 448, the values saturate
    packed, scales = nvfp4.quantize(x, global_scale)
    expected, expected_scales, _ = NVFP4QTensor.quantize(x, 16, weights_scaling_factor_2=global_scale)
    assert torch.equal(packed, expected._quantized_data)
    assert torch.equal(scales.view(torch.uint8), expected_scales.view(torch.uint8))


def test_block_scales_are_laid_out_in_cublas_tiles():
    """cuBLAS's block-scaling layout: tiles of 128 rows x 4 scales, padded; scale (r, c) at tile offset + (r % 32) x 16
    + (r // 32 % 4) x 4 + c % 4."""
    rows, columns = 200, 10
    codes = torch.randint(0, 256, (rows, columns), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    laid = nvfp4.swizzled(codes.view(torch.float8_e4m3fn)).view(torch.uint8)
    across = -(-columns // 4)
    assert laid.numel() == -(-rows // 128) * 128 * across * 4
    for r in range(rows):
        for c in range(columns):
            offset = (r // 128 * across + c // 4) * 512 + r % 32 * 16 + r // 32 % 4 * 4 + c % 4
            assert laid[offset] == codes[r, c]


def emulated_fp4_mm(a, b, scale_a, scale_b, out_dtype):
    """`torch._scaled_mm` over NVFP4 operands as a GPU computes it: the block scales read from cuBLAS's tiles, both
    operands expanded, summed in float32, rounded into `out_dtype`."""
    def unswizzled(scales, rows, blocks):
        across = -(-blocks // 4)
        r, c = torch.arange(rows)[:, None], torch.arange(blocks)[None, :]
        offsets = (r // 128 * across + c // 4) * 512 + r % 32 * 16 + r // 32 % 4 * 4 + c % 4
        return scales.view(torch.uint8)[offsets].view(torch.float8_e4m3fn)

    left, right = a.view(torch.uint8), b.t().view(torch.uint8)
    one = torch.tensor(1.0)
    expand = [nvfp4.dequantize(m, unswizzled(s, m.shape[0], m.shape[1] * 2 // 16), one, torch.float32)
              for m, s in ((left, scale_a), (right, scale_b))]
    return (expand[0] @ expand[1].t()).to(out_dtype)


@pytest.mark.skipif(devices.FP4 is None, reason="this torch has no float4_e2m1fn_x2 (2.8 and newer)")
def test_w4a4_on_an_emulated_kernel_is_the_quantized_arithmetic(ours, monkeypatch):
    """On a card answering like a B200 the native steps quantize the activations by their input scale and run one FP4
    matmul (here an emulated kernel): equal, within the bf16 output, to the product of the expanded quantized
    activations and the expanded weight; the steps with 16-bit activations still expand the weight."""
    layer = ours.transformer.get_submodule("layers.0.mlp_moe_gen.up_proj")
    x = torch.randn(40, layer.in_features, generator=torch.Generator().manual_seed(1))
    monkeypatch.setitem(devices._FACTS, ("cpu", None), B200)
    calls = []
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: calls.append(1) or emulated_fp4_mm(*a, **k))
    with precision.precision(True, True):
        native = layer(x)
    packed, scales = nvfp4.quantize(x, layer.input_scale)
    expected = F.linear(nvfp4.dequantize(packed, scales, layer.input_scale, torch.float32),
                        layer.dequantized(torch.float32, x.device), layer.bias)
    assert calls == [1]
    torch.testing.assert_close(native, expected, atol=2 * 2**-8 * expected.abs().max().item(), rtol=0)
    with precision.precision(False, False):  # 16-bit activations
        assert torch.equal(layer(x), F.linear(x, layer.dequantized(torch.float32, x.device), layer.bias))
    assert calls == [1]


@pytest.mark.skipif(devices.FP4 is None, reason="this torch has no float4_e2m1fn_x2 (2.8 and newer)")
def test_w4a4_runs_a_slice_of_rows_at_a_time(ours, monkeypatch):
    """W4A4 quantizes and multiplies a bounded slice of rows at a time: 40 rows in slices of 3 equal one matmul of
    all 40, bit for bit, and the plan counts a slice's working bytes where FP4 matmuls run."""
    layer = ours.transformer.get_submodule("layers.0.mlp_moe_gen.up_proj")
    x = torch.randn(40, layer.in_features, generator=torch.Generator().manual_seed(2))
    monkeypatch.setitem(devices._FACTS, ("cpu", None), B200)
    calls = []
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **k: calls.append(len(a[0])) or emulated_fp4_mm(*a, **k))
    with precision.precision(True, True):
        whole = layer(x)
        monkeypatch.setattr(nvfp4, "slice_values", lambda device: 3 * max(layer.in_features, layer.out_features))
        sliced = layer(x)
    assert calls == [40] + [3] * 13 + [1] and torch.equal(sliced, whole)
    at_work = ours.weights.step_bytes(ours.transformer.config, 10**6, torch.bfloat16, torch.device("cpu"))
    assert at_work["NVFP4 weights at work"] >= nvfp4.WORKING_BYTES * nvfp4.slice_values(torch.device("cpu"))


@pytest.mark.skipif(devices.FP4 is None, reason="this torch has no float4_e2m1fn_x2 (2.8 and newer)")
def test_the_fp4_path_traces_whole(ours, monkeypatch):
    """The layer as a compiled block runs it on such a card: traced whole (fullgraph, torch.compile's eager backend)
    on the meta device, where `torch._scaled_mm` has its shape rules, to a [tokens, out] bf16-shaped result."""
    layer = ours.transformer.get_submodule("layers.1.self_attn.add_q_proj")
    monkeypatch.setitem(devices._FACTS, ("meta", None), B200)
    torch._dynamo.reset()
    traced = torch.compile(layer, fullgraph=True, backend="eager")
    with precision.precision(True, True):
        out = traced(torch.empty(3, 7, layer.in_features, device="meta"))
    assert out.shape == (3, 7, layer.out_features) and out.device.type == "meta"


def test_the_media_block_compiles_whole(ours):
    """W4A16 inside the compiled media block (what compile auto runs on a CUDA GPU): traced whole, equal to eager."""
    from dataclasses import replace

    from cosmos3_runtime.transformer import DecoderLayer

    torch._dynamo.reset()
    model = ours.transformer
    hooks = replace(model.hooks, block=torch.compile(DecoderLayer.media, fullgraph=True, backend="eager"))
    ids, latents = calibration_inputs(seed=3)[0]
    with torch.inference_mode():
        text = model.encode_text(torch.tensor(ids))
        compiled = model(latents, torch.tensor(600), text, [1], 24.0, hooks=hooks).vision
        assert torch.equal(compiled, model(latents, torch.tensor(600), text, [1], 24.0).vision)
