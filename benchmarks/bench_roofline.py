"""What one transformer forward computes and moves at the released shapes, counted op by op on the meta device (no GPU
and no weights needed), and the floors that puts under a GPU's step time. Not a measurement: it says how far a
measured step is from the hardware and the most each kind of change can save.

Each aten op of the forward is counted: FLOPs of the matmuls (2 M N K), of the attention (4 Nq Nk heads head_dim,
counted at the call: SDPA's kernels never hold the scores), and bytes read and written (every tensor the op takes
and makes; views move nothing). Three classes: linears, attention, and the rest (norms in fp32 and back, RoPE, SiLU
or relu², adds, the K/V concatenation, casts). Eager runs every op as its own kernel: the rest's bytes are real
traffic. A compiled block folds that work into the kernels around the matmuls (torch.compile's fused kernels); its
floor counts the matmuls' and attention's own bytes only. FP8 (official W8A8): the linears at the fp8 rate, their
weights and inputs in one byte a value.

    python benchmarks/bench_roofline.py                          # Nano, 832x480x189, a 300-token prompt, an H200
    python benchmarks/bench_roofline.py --variant edge --size 832x480x121
"""

import argparse
import sys
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cosmos3_runtime import devices, transformer as transformer_module  # noqa: E402
from cosmos3_runtime.devices import DeviceFacts  # noqa: E402
from cosmos3_runtime.geometry import latent_frames, latent_size  # noqa: E402
from cosmos3_runtime.tiny import RELEASED  # noqa: E402
from cosmos3_runtime.transformer import Cosmos3Transformer, TransformerConfig  # noqa: E402
from measure import BytesMoved  # noqa: E402

aten = torch.ops.aten
# Peak dense rates and memory bandwidth from the vendor's data sheets (SXM parts).
GPUS = {"H200": dict(bf16=989e12, fp8=1979e12, bandwidth=4.8e12), "B200": dict(bf16=2250e12, fp8=4500e12,
                                                                                bandwidth=8.0e12)}


class Counts(BytesMoved):
    """Bytes per aten op (`BytesMoved`), the linears' FLOPs and weight bytes, and the attention counted at its calls."""

    def __init__(self):
        super().__init__()
        self.flops = defaultdict(float)
        self.attention_bytes = 0.0
        self.weight_bytes = 0.0  # the linears' weights: what FP8 halves besides the activations

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is aten.linear.default:
            x, weight = args[0], args[1]
            self.flops["linears"] += 2 * x.numel() // x.shape[-1] * weight.shape[0] * weight.shape[1]
            self.weight_bytes += weight.numel() * weight.element_size()
        return super().__torch_dispatch__(func, types, args, kwargs)

    @property
    def bytes(self) -> dict[str, float]:
        linears = self.by_op.get("linear", [0, 0])[1]
        rest = sum(moved for op, (_, moved) in self.by_op.items() if op != "linear")
        return {"linears": linears, "attention": self.attention_bytes, "the rest": rest}

    def rest_by_op(self) -> list[tuple[str, int]]:
        """The rest's ops, most bytes first: where eager traffic goes."""
        return sorted(((op, moved) for op, (_, moved) in self.by_op.items() if op != "linear"), key=lambda i: -i[1])

    def attention(self, q, k, v, out) -> None:
        """An SDPA call, q [1, A, Nq, D] and k/v [1, K, Nk, D]: read once, written once."""
        _, heads, nq, d = q.shape
        self.flops["attention"] += 4 * nq * k.shape[-2] * heads * d
        self.attention_bytes += sum(t.numel() * t.element_size() for t in (q, k, v, out))


@contextmanager
def counted_attention(counts: Counts):
    """SDPA on the meta device would decompose into the math kernel's score matrices: counted at the call instead, its
    output made empty."""
    real = F.scaled_dot_product_attention

    def sdpa(q, k, v, *args, **kwargs):
        out = torch.empty_like(q)
        counts.attention(q, k, v, out)
        return out

    transformer_module.F.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        transformer_module.F.scaled_dot_product_attention = real


def count_forward(variant: str, width: int, height: int, frames: int, text_tokens: int) -> tuple[Counts, int]:
    """One media forward of the released `variant` (bf16) at this size, after a prompt of `text_tokens`, taking the
    branches it takes on a Hopper GPU (grouped K/V into SDPA's flash kernel, not expanded to the query heads)."""
    config = TransformerConfig(**RELEASED[variant])
    meta = torch.device("meta")
    with meta:
        model = Cosmos3Transformer(config).to(torch.bfloat16)
    h, w = latent_size(height, width)
    latents = torch.empty(1, config.latent_channel, latent_frames(frames), h, w, device=meta)
    counts = Counts()
    with torch.inference_mode(), devices.answering_as(meta, DeviceFacts("cuda", (9, 0))):
        text = model.encode_text(torch.zeros(text_tokens, dtype=torch.long), meta)
        with counted_attention(counts), counts:
            model(latents, torch.tensor(900), text)
    tokens = latent_frames(frames) * -(-h // 2) * -(-w // 2)
    return counts, tokens


def floors(counts: Counts, gpu: dict) -> dict[str, float]:
    """Seconds a forward cannot go below on `gpu`, each class at the slower of its compute and its bytes."""

    def seconds(flops, moved, rate):
        return max(flops / rate, moved / gpu["bandwidth"])

    linears = seconds(counts.flops["linears"], counts.bytes["linears"], gpu["bf16"])
    attention = seconds(counts.flops["attention"], counts.bytes["attention"], gpu["bf16"])
    rest = counts.bytes["the rest"] / gpu["bandwidth"]
    # W8A8: fp8 matmuls at twice the rate, weights and inputs in one byte (the outputs stay bf16)
    fp8_linears = seconds(counts.flops["linears"], counts.bytes["linears"] - counts.weight_bytes / 2, gpu["fp8"])
    return {"eager": linears + attention + rest, "compiled": linears + attention, "the rest": rest,
            "linears": linears, "attention": attention, "compiled, fp8 linears": fp8_linears + attention}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=("nano", "edge", "super"), default="nano")
    parser.add_argument("--size", default="832x480x189", help="WIDTHxHEIGHTxFRAMES")
    parser.add_argument("--text", type=int, default=300, help="prompt tokens")
    parser.add_argument("--gpu", choices=sorted(GPUS), default="H200")
    parser.add_argument("--steps", type=int, default=35)
    args = parser.parse_args()
    width, height, frames = (int(v) for v in args.size.split("x"))
    counts, tokens = count_forward(args.variant, width, height, frames, args.text)
    gpu = GPUS[args.gpu]
    print(f"{args.variant}, {width}x{height}x{frames}: {tokens} media tokens after {args.text} text tokens, one forward")
    for name in ("linears", "attention", "the rest"):
        print(f"  {name:9s}: {counts.flops[name] / 1e12:8.1f} TFLOP  {counts.bytes[name] / 1e9:8.1f} GB")
    biggest = counts.rest_by_op()[:8]
    print("  the rest by op: " + ", ".join(f"{op} {moved / 1e9:.0f} GB" for op, moved in biggest))
    f = floors(counts, gpu)
    print(f"floors on an {args.gpu} (peak rates: bf16 {gpu['bf16'] / 1e12:.0f} TFLOP/s, fp8 {gpu['fp8'] / 1e12:.0f}, "
          f"{gpu['bandwidth'] / 1e12:.1f} TB/s), per forward:")
    print(f"  linears {f['linears']:.3f} s, attention {f['attention']:.3f} s, the rest's bytes {f['the rest']:.3f} s")
    for name in ("eager", "compiled", "compiled, fp8 linears"):
        print(f"  {name:22s}: {f[name]:.3f} s a forward, {2 * args.steps * f[name]:6.1f} s for {args.steps} steps "
              "with CFG (two forwards a step), before the VAE decode")


if __name__ == "__main__":
    main()
