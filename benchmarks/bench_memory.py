"""What each low-VRAM option keeps on the compute device, on the released Edge / Nano shapes (random weights).

    python benchmarks/bench_memory.py                         # computed table: every variant, 8-24 GB fits
    python benchmarks/bench_memory.py --measure --variant edge --device cuda   # measured on a GPU
    python benchmarks/bench_memory.py --released-sizes        # the generator's weights per download format

Options compared: default, offload_text, blocks_to_swap, fp8 (and fp8_scaled), GGUF Q8_0 and Q4_0 (random blocks: the
speed of a GGUF layer depends on its type and shape, not its values) and text + swap + fp8 combined.
- Computed (any machine, nothing allocated): weight bytes each option leaves on the compute device,
  counted from the model's parameters on the meta device under that option's placement, plus the
  activations of the request from the runtime's own estimate (`budget.estimate`).
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
from cosmos3_runtime.gguf_dequant import BLOCKS  # noqa: E402
from cosmos3_runtime.gguf_weights import BLOCK_LINEARS, GGUFLinear  # noqa: E402
from cosmos3_runtime.offload import BlockSwap, TextOffload  # noqa: E402
from cosmos3_runtime.quantize import quantize_fp8  # noqa: E402
from cosmos3_runtime.tiny import RELEASED  # noqa: E402
from cosmos3_runtime.transformer import Cosmos3Transformer, TransformerConfig, tower_of  # noqa: E402
from cosmos3_runtime.vae import VAEConfig  # noqa: E402

REQUESTS = {"edge": (832, 480, 81), "nano": (1280, 720, 81), "super": (1280, 720, 81)}
GIB = 2**30


GGUF_SCALES = {"Q8_0": 0.02 / 74, "Q4_0": 0.02 / 4.6}  # block scale for weights of std ~0.02 from random bytes


def options(swap: int) -> dict[str, dict]:
    return {
        "default": {},
        "offload_text": dict(offload_text=True),
        f"blocks_to_swap={swap}": dict(blocks_to_swap=swap),
        "fp8": dict(fp8=True),
        "fp8_scaled": dict(fp8="fp8_scaled"),
        "gguf Q8_0": dict(gguf="Q8_0"),
        "gguf Q4_0": dict(gguf="Q4_0"),
        f"combined (text, {swap} blocks, fp8)": dict(offload_text=True, blocks_to_swap=swap, fp8=True),
    }


def computed_weights(config: TransformerConfig, option: dict) -> int:
    """Bytes of weights on the compute device under an option (bf16; fp8 weights one byte plus a scale per row)."""
    with torch.device("meta"):
        model = Cosmos3Transformer(config)
    swapped = set(range(option.get("blocks_to_swap", 0)))
    total, swapped_bytes = 0, {}
    for name, p in model.named_parameters():
        tower = tower_of(name)
        if option.get("offload_text") and tower == "text tower":
            continue
        size = p.numel() * (4 if name.startswith("time_embedder") else 2)
        if option.get("fp8") and p.ndim == 2 and not name.startswith("time_embedder"):
            size = p.numel() + p.shape[0] * 4  # fp8 values and a float32 scale per row
        if option.get("modelopt") and name.endswith(".weight") and not name.startswith("time_embedder") and \
                isinstance(model.get_submodule(name.removesuffix(".weight")), torch.nn.Linear):
            size = p.numel() + 3 * 2  # fp8 values; weight scale, weight range and input range (bf16 scalars)
        if option.get("gguf") and p.ndim == 2 and name.startswith(BLOCK_LINEARS):
            values, block = BLOCKS[option["gguf"]]
            size = p.numel() // values * block
        layer = int(name.split(".")[1]) if name.startswith("layers.") else None
        if tower == "media tower" and layer in swapped:
            swapped_bytes[layer] = swapped_bytes.get(layer, 0) + size
        else:
            total += size
    resident = sorted(swapped_bytes.values())[-2:] if swapped_bytes else []  # the running layer and the next
    return total + sum(resident)


def activations(config: TransformerConfig, size: tuple[int, int, int], text_tokens: int = 300) -> int:
    width, height, frames = size
    geometry = RunGeometry(height, width, frames, frames, guided=True)  # the default request: guidance 4
    return budget.estimate(config, VAEConfig(latents_mean=(0.0,) * 48, latents_std=(1.0,) * 48), geometry,
                           text_tokens, text_tokens, torch.bfloat16, tile=None).total


def computed_table(swap: int) -> None:
    print("Computed (nothing allocated): GiB on the compute device = weights + activations of the default request")
    print("(activations include the VAE decode of the whole clip untiled; tiled decoding lowers them further)\n")
    for variant, raw in RELEASED.items():
        config = TransformerConfig(**raw)
        act = activations(config, REQUESTS[variant])
        w, h, f = REQUESTS[variant]
        print(f"{variant}: {w}x{h}x{f}, activations {act / GIB:.1f} GiB")
        print("| option | weights GiB | total GiB | fits in |")
        print("|---|---|---|---|")
        for label, option in options(swap).items():
            if label == "fp8_scaled":  # the same bytes as fp8
                continue
            weights = computed_weights(config, option)
            total = weights + act
            fits = [f"{g} GB" for g in (8, 12, 16, 24) if total <= g * 1e9 * 0.92]  # leave the CUDA context room
            print(f"| {label} | {weights / GIB:.1f} | {total / GIB:.1f} | {', '.join(fits) or 'none of 8-24 GB'} |")
        print()


def random_model(config: TransformerConfig, device: str, gguf: str | None = None) -> Cosmos3Transformer:
    """Random bf16 weights (made on `device`: fast on a GPU); `gguf`: the blocks' linears as random blocks."""
    with torch.device("meta"):
        model = Cosmos3Transformer(config)
        if gguf is not None:
            for name, module in list(model.named_modules()):
                for child_name, child in list(module.named_children()):
                    if f"{name}.".startswith(BLOCK_LINEARS) and isinstance(child, torch.nn.Linear):
                        setattr(module, child_name, GGUFLinear(child, gguf))
        for name, p in model.named_parameters():  # bf16 before any memory is taken: no float32 copy to cache
            if p.is_floating_point() and not name.startswith("time_embedder."):
                p.data = p.data.to(torch.bfloat16)
    model = model.to_empty(device=device)
    generator = torch.Generator(device).manual_seed(0)
    for p in model.parameters():
        if p.dtype == torch.uint8:  # random quantized values, then a sane fp16 scale at each block's start
            blocks = p.data.view(-1, BLOCKS[gguf][1])
            blocks.random_(0, 256, generator=generator)
            blocks[:, :2] = torch.full((len(blocks), 1), GGUF_SCALES[gguf], dtype=torch.float16, device=device).view(torch.uint8)
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
        model = random_model(config, device, option.get("gguf"))
        if option.get("fp8"):
            quantize_fp8(model, "fp8" if option["fp8"] is True else option["fp8"])
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
    formats = {"bf16": {}, "official FP8 (ModelOpt)": dict(modelopt=True), "GGUF Q8_0": dict(gguf="Q8_0"),
               "GGUF Q4_0": dict(gguf="Q4_0")}
    print("| variant | " + " | ".join(formats) + " |")
    print("|---" * (len(formats) + 1) + "|")
    for variant, raw in RELEASED.items():
        config = TransformerConfig(**raw)
        sizes = [computed_weights(config, option) for option in formats.values()]
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
