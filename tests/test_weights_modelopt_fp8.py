"""NVIDIA's official FP8 checkpoints (ModelOpt FP8, Hub revision "fp8"): files written by ModelOpt itself
(tests/modelopt_files.py), read tensor by tensor, run W8A8 / W8A16 as their step policy says, against diffusers'
mixed-precision runtime on the ModelOpt model that wrote them (fp32 activations on the CPU)."""

import copy
import itertools
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import require

import cosmos3_runtime
from cosmos3_runtime.action import ActionRequest
from cosmos3_runtime.errors import CheckpointError
from cosmos3_runtime.weights import modelopt, modelopt_fp8, precision
from cosmos3_runtime.weights.modelopt_fp8 import ModelOptFp8Linear

require("diffusers", minversion="0.42.1")
import diffusers_reference as ref  # noqa: E402
import modelopt_files  # noqa: E402
from modelopt_files import POLICY, make_fp8, mixed_precision, shard_tensors, write_shards  # noqa: E402

TOL = 2e-4  # fp32 activations: the same fp8 products, summed in another order (measured ≤ 3e-6 per linear)


@pytest.fixture(scope="module", params=["gated", "edge"])
def fp8(request, tiny_factory, tmp_path_factory):
    root = tiny_factory(kind=request.param)
    return make_fp8(root, tmp_path_factory.mktemp("fp8") / request.param)


def test_every_tensor_is_read_and_the_variant_says_fp8(fp8):
    path, written = fp8
    pipe = cosmos3_runtime.load(path, dtype="fp32")
    assert "ModelOpt FP8 (W8A16 on the first 3 and last 3 steps, W8A8 between; text tower W8A16)" in \
        pipe.variant.describe()
    ours = {name: m for name, m in pipe.transformer.named_modules() if isinstance(m, ModelOptFp8Linear)}
    stored = {name for name, m in written.named_modules() if getattr(m, "weight", None) is not None
              and m.weight.dtype == torch.float8_e4m3fn}
    assert ours and set(ours) <= stored
    assert stored - set(ours) <= {n for n in stored if n.endswith(("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                                                                   "to_q", "to_out"))}  # the last layer's text tail
    for name, linear in ours.items():  # both ranges read: the weight's scale and the calibrated input range
        source = written.get_submodule(name)
        assert torch.equal(linear.input_scale, source.input_quantizer._amax.float() / 448)
        assert torch.equal(linear.scale, source.weight_quantizer._scale.float())
        assert linear.pathway == ("media" if any(k in name for k in ("_moe_gen", ".add_", "to_add_out")) else
                                  None if not name.startswith("layers.") else "text")


def _velocity_pair(fp8, monkeypatch, step, steps):
    path, written = fp8
    monkeypatch.setattr(mixed_precision, "_classify_cosmos3_linear", modelopt_files.policy_labels)
    monkeypatch.setattr(mixed_precision, "_w8a16_linear", modelopt_files.w8a16_on_the_cpu)
    config = mixed_precision.Cosmos3MixedPrecisionConfig.resolve(
        written, quantization_config=json.loads((path / "transformer" / "config.json").read_text())[
            "quantization_config"])
    name = mixed_precision.apply_cosmos3_mixed_precision_step(written, config, step, steps)
    ids, latents = modelopt_files.calibration_inputs(seed=3)[0]
    try:
        theirs = ref.velocity(written, ids, latents, 600, [1], 24.0)[0]
    finally:
        mixed_precision.reset_cosmos3_mixed_precision(written, config)
    pipe = cosmos3_runtime.load(path, dtype="fp32")
    assert pipe.variant.quantization.precision_name(step, steps) == name
    with precision.for_step(pipe.variant.precision, step, steps):
        model = pipe.transformer
        ours = model(latents, torch.tensor(600), model.encode_text(torch.tensor(ids)), [1], 24.0).vision
    return ours, theirs


@pytest.mark.parametrize("step", [0, 4])  # of 8: W8A16 (first steps), W8A8 (between)
def test_a_forward_equals_diffusers_mixed_precision_at_the_step(fp8, monkeypatch, step):
    ours, theirs = _velocity_pair(fp8, monkeypatch, step, 8)
    assert theirs.abs().max() > 0.1
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=0)


def test_a_quantized_time_embedder_is_read_and_runs_as_diffusers_does(tiny_factory, tmp_path, monkeypatch):
    """A file whose exporter quantized the fp32 time embedder too (fp8 weights, input ranges): it loads, its linears
    run as the checkpoint's (native W8A8), and a forward equals diffusers' runtime. It used to crash in F.linear
    (an fp32 input against fp8 weights)."""
    fp8 = make_fp8(tiny_factory(kind="edge"), tmp_path / "edge", time_embedder=True)
    written = fp8[1]
    assert written.time_embedder.linear_1.weight.dtype == torch.float8_e4m3fn
    # diffusers casts the embedder's input to its first parameter's dtype, here float8: give it an fp32 one first
    written.time_embedder.register_parameter("fp32_first", torch.nn.Parameter(torch.zeros(0)))
    pipe = cosmos3_runtime.load(fp8[0], dtype="fp32")
    assert isinstance(pipe.transformer.time_embedder.linear_1, ModelOptFp8Linear)
    ours, theirs = _velocity_pair(fp8, monkeypatch, 4, 8)
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=0)


def test_scales_and_input_ranges_stay_fp32_in_an_fp16_model(fp8, tmp_path):
    """In fp16 an activation range above 65504 would become inf (and its layer's output zeros, or NaN), and a small
    scale would round: ModelOpt's ranges become scales in float32, and scales keep float32 whatever the model's
    dtype."""
    from safetensors.torch import load_file, save_file

    path = shutil.copytree(fp8[0], tmp_path / "wide")
    shard = sorted((path / "transformer").glob("*.safetensors"))[0]
    tensors = load_file(str(shard))
    key = next(k for k in tensors if k.endswith("add_q_proj.input_quantizer._amax"))
    tensors[key] = torch.tensor(1e5)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    pipe = cosmos3_runtime.load(path, dtype="fp16")
    layers = [m for m in pipe.transformer.modules() if isinstance(m, ModelOptFp8Linear)]
    assert all(m.scale.dtype == m.input_scale.dtype == torch.float32 for m in layers)
    wide = pipe.transformer.get_submodule(key.removesuffix(".input_quantizer._amax"))
    assert wide.input_scale.item() == (torch.tensor(1e5) / 448).item()
    x = torch.randn(6, wide.in_features, dtype=torch.float16) * 100
    out = wide(x)
    assert torch.isfinite(out).all() and out.abs().max() > 0


def test_linears_with_one_input_and_equal_ranges_quantize_it_once(fp8, monkeypatch):
    """At a W8A8 step q, k and v (and an MLP's gate and up) read one activation and, calibrated on the same inputs,
    hold equal input ranges: it is quantized once for them (4 quantizations a gated media layer, not 7); the result
    is bit-equal to quantizing it for each linear."""
    from cosmos3_runtime.weights.fp8 import static_quantized

    path, _ = fp8
    pipe = cosmos3_runtime.load(path, dtype="fp32")
    calls = []
    real = static_quantized.quantize
    monkeypatch.setattr(static_quantized, "quantize", lambda rows, scale: calls.append(1) or real(rows, scale))
    ids, latents = modelopt_files.calibration_inputs(seed=3)[0]
    model = pipe.transformer
    with precision.precision(True, False):  # media W8A8, text W8A16 (its K/V: no quantization counted)
        text = model.encode_text(torch.tensor(ids))
        shared = model(latents, torch.tensor(600), text, [1], 24.0).vision
        outside = sum(isinstance(m, ModelOptFp8Linear) and m.input_scale is not None and not name.startswith("layers.")
                      for name, m in model.named_modules())  # the calibrated patch projection
        assert len(calls) == 4 * model.config.num_hidden_layers + outside  # q/k/v, out, gate/up (Edge: up), down
        for m in model.modules():
            if isinstance(m, ModelOptFp8Linear):
                m.input_key = None  # nothing known to be equal: every linear quantizes for itself
        assert torch.equal(model(latents, torch.tensor(600), text, [1], 24.0).vision, shared)


def test_w8a8_without_fp8_matmuls_runs_bf16_products(monkeypatch):
    """Where a GPU has no fp8 matmul (A100, RTX 30xx; the CPU here answers like an A100) W8A8 runs the fp8 products as
    a bf16 matmul (fp8 values are exact in bf16), not a float32 one: within bf16 rounding of the float32 products.
    The CPU itself keeps the float32 products (its bf16 matmuls are the slower ones)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from cosmos3_runtime import devices

    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(96, 128, generator=g) * 0.05)
    weight_scale = weight.abs().max() / 448
    w8 = (weight / weight_scale).to(torch.float8_e4m3fn)
    x = torch.randn(40, 128, generator=g).bfloat16()
    input_scale = x.float().abs().max() / 448
    exact = modelopt_fp8.w8a8_linear(x.float(), w8, weight_scale, input_scale, None)  # the float32 products

    class Matmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.dtypes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                self.dtypes.append(args[-1].dtype)
            return func(*args, **(kwargs or {}))

    with Matmuls() as cpu:
        on_cpu = modelopt_fp8.w8a8_linear(x, w8, weight_scale, input_scale, None)
    monkeypatch.setitem(devices._FACTS, ("cpu", None), devices.DeviceFacts("cuda", (8, 0)))
    with Matmuls() as gpu:
        bf16 = modelopt_fp8.w8a8_linear(x, w8, weight_scale, input_scale, None)
    assert cpu.dtypes == [torch.float32] and gpu.dtypes == [torch.bfloat16] and bf16.dtype == torch.bfloat16
    torch.testing.assert_close(on_cpu, exact.bfloat16(), atol=0, rtol=0)
    assert ((bf16.float() - exact).abs() / exact.abs().max()).max() < 2**-7


def test_the_two_precisions_differ(fp8, monkeypatch):
    """The step matters: W8A8 and W8A16 give different velocities (so the parity above can fail)."""
    a16, _ = _velocity_pair(fp8, monkeypatch, 0, 8)
    a8, _ = _velocity_pair(fp8, monkeypatch, 4, 8)
    assert (a16 - a8).abs().max() > 10 * TOL


@pytest.mark.parametrize("steps", [1, 2, 5, 6, 7, 35])
@pytest.mark.parametrize("first, last, overlap", [(3, 3, "a16"), (0, 2, "a16"), (4, 4, "native")])
def test_step_names_equal_diffusers(steps, first, last, overlap):
    theirs = mixed_precision.Cosmos3MixedPrecisionConfig(format="fp8", first_steps=first, last_steps=last,
                                                          overlap=overlap)
    ours = modelopt.Quantization("FP8", precision.Policy(first, last, overlap == "a16"))
    assert [ours.precision_name(i, steps) for i in range(steps)] == \
        [theirs.precision_name(i, steps) for i in range(steps)]


def record_precision(pipe, monkeypatch) -> list[tuple[bool, bool]]:
    """The list each transformer forward of `pipe` appends its (media, text) W8A8 flags to."""
    seen = []
    original = type(pipe.transformer).forward

    def forward(model, *args, **kwargs):
        seen.append((precision.runs_native("media"), precision.runs_native("text")))
        return original(model, *args, **kwargs)

    monkeypatch.setattr(type(pipe.transformer), "forward", forward)
    return seen


def test_a_run_steps_through_the_policy(fp8, monkeypatch):
    """The sampler sets each step's precision (media pathway) and keeps the text tower at W8A16."""
    path, _ = fp8
    pipe = cosmos3_runtime.load(path, dtype="fp32")
    seen = record_precision(pipe, monkeypatch)
    pipe.generate("a cat", steps=8, num_frames=5, width=64, height=64, guidance_scale=1.0, output="latents",
                  cache="off")
    assert seen == [(False, False)] * 3 + [(True, False)] * 2 + [(False, False)] * 3
    seen.clear()
    result = pipe.generate("a cat", steps=4, num_frames=5, width=64, height=64, guidance_scale=1.0,
                           output="latents", cache="off", fp8_policy="off")
    assert seen == [(True, True)] * 4 and not any("fp8" in note for note in result.settings.notes)
    seen.clear()
    pipe.generate("a cat", steps=4, num_frames=5, width=64, height=64, guidance_scale=1.0, output="latents",
                  cache="off", fp8_first_steps=1, fp8_last_steps=0)
    assert seen == [(False, False)] + [(True, False)] * 3


def test_without_a_policy_it_runs_w8a8_throughout(tiny_factory, tmp_path):
    """The distilled FP8 checkpoints declare no policy: W8A8 everywhere, text tower included; 'on' forces 3 / 3."""
    path, _ = make_fp8(tiny_factory(kind="gated", distilled=True), tmp_path / "distilled", policy=None)
    pipe = cosmos3_runtime.load(path, dtype="fp32")
    assert "ModelOpt FP8 (W8A8 throughout (no step policy))" in pipe.variant.describe()
    s = pipe.plan("a cat", num_frames=5, width=64, height=64).settings
    assert s.precision is None
    forced = pipe.plan("a cat", num_frames=5, width=64, height=64, fp8_policy="on").settings.precision
    assert forced == precision.Policy(3, 3, True, True)
    counts = pipe.plan("a cat", num_frames=5, width=64, height=64, fp8_first_steps=1).settings
    assert counts.precision is None and "declares no step policy" in counts.notes[-1]


@pytest.mark.parametrize("field", modelopt.POLICY_FIELDS)
def test_a_policy_missing_a_field_is_refused_by_name(fp8, tmp_path, field):
    """Missing fields fail closed, here and in diffusers, before any weight is read."""
    path = shutil.copytree(fp8[0], tmp_path / "broken")
    config_file = path / "transformer" / "config.json"
    raw = json.loads(config_file.read_text())
    policy = {k: v for k, v in POLICY.items() if k != field}
    raw["quantization_config"]["runtime"]["diffusion_step_policy"] = policy
    config_file.write_text(json.dumps(raw))
    with pytest.raises(ValueError):
        mixed_precision.parse_diffusion_step_policy(policy)
    with pytest.raises(CheckpointError, match=f"diffusion_step_policy lacks {field}"):
        cosmos3_runtime.load(path)


@pytest.mark.parametrize("change, message", [
    ({"schema_version": 2}, "schema_version 2, not 1"),
    ({"type": "every_n"}, "type 'every_n', not 'first_last_n'"),
    ({"scope": ["transformer", "vae"]}, "scope"),
    ({"first_steps": {"count": -1, "mode": "a16"}}, "first_steps.count must be a non-negative integer"),
    ({"reasoner": "fp16"}, "reasoner 'fp16', not 'a16' or 'native'"),
])
def test_a_malformed_policy_is_refused_by_name(change, message):
    with pytest.raises((ValueError, TypeError)):
        mixed_precision.parse_diffusion_step_policy({**POLICY, **change})
    with pytest.raises(CheckpointError, match=message):
        modelopt.parse_policy({**POLICY, **change}, "transformer/config.json")


def test_other_quantization_methods_and_unknown_buffers_are_refused(fp8, tmp_path):
    path = shutil.copytree(fp8[0], tmp_path / "other")
    config_file = path / "transformer" / "config.json"
    raw = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**raw, "quantization_config": {"quant_method": "torchao", "quant_type": "int8"}}))
    with pytest.raises(CheckpointError, match="quant_method 'torchao'"):
        cosmos3_runtime.load(path)
    config_file.write_text(json.dumps(raw))
    from safetensors.torch import load_file, save_file

    shard = next((path / "transformer").glob("*.safetensors"))
    tensors = load_file(str(shard))
    tensors["layers.0.self_attn.to_q.input_quantizer._pre_quant_scale"] = torch.ones(64)
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError, match="to_q.input_quantizer._pre_quant_scale: a quantization tensor this pack"):
        cosmos3_runtime.load(path)


# --- the unified export's layout (NVIDIA's exporter) ------------------------------------------------------------------

RUN = dict(width=64, height=64, num_frames=5, steps=8, guidance_scale=3.0, seed=1, output="latents", cache="off")


@pytest.fixture(scope="module")
def layouts(tiny_factory, tmp_path_factory):
    """One calibrated transformer written in both layouts: {"saved": folder, "unified": folder}."""
    root = tiny_factory(kind="gated")
    model = modelopt_files.quantized(root)
    twin = copy.deepcopy(model)
    base = tmp_path_factory.mktemp("layouts")
    return {"saved": make_fp8(root, base / "saved", model=model)[0],
            "unified": make_fp8(root, base / "unified", layout="unified", model=twin)[0]}


@pytest.fixture(scope="module")
def saved_latents(layouts):
    return cosmos3_runtime.load(layouts["saved"], dtype="fp32").generate("a cat", **RUN).latents


def test_the_unified_export_equals_the_saved_layout_and_runs_its_policy(layouts, saved_latents, monkeypatch):
    """NVIDIA's exporter's layout (`weight_scale` / `input_scale`, the `config_groups` config, a root
    hf_quant_config.json) loads, runs the step policy, and gives the same latents as ModelOpt's saved layout of the
    same numbers, bit for bit (both make each activation scale as amax / 448 in float32)."""
    unified = layouts["unified"]
    block = json.loads((unified / "transformer" / "config.json").read_text())["quantization_config"]
    assert "config_groups" in block and "time_embedder*" in block["ignore"] and (unified / "hf_quant_config.json").is_file()
    keys = shard_tensors(unified)
    assert any(k.endswith(".input_scale") for k in keys) and not any("_quantizer." in k for k in keys)
    pipe = cosmos3_runtime.load(unified, dtype="fp32")
    assert "ModelOpt FP8 (W8A16 on the first 3 and last 3 steps" in pipe.variant.describe()
    seen = record_precision(pipe, monkeypatch)
    latents = pipe.generate("a cat", **RUN).latents
    assert seen[::2] == [(False, False)] * 3 + [(True, False)] * 2 + [(False, False)] * 3  # (cond, uncond) a step
    assert torch.equal(latents, saved_latents)


def test_both_layouts_in_one_folder_read_the_unified_scales_wherever_they_sit(layouts, saved_latents, tmp_path):
    """A folder holding both kinds of scale keys reads the unified export's (the buffers, here made wrong, are
    skipped), and scales in another shard than their weight are found through the index."""
    path = shutil.copytree(layouts["saved"], tmp_path / "both")
    saved = shard_tensors(path)
    for key in saved:
        if key.endswith(("_quantizer._scale", "_quantizer._amax")):
            saved[key] = saved[key] * 2  # read, these would change every result
    unified = shard_tensors(layouts["unified"])
    scales = {k: v for k, v in unified.items() if k.endswith(("weight_scale", "input_scale"))}
    write_shards(path, [saved, scales])  # the scales in a shard of their own
    assert torch.equal(cosmos3_runtime.load(path, dtype="fp32").generate("a cat", **RUN).latents, saved_latents)


def test_a_root_hf_quant_config_alone_declares_the_checkpoint(layouts, tmp_path):
    """Without a quantization_config in the transformer config, the root hf_quant_config.json (ModelOpt's form)
    says what the files are: FP8, its exclusions honoured, no step policy (W8A8 throughout)."""
    path = shutil.copytree(layouts["unified"], tmp_path / "root")
    config_file = path / "transformer" / "config.json"
    raw = json.loads(config_file.read_text())
    del raw["quantization_config"]
    config_file.write_text(json.dumps(raw))
    pipe = cosmos3_runtime.load(path, dtype="fp32")
    assert "ModelOpt FP8 (W8A8 throughout (no step policy))" in pipe.variant.describe()
    assert pipe.variant.quantization.ignores("time_embedder.linear_1")
    assert isinstance(pipe.transformer.get_submodule("layers.0.self_attn.add_q_proj"), ModelOptFp8Linear)


def _tensor_change(key, value):
    def change(tensors):
        tensors[key] = value(tensors)
    return change


def _config_change(update):
    def change(raw):
        update(raw["quantization_config"])
    return change


def _group(part, **fields):
    return lambda block: block["config_groups"]["group_0"][part].update(fields)


@pytest.mark.parametrize("tensors, config, message", [
    (_tensor_change("layers.0.mlp.down_proj.weight_scale_2", lambda t: torch.ones(())), None,
     "layers.0.mlp.down_proj.weight_scale_2: a quantization tensor this pack does not read"),
    (_tensor_change("layers.0.mlp.down_proj.k_scale", lambda t: torch.ones(())), None,
     "down_proj.k_scale: a quantization tensor"),
    (_tensor_change("layers.0.mlp.down_proj.weight_scale", lambda t: torch.ones(64)), None,
     r"down_proj.weight_scale has shape \[64\]: per-channel or block FP8 scales are not read"),
    (_tensor_change("proj_out.input_scale", lambda t: torch.ones(())), None,
     "proj_out.input_scale: a scale beside a weight that is not stored in float8_e4m3fn"),
    (None, _config_change(lambda block: block["ignore"].append("layers.0.mlp.*")),
     "layers.0.mlp.gate_proj.weight is stored in fp8, but the checkpoint's quantization config lists it as ignored"),
    (None, _config_change(_group("input_activations", dynamic=True)), "input_activations is dynamic"),
    (None, _config_change(_group("weights", num_bits=4)), "weights is .*, not 8-bit float"),
    (None, _config_change(_group("weights", strategy="block", block_structure=[128, 128])),
     "the pack reads tensorwise FP8 scales only"),
])
def test_what_the_reader_does_not_know_is_refused_by_name_before_any_weight_is_read(layouts, tmp_path, monkeypatch,
                                                                                    tensors, config, message):
    path = shutil.copytree(layouts["unified"], tmp_path / "refused")
    if tensors is not None:
        changed = shard_tensors(path)
        tensors(changed)
        write_shards(path, [changed])
    if config is not None:
        config_file = path / "transformer" / "config.json"
        raw = json.loads(config_file.read_text())
        config(raw)
        config_file.write_text(json.dumps(raw))
    from cosmos3_runtime.weights import files

    monkeypatch.setattr(files, "_tensors", lambda *a: pytest.fail("a weight was read before the refusal"))
    with pytest.raises(CheckpointError, match=message):
        cosmos3_runtime.load(path, dtype="fp32")


def test_modelopt_state_is_never_unpickled(layouts, tmp_path):
    """An export may leave ModelOpt's state pickle beside the weights: it is never opened (its payload would run)."""
    import pickle

    path = shutil.copytree(layouts["unified"], tmp_path / "state")
    marker = tmp_path / "unpickled"

    class Payload:
        def __reduce__(self):
            return open, (str(marker), "w")

    (path / "transformer" / "modelopt_state.pth").write_bytes(pickle.dumps(Payload()))
    cosmos3_runtime.load(path, dtype="fp32")
    assert not marker.exists()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_equals_modelopt_linear(dtype):
    """One linear against ModelOpt's own W8A8 forward (its CPU path: the activations fake-quantized with the static
    range, the weight dequantized): float32 ≤ 1e-6; bf16 ≤ 2 bf16 steps of the output (ModelOpt rounds its matmul to
    bf16, the emulation sums in float32 as the GPU's fp8 matmul does)."""
    mtq = modelopt_files.mtq
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96)).to(dtype)
    x = torch.randn(10, 64).to(dtype) * 2
    mtq.quantize(model, mtq.FP8_DEFAULT_CFG, forward_loop=lambda m: m(x))
    mtq.compress(model)
    state = model[0].state_dict()
    ours = modelopt_fp8.w8a8_linear(x, state["weight"], state["weight_quantizer._scale"].float(),
                                    state["input_quantizer._amax"].float() / 448, state["bias"])
    expected = model[0](x)
    atol = 1e-6 if dtype == torch.float32 else 2 * 2**-8 * expected.abs().max().item()
    torch.testing.assert_close(ours.float(), expected.float(), atol=atol, rtol=0)


def test_the_step_of_a_core_sampler_call_comes_from_its_sigmas():
    sigmas = [1.0, 0.9, 0.7, 0.4, 0.0]
    assert [precision.step_of_sigma(s, sigmas) for s in sigmas[:4]] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert precision.step_of_sigma(0.8, sigmas) == (1, 4)  # a second evaluation inside step 1 (Heun)
    assert precision.step_of_sigma(1.2, sigmas) == (0, 4)


def test_the_reasoner_runs_on_an_fp8_text_tower_at_its_policy(fp8, monkeypatch):
    path, _ = fp8
    pipe = cosmos3_runtime.load(path, dtype="fp32")
    seen = []
    original = modelopt_fp8.w8a8_linear
    monkeypatch.setattr("cosmos3_runtime.weights.modelopt_fp8.w8a8_linear", lambda *a: seen.append(1) or original(*a))
    answer = pipe.reason("What is in the picture?", max_new_tokens=2, temperature=0)
    assert answer.text is not None and not seen  # text tower "a16": W8A16, no W8A8 matmul


def test_the_compiled_media_block_reads_the_step_precision_without_graph_breaks(fp8, monkeypatch):
    """compile=True on an FP8 checkpoint: the compiled block reads each step's precision as a guarded value (one
    graph per precision, none broken; a ContextVar broke it at every linear), and equals the eager run."""
    from torch._dynamo.utils import counters

    from cosmos3_runtime import transformer
    from cosmos3_runtime.transformer import compiled_media_block

    torch._dynamo.reset()
    counters.clear()
    monkeypatch.setattr(transformer, "compiled_media_block", lambda: compiled_media_block("eager"))
    pipe = cosmos3_runtime.load(fp8[0], dtype="fp32")
    request = dict(width=64, height=64, num_frames=5, steps=8, output="latents", guidance_scale=1.0, cache="off")
    plain = pipe.generate("a cat", **request).latents
    compiled = pipe.generate("a cat", **request, compile=True).latents
    assert torch.equal(compiled, plain)
    assert not counters["graph_break"]
    assert counters["stats"]["unique_graphs"] == 2  # W8A16 and W8A8


def _uint8(shape, seed):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


RUNS = {  # every mode steps through the one loop that sets the precision: (checkpoint options, generate options)
    "sound": (dict(kind="gated", sound=True), dict(sound=True, num_frames=5, width=64, height=64)),
    "action": (dict(kind="edge", action=True),
               dict(action=ActionRequest(image=Image.fromarray(_uint8((200, 280, 3), 0)), chunk_size=4,
                                         domain="droid_lerobot", resolution_tier=256))),
    "transfer": (dict(kind="gated"), dict(control_videos={"edge": _uint8((5, 40, 56, 3), 1)}, width=64, height=48)),
    "long video": (dict(kind="gated"), dict(num_frames=13, chunk_frames=9, width=64, height=48)),
}


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m in ("action", "long video") else m
                                  for m in RUNS])  # the two longest with the slow tests
def test_every_mode_runs_the_policy(tiny_factory, tmp_path, monkeypatch, mode):
    """Sound, action, transfer and long videos on an FP8 checkpoint: W8A16 on each run's (each chunk's) first and last
    3 steps, W8A8 between, the text tower W8A16 throughout."""
    options, request = RUNS[mode]
    path, _ = make_fp8(tiny_factory(**options), tmp_path / "fp8")
    pipe = cosmos3_runtime.load(path, dtype="fp32")
    seen = record_precision(pipe, monkeypatch)
    pipe.generate("a robot arm", steps=8, cache="off", seed=1, **request)
    runs = [value for value, _ in itertools.groupby(seen)]
    chunks = 2 if mode == "long video" else 1  # one chunk's last W8A16 steps run into the next one's first
    assert runs == [(False, False), (True, False)] * chunks + [(False, False)]


@pytest.fixture(scope="module")
def causal_fp8(tiny_factory, tmp_path_factory):
    """A chunkwise Sim-Transfer checkpoint (tiny, fp32) and its official FP8 copy written by ModelOpt (unified
    layout, with the step policy)."""
    from cosmos3_runtime.tiny import sim_transfer_block

    root = tiny_factory(kind="gated", dtype="float32", distilled=True, causal=sim_transfer_block(), reasoner=False)
    return root, make_fp8(root, tmp_path_factory.mktemp("causal_fp8") / "fp8", layout="unified")[0]


def test_a_causal_rollout_runs_w8a8_as_its_policy_says_commits_at_the_last_steps(causal_fp8, monkeypatch):
    """A causal rollout takes the official FP8 checkpoint's precision options as the bidirectional sampler does: each
    of a chunk's 4 steps as the policy says, and the commits (clean forwards outside the steps, which ran W8A8
    whatever the policy said) at the chunk's last step's; with the policy off, W8A8 throughout. Its latents against
    the dense fp32 rollout's: measured here, the policy's W8A16 4.6 %, W8A8 throughout 5.5 % (random weights)."""
    dense_root, root = causal_fp8
    control = {"edge": torch.rand(33, 32, 48, 3, generator=torch.Generator().manual_seed(0))}
    options = dict(control_videos=control, width=48, height=32, seed=3)
    pipe = cosmos3_runtime.load(root, dtype="fp32")
    assert pipe.variant.causal is not None and "ModelOpt FP8" in pipe.variant.describe()
    seen = record_precision(pipe, monkeypatch)
    policy = pipe.generate("a robot arm", **options)  # 4 steps, 3 first and 3 last at W8A16: all of them
    assert set(seen) == {(False, False)} and len(seen) == 3 * 4 + 8  # 3 chunks' steps, 8 commits
    seen.clear()
    native = pipe.generate("a robot arm", **options, precision_policy="off")
    assert set(seen) == {(True, True)}
    dense = cosmos3_runtime.load(dense_root, dtype="fp32").generate("a robot arm", **options).latents

    def error(x):
        return ((x - dense).abs().mean() / dense.abs().mean()).item()

    print(f"causal rollout vs dense fp32: W8A16 {error(policy.latents):.4f}, W8A8 {error(native.latents):.4f}")
    assert 0 < error(policy.latents) < error(native.latents) < 0.08, (error(policy.latents), error(native.latents))
