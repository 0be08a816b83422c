"""fp8 quality per layer class: which linears can run scaled fp8 matmuls (activations quantized per token) at what
cost, against the weight-only path, both against bf16.

    python benchmarks/bench_fp8.py                  # CPU, a few minutes: Edge and gated, 4 seeds each

Each row quantizes every linear to fp8 (per-row weight scales), runs the rows' layer class scaled and the rest
weight-only, and generates 4 steps at 128x96x9 for 4 seeds on a small random checkpoint (6 layers, width 512; its
weights are random, so the figures rank the classes rather than predict a trained model's error). Figure: the
relative mean difference of the final latents against bf16, mean over seeds. The CPU runs torch's own
`_scaled_mm`, the arithmetic the GPU kernel does (fp8 inputs, fp32 accumulation, bf16 output). Not a test.
"""

import argparse
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import cosmos3_runtime  # noqa: E402
from cosmos3_runtime.weights.local_fp8 import Fp8Linear, scaled_layer  # noqa: E402
from cosmos3_runtime.tiny import make_tiny_checkpoint  # noqa: E402
from cosmos3_runtime.transformer import tower_of  # noqa: E402

REQUEST = dict(width=128, height=96, num_frames=9, steps=4, output="latents", negative_prompt="blurry")
SEEDS = range(4)


def layer_class(name: str, num_layers: int) -> set[str]:
    if tower_of(name + ".weight") == "text tower":
        kind = "text"
    elif "mlp_moe_gen.down_proj" in name:
        kind = "media mlp down"
    elif "mlp_moe_gen" in name:
        kind = "media mlp in"
    elif "self_attn" in name:
        kind = "media attention"
    else:
        kind = "patch and head projections"
    outer = name.startswith(("layers.0.", f"layers.{num_layers - 1}."))
    return {kind, "first/last layer"} if outer else {kind}


POLICIES = {
    "weight-only (quantize='fp8')": lambda name, c, n: False,
    "scaled everywhere (the old GPU default)": lambda name, c, n: True,
    "scaled: text tower only": lambda name, c, n: c == {"text"},
    "scaled: patch and head projections only": lambda name, c, n: "patch and head projections" in c,
    "scaled: media attention projections only": lambda name, c, n: "media attention" in c,
    "scaled: media MLP input projections only": lambda name, c, n: "media mlp in" in c,
    "scaled: media MLP output projection only": lambda name, c, n: "media mlp down" in c,
    "scaled: media attention + MLPs": lambda name, c, n: bool(c & {"media attention", "media mlp in", "media mlp down"}),
    "fp8_scaled (media attention + MLPs, not first/last)": lambda name, c, n: scaled_layer(name, n),
}


def measure(kind: str, folder: Path) -> None:
    root = make_tiny_checkpoint(folder / kind, kind=kind, size="small")
    reference = cosmos3_runtime.load(root, dtype="bf16", device="cpu")
    expected = [reference.generate("a cat walks", seed=s, **REQUEST).latents for s in SEEDS]
    pipe = cosmos3_runtime.load(root, dtype="bf16", device="cpu", quantize="fp8")
    n = pipe.transformer.config.num_hidden_layers
    print(f"\n{kind}: relative mean difference of the latents against bf16 (mean of {len(SEEDS)} seeds)")
    print("| layers run scaled | difference | vs weight-only |")
    print("|---|---|---|")
    base = None
    for label, policy in POLICIES.items():
        for name, module in pipe.transformer.named_modules():
            if isinstance(module, Fp8Linear):
                module.scaled = policy(name, layer_class(name, n), n)
        pipe.denoiser.text_cache.clear()  # the text tower's K/V depend on the policy too
        errors = [((pipe.generate("a cat walks", seed=s, **REQUEST).latents - e).abs().mean() / e.abs().mean()).item()
                  for s, e in zip(SEEDS, expected)]
        error = sum(errors) / len(errors)
        base = base or error
        print(f"| {label} | {error:.4f} | {error / base:.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["edge", "gated"], choices=["edge", "gated"])
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the toy size is outside Edge's trained sizes: one warning per run
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            measure(kind, Path(tmp))


if __name__ == "__main__":
    main()
