"""Tiny checkpoints in NVIDIA's official FP8 layouts, and in ModelOpt's NVFP4 export, written by NVIDIA's own tool:
nvidia-modelopt quantizes diffusers' transformer with its FP8 config (tensorwise fp8 weights and activations) or its
NVFP4 config (packed 4-bit weights, e4m3 scales per 16 values and a global scale; activations calibrated alike), the
fp32 time embedder left as it is, calibrates the activation ranges on diffusers' own forward, and writes the weights
in one of two layouts (NVFP4: the unified one, `make_nvfp4`):

- "saved": compressed to float8_e4m3fn and saved with `save_pretrained` (the quantizer buffers `_scale` / `_amax`);
  the transformer config then gets the `quantization_config` block the Hub's revision "fp8" carries: quant_method
  "modelopt", FP8;
- "unified": ModelOpt's unified HF export (`export_hf_checkpoint`, the code path NVIDIA's Cosmos3 FP8 exporter runs:
  q/k/v ranges unified, `weight_scale` / `input_scale` beside each fp8 weight, `quantization_config` in its
  `config_groups` form with the `ignore` list), its QKV fusion fed diffusers' own forward, then what the exporter
  adds: the config mirrored to a root `hf_quant_config.json`.

For multi-step checkpoints the step policy diffusers ships as the official one (`FIRST_LAST_N_FP8_POLICY`) goes
under `quantization_config.runtime`.

diffusers 0.42.1 cannot load such files back on the CPU with nvidia-modelopt 0.47 (its ModelOpt config builder
predates ModelOpt's list-form configs, and accelerate cannot re-wrap the compressed weights), so the reference runs
on the model ModelOpt wrote, in memory: exactly what a restore would rebuild.
"""

import json
import shutil
from pathlib import Path

import torch
from conftest import require

import diffusers_reference as ref

mtq = require("modelopt.torch.quantization")
mto = require("modelopt.torch.opt")
from diffusers.pipelines.cosmos import mixed_precision  # noqa: E402

POLICY = mixed_precision.FIRST_LAST_N_FP8_POLICY


def calibration_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 500, (12,), generator=g).tolist(), torch.randn(1, 48, 2, 4, 4, generator=g))
            for _ in range(2)]


def make_fp8(root: Path, dst: Path, policy: dict | None = POLICY, dtype=torch.float32, time_embedder: bool = False,
             layout: str = "saved", model=None):
    """A copy of the tiny checkpoint `root` at `dst` with its transformer in the official FP8 `layout` ("saved" or
    "unified"); returns (dst, the ModelOpt-quantized diffusers transformer that wrote it). `time_embedder`: quantize
    the fp32 time embedder too (the official recipe leaves it out; an exporter run without that exclusion does not).
    `model`: a calibrated model (`quantized`) to write instead of quantizing anew (the same numbers in both layouts)."""
    shutil.copytree(root, dst)
    model = quantized(root, dtype, time_embedder) if model is None else model
    folder = dst / "transformer"
    for old in folder.glob("diffusion_pytorch_model*"):
        old.unlink()
    if layout == "saved":
        mtq.compress(model)
        model.save_pretrained(str(folder))
        block = {"quant_method": "modelopt", "quant_algo": "FP8"}
    else:
        export_unified(model, folder)
        block = json.loads((folder / "config.json").read_text())["quantization_config"]
        mirror = {"producer": block["producer"], "quantization": {"quant_algo": block["quant_algo"],
                                                                  "kv_cache_quant_algo": None,
                                                                  "exclude_modules": block["ignore"]}}
        (dst / "hf_quant_config.json").write_text(json.dumps(mirror, indent=4))
    raw = json.loads((folder / "config.json").read_text())
    if policy is not None:
        block["runtime"] = {"diffusion_step_policy": policy}
    raw["quantization_config"] = block
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    return dst, model


def make_nvfp4(root: Path, dst: Path, policy: dict | None = None):
    """A copy of the tiny checkpoint `root` at `dst` with its transformer in ModelOpt's NVFP4 export (`unified`
    layout, its `config_groups` config and ignore list, a root hf_quant_config.json); returns (dst, the ModelOpt
    model that wrote it). ModelOpt's export runs on the CPU: no GPU is needed to write it."""
    return make_fp8(root, dst, policy, layout="unified", model=quantized(root, algorithm="NVFP4"))


def quantized(root: Path, dtype=torch.float32, time_embedder: bool = False, algorithm: str = "FP8"):
    """diffusers' transformer of `root` quantized by ModelOpt's FP8 (or NVFP4) config and calibrated (not yet
    written)."""
    model = ref.load_transformer(root, dtype)
    excluded = [] if time_embedder else [{"quantizer_name": "*time_embedder*", "enable": False}]
    preset = {"FP8": mtq.FP8_DEFAULT_CFG, "NVFP4": mtq.NVFP4_DEFAULT_CFG}[algorithm]
    config = {"quant_cfg": list(preset["quant_cfg"]) + excluded, "algorithm": "max"}
    mtq.quantize(model, config, forward_loop=calibrate)
    return model


def calibrate(model):
    for ids, latents in calibration_inputs():
        ref.velocity(model, ids, latents, 700, [0, 1], 24.0)


def export_unified(model, folder: Path) -> None:
    """ModelOpt's unified HF export of one diffusers transformer into `folder`. Its QKV fusion finds the linears that
    read one input by running the model; ModelOpt's generic dummy inputs do not fit Cosmos3's forward, so it gets
    diffusers' own (as NVIDIA's exporter gives it its pipeline's)."""
    from modelopt.torch.export import unified_export_hf

    original = unified_export_hf.generate_diffusion_dummy_forward_fn
    unified_export_hf.generate_diffusion_dummy_forward_fn = lambda m: (lambda: calibrate(m))
    try:
        unified_export_hf.export_hf_checkpoint(model, export_dir=folder)
    finally:
        unified_export_hf.generate_diffusion_dummy_forward_fn = original


def shard_tensors(folder: Path) -> dict:
    """Every tensor of a checkpoint's transformer files."""
    from safetensors.torch import load_file

    return {k: v for shard in sorted((folder / "transformer").glob("*.safetensors")) for k, v in
            load_file(str(shard)).items()}


def write_shards(folder: Path, shards: list[dict]) -> None:
    """The transformer's weights rewritten as these shards, with their index."""
    from safetensors.torch import save_file

    transformer = folder / "transformer"
    for old in transformer.glob("diffusion_pytorch_model*"):
        old.unlink()
    weight_map = {}
    for i, tensors in enumerate(shards):
        name = f"diffusion_pytorch_model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(transformer / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (transformer / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))


def policy_labels(name: str) -> str | None:
    """diffusers' classifier with the attention projections labelled by their real pathway: the media tower's
    `add_*` / `to_add_out` switch per step with its MLP (`mlp_moe_gen`), the text tower's `to_q/k/v/out` follow the
    reasoner entry with its MLP (`mlp`). diffusers 0.42.1 has the two attention sets the other way round."""
    if ".mlp_moe_gen." in name or ".self_attn.add_" in name or name.endswith(".self_attn.to_add_out"):
        return "generation"
    if ".mlp." in name or name.endswith((".self_attn.to_q", ".self_attn.to_k", ".self_attn.to_v",
                                         ".self_attn.to_out")):
        return "reasoner"
    return None


def w8a16_on_the_cpu(layer, inputs, name):
    """diffusers' `_w8a16_linear`, reading the fp8 values through ModelOpt's weight wrapper (`.data`): on the CPU the
    wrapper's `.to(dtype)` keeps float8, which the CPU cannot multiply. The definition is diffusers' own."""
    scale = layer.weight_quantizer._scale.to(device=layer.weight.device, dtype=inputs.dtype)
    return torch.nn.functional.linear(inputs, layer.weight.data.to(dtype=inputs.dtype) * scale, layer.bias)


if __name__ == "__main__":  # a tiny official-FP8 (or NVFP4) checkpoint to try (docs/python-api.md)
    import argparse

    parser = argparse.ArgumentParser(description="Copy a tiny checkpoint with its transformer in NVIDIA's official FP8 "
                                                 "layout, or ModelOpt's NVFP4 export, written by nvidia-modelopt "
                                                 "(random weights: for trying)")
    parser.add_argument("source", type=Path, help="a tiny checkpoint folder (python -m cosmos3_runtime make-tiny)")
    parser.add_argument("destination", type=Path)
    parser.add_argument("--layout", choices=("unified", "saved", "nvfp4"), default="unified", help="unified: NVIDIA's "
                        "FP8 exporter's (weight_scale / input_scale); saved: ModelOpt's save_pretrained buffers; "
                        "nvfp4: ModelOpt's NVFP4 export (no step policy)")
    args = parser.parse_args()
    if args.layout == "nvfp4":
        make_nvfp4(args.source, args.destination)
        print(f"wrote {args.destination}: its transformer in ModelOpt NVFP4")
    else:
        make_fp8(args.source, args.destination, layout=args.layout)
        print(f"wrote {args.destination}: its transformer in ModelOpt FP8 ({args.layout} layout) with the step policy")
