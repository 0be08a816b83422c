"""What each low-VRAM option keeps on the compute device, on the released Edge / Nano shapes (random weights).

    python benchmarks/bench_memory.py                         # computed table: every variant, 8-24 GB fits
    python benchmarks/bench_memory.py --measure --variant edge --device cuda   # measured on a GPU
    python benchmarks/bench_memory.py --released-sizes        # the generator's weights per download format

Options compared: default, offload_text, blocks_to_swap, fp8 (and fp8_scaled), GGUF Q8_0 and Q4_0 (random blocks: the
speed of a GGUF layer depends on its type and shape, not its values), NVFP4 (random packed values) and text + swap +
fp8 combined.
- Computed (any machine, nothing allocated): weight bytes each option leaves on the compute device, the memory plan
  of each weight format (`weights.format.planned_bytes`: what its layers keep, scales included) over the model's
  parameters on the meta device under that option's placement, plus the activations of the request from the
  runtime's own estimate (`budget.estimate`, the format's layers at work included).
- Measured (`--measure`, CUDA): peak `torch.cuda.max_memory_allocated` (and `max_memory_reserved`, what the
  caching allocator holds: what other programs cannot use) and time per step (both CFG forwards) with random bf16
  weights in the released shapes, each option against the default from
  the same run. A CPU cannot tell compute from offload memory, so `--measure` on CPU only times the
  options on a reduced depth (`--layers`) and says so.
Not a test: numbers depend on the machine.
"""

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from cosmos3_runtime import budget  # noqa: E402
from cosmos3_runtime.geometry import RunGeometry  # noqa: E402
from cosmos3_runtime.offload import BlockSwap, TextOffload  # noqa: E402
from cosmos3_runtime.tiny import RELEASED  # noqa: E402
from cosmos3_runtime.transformer import Cosmos3Transformer, TransformerConfig, tower_of  # noqa: E402
from cosmos3_runtime.vae import VAEConfig  # noqa: E402
from cosmos3_runtime.weights.files import Dense  # noqa: E402
from cosmos3_runtime.weights.format import planned_bytes, replace_linears  # noqa: E402
from cosmos3_runtime.weights.gguf import BLOCK_LINEARS, GGUF, GGUFLinear  # noqa: E402
from cosmos3_runtime.weights.gguf_dequant import BLOCKS  # noqa: E402
from cosmos3_runtime.weights.local_fp8 import LocalFp8, quantize_fp8  # noqa: E402
from cosmos3_runtime.weights.modelopt import Quantization  # noqa: E402
from cosmos3_runtime.weights.modelopt_fp8 import ModelOptFp8  # noqa: E402
from cosmos3_runtime.weights.nvfp4 import NVFP4, NVFP4Linear  # noqa: E402

REQUESTS = {"edge": (832, 480, 81), "nano": (1280, 720, 81), "super": (1280, 720, 81)}
GIB = 2**30


GGUF_SCALES = {"Q8_0": 0.02 / 74, "Q4_0": 0.02 / 4.6}  # block scale for weights of std ~0.02 from random bytes
EXPORT_IGNORE = ("embed_tokens", "lm_head", "proj_out", "time_embedder*")  # what ModelOpt's export leaves unquantized
FORMATS = {"bf16": Dense(None), "official FP8 (ModelOpt)": ModelOptFp8(None, {}, Quantization("FP8", None,
                                                                                             EXPORT_IGNORE)),
           "NVFP4 (ModelOpt)": NVFP4(None, {}, Quantization("NVFP4", None, EXPORT_IGNORE)),
           "GGUF Q8_0": GGUF(None, "Q8_0"), "GGUF Q4_0": GGUF(None, "Q4_0")}  # the download formats


def options(swap: int) -> dict[str, dict]:
    return {
        "default": {},
        "offload_text": dict(offload_text=True),
        f"blocks_to_swap={swap}": dict(blocks_to_swap=swap),
        "fp8": dict(weights=LocalFp8(None, "fp8")),
        "fp8_scaled": dict(weights=LocalFp8(None, "fp8_scaled")),
        "gguf Q8_0": dict(weights=FORMATS["GGUF Q8_0"]),
        "gguf Q4_0": dict(weights=FORMATS["GGUF Q4_0"]),
        "NVFP4": dict(weights=FORMATS["NVFP4 (ModelOpt)"]),
        f"combined (text, {swap} blocks, fp8)": dict(offload_text=True, blocks_to_swap=swap,
                                                     weights=LocalFp8(None, "fp8")),
    }


def computed_weights(config: TransformerConfig, option: dict) -> int:
    """Bytes of weights on the compute device under an option (bf16, or the option's weight format's memory plan)."""
    with torch.device("meta"):
        model = Cosmos3Transformer(config)
    swapped = set(range(option.get("blocks_to_swap", 0)))
    total, swapped_bytes = 0, {}
    for name, size in planned_bytes(model, option.get("weights", FORMATS["bf16"]), torch.bfloat16).items():
        tower = tower_of(name)
        if option.get("offload_text") and tower == "text tower":
            continue
        layer = int(name.split(".")[1]) if name.startswith("layers.") else None
        if tower == "media tower" and layer in swapped:
            swapped_bytes[layer] = swapped_bytes.get(layer, 0) + size
        else:
            total += size
    resident = sorted(swapped_bytes.values())[-2:] if swapped_bytes else []  # the running layer and the next
    return total + sum(resident)


def activations(config: TransformerConfig, size: tuple[int, int, int], option: dict, text_tokens: int = 300) -> int:
    width, height, frames = size
    geometry = RunGeometry(height, width, frames, frames, guided=True)  # the default request: guidance 4
    return budget.estimate(config, VAEConfig(latents_mean=(0.0,) * 48, latents_std=(1.0,) * 48), geometry,
                           text_tokens, text_tokens, torch.bfloat16, tile=None, weights=option.get("weights")).total


def computed_table(swap: int) -> None:
    print("Computed (nothing allocated): GiB on the compute device = weights + activations of the default request")
    print("(activations include the VAE decode of the whole clip untiled; tiled decoding lowers them further)\n")
    for variant, raw in RELEASED.items():
        config = TransformerConfig(**raw)
        w, h, f = REQUESTS[variant]
        print(f"{variant}: {w}x{h}x{f}, activations {activations(config, REQUESTS[variant], {}) / GIB:.1f} GiB")
        print("| option | weights GiB | total GiB | fits in |")
        print("|---|---|---|---|")
        for label, option in options(swap).items():
            if label == "fp8_scaled":  # the same bytes as fp8
                continue
            weights = computed_weights(config, option)
            total = weights + activations(config, REQUESTS[variant], option)
            fits = [f"{g} GB" for g in (8, 12, 16, 24) if total <= g * 1e9 * 0.92]  # leave the CUDA context room
            print(f"| {label} | {weights / GIB:.1f} | {total / GIB:.1f} | {', '.join(fits) or 'none of 8-24 GB'} |")
        print()


def random_model(config: TransformerConfig, device: str, weights=None) -> Cosmos3Transformer:
    """Random bf16 weights (made on `device`: fast on a GPU); GGUF `weights`: the blocks' linears as random blocks;
    NVFP4: the linears its export quantizes as random packed values, block scales 1 and a global scale for a std
    about 0.02."""
    with torch.device("meta"):
        model = Cosmos3Transformer(config)
        if isinstance(weights, GGUF):
            replace_linears(model, lambda name, linear: GGUFLinear(linear, weights.qtype) if
                            name.startswith(BLOCK_LINEARS) else None)
        if isinstance(weights, NVFP4):
            replace_linears(model, lambda name, linear: None if weights.quantization.ignores(name) else
                            NVFP4Linear(linear))
        for name, p in model.named_parameters():  # bf16 before any memory is taken: no float32 copy to cache
            if p.is_floating_point() and p.dtype != torch.float8_e4m3fn and not name.startswith("time_embedder."):
                p.data = p.data.to(torch.bfloat16)
    model = model.to_empty(device=device)
    generator = torch.Generator(device).manual_seed(0)
    for name, p in model.named_parameters():
        if p.dtype == torch.uint8 and isinstance(weights, GGUF):  # random values, a sane fp16 scale at block starts
            blocks = p.data.view(-1, BLOCKS[weights.qtype][1])
            blocks.random_(0, 256, generator=generator)
            blocks[:, :2] = torch.full((len(blocks), 1), GGUF_SCALES[weights.qtype], dtype=torch.float16,
                                       device=device).view(torch.uint8)
        elif p.dtype == torch.uint8:
            p.data.random_(0, 256, generator=generator)
        elif p.dtype == torch.float8_e4m3fn:
            p.data.fill_(1.0)
        elif name.endswith("weight_scale_2"):
            p.data.fill_(0.02 / 3)  # E2M1 values of random bytes have a std about 3
        else:
            p.data.normal_(0, 0.02, generator=generator)
    return model.eval()


def measure(variant: str, device: str, swap: int, layers: int | None, size, steps: int, only=(),
            total_steps: int = 35) -> None:
    raw = dict(RELEASED[variant])
    if device == "cpu":
        raw["num_hidden_layers"] = layers or 2
        print(f"CPU: one device holds everything, so memory per device cannot be measured here; timing only, "
              f"{raw['num_hidden_layers']} layers")
    config = TransformerConfig(**raw)
    w, h, f = size
    latents = torch.randn(1, 48, 1 + (f - 1) // 4, h // 16, w // 16, device=device)
    ids = torch.arange(300) % config.vocab_size
    results = {}
    chosen = {label: option for label, option in options(swap).items() if not only or label in only}
    for label, option in chosen.items():
        weights = option.get("weights")
        model = random_model(config, device, weights)
        if isinstance(weights, LocalFp8):
            quantize_fp8(model, weights.mode)
        text_offload = TextOffload(model, torch.device("cpu")) if option.get("offload_text") else None
        if option.get("blocks_to_swap"):
            model.hooks = replace(model.hooks, layer=BlockSwap(model, option["blocks_to_swap"]))
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # what the option's setup left cached is not the run's
            torch.cuda.reset_peak_memory_stats()
        with torch.inference_mode():
            if text_offload is not None:
                with text_offload.on(torch.device(device)):
                    text = model.encode_text(ids, device)
            else:
                text = model.encode_text(ids, device)
            start = None
            for step in range(steps + 1):  # the first step warms up
                if step == 1:
                    if device == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                for _ in range(2):  # conditional and unconditional forwards
                    model(latents, torch.tensor(900), text)
            if device == "cuda":
                torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / steps
        peak = torch.cuda.max_memory_allocated() / GIB if device == "cuda" else float("nan")
        reserved = torch.cuda.max_memory_reserved() / GIB if device == "cuda" else float("nan")
        results[label] = (peak, reserved, seconds)
        del model, text
        if device == "cuda":
            torch.cuda.empty_cache()
    base_peak, _, base_time = results.get("default", next(iter(results.values())))
    base = "default" if "default" in results else next(iter(results))
    print(f"{variant} {w}x{h}x{f}, {steps} timed steps (two forwards each: CFG), device {device}; ratios against {base}")
    print(f"| option | peak allocated GiB | vs {base} | peak reserved GiB | s per step | vs {base} | {total_steps} steps |")
    print("|---|---|---|---|---|---|---|")
    for label, (peak, reserved, seconds) in results.items():
        memory = f"{peak:.2f} | {peak / base_peak:.2f}x | {reserved:.2f}" if device == "cuda" else "n/a | n/a | n/a"
        print(f"| {label} | {memory} | {seconds:.3f} | {seconds / base_time:.2f}x | {seconds * total_steps:.0f} s |")


def released_sizes() -> None:
    """The generator's weights in each download format, computed from the released shapes (the files also hold the
    Reasoner's output head and last text layer, which generation does not read)."""
    print("| variant | " + " | ".join(FORMATS) + " |")
    print("|---" * (len(FORMATS) + 1) + "|")
    for variant, raw in RELEASED.items():
        config = TransformerConfig(**raw)
        sizes = [computed_weights(config, dict(weights=weights)) for weights in FORMATS.values()]
        print(f"| {variant} | " + " | ".join(f"{size / GIB:.1f} GiB" for size in sizes) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--variant", choices=sorted(RELEASED), default="edge")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--blocks-to-swap", type=int, default=8)
    parser.add_argument("--layers", type=int, default=None, help="CPU timing: depth of the reduced model")
    parser.add_argument("--size", default=None, help="WxHxF (default: the variant's default video)")
    parser.add_argument("--steps", type=int, default=2, help="steps timed (after one warm-up step)")
    parser.add_argument("--options", nargs="+", default=(), help="measure only these options (labels as printed)")
    parser.add_argument("--no-table", action="store_true", help="skip the computed table")
    parser.add_argument("--released-sizes", action="store_true", help="only the weights of each download format")
    args = parser.parse_args()
    if args.released_sizes:
        return released_sizes()
    if not args.no_table:
        computed_table(args.blocks_to_swap)
    if args.measure:
        size = tuple(int(v) for v in args.size.split("x")) if args.size else REQUESTS[args.variant]
        measure(args.variant, args.device, args.blocks_to_swap, args.layers, size, args.steps, args.options)


if __name__ == "__main__":
    main()
