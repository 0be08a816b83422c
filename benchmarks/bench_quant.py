"""GGUF types against bf16, every ratio from one run.

    python benchmarks/bench_quant.py                 # all of it: about 4 minutes and 6 GB of disk on a CPU
    python benchmarks/bench_quant.py --skip-released # only the small-config part (seconds)
    python benchmarks/bench_quant.py --dequant-only  # only part 3 (about a minute)

1. Released shapes (random bf16 weights, the converter's own files): the transformer's weight bytes per
   type against bf16, for Nano and Edge. A checkpoint of two layers at the released widths is written and
   converted; its non-layer tensors, its first layer times all but one layer and its last layer give the
   whole model (every layer has the first one's shapes, the last one without its unread text tail). Also the peak RSS
   of converting that checkpoint against
   the import baseline and its largest tensor, and of loading the file against loading the bf16 one.
2. One Gaussian linear layer per type (the error each type starts from), then the small config (tiny.py's
   "small", 6 layers): one-forward relative error against bf16 (mean and max over
   the output), the latent difference after 4 steps, and CPU seconds per step against bf16 (fp32 compute
   for both; the bf16 weights are the reference).
3. Dequantization per forward, before and after it ran in slices straight into the compute dtype: one Nano
   layer's media linears (q, k, v, out, gate, up, down at the released widths) expanded to bf16, as the whole
   weight in float32 then cast (before) and a slice at a time into bf16 (after): CPU seconds, and the peak bytes
   of the temporaries beyond the bf16 result (counted op by op on the meta device).
Not a test: numbers depend on the machine.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import cosmos3_runtime  # noqa: E402
from cosmos3_runtime.tiny import make_tiny_checkpoint  # noqa: E402
from cosmos3_runtime.weights.files import read_headers  # noqa: E402
from cosmos3_runtime.weights.gguf import GGUFFile  # noqa: E402
from cosmos3_runtime.weights.gguf_convert import WRITABLE, convert  # noqa: E402

RELEASED = {  # transformer widths of the released checkpoints (bench_memory.py has the same table)
    "nano": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                 intermediate_size=12288, vocab_size=151936, rope_axes_dim=[24, 20, 20]),
    "edge": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=9216, vocab_size=131072, rope_axes_dim=[24, 20, 20]),
}
GIB = 2**30
# VmHWM: this process image's peak RSS (ru_maxrss would carry over the forking parent's peak through exec)
PEAK = "import re, sys; print(int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]) * 1024, file=sys.stderr)"


def peak_rss(code: str) -> tuple[int, int]:
    """(peak RSS after the imports, peak RSS at the end) of `code` run in a fresh process, in bytes."""
    script = f"import sys; sys.path.insert(0, {str(ROOT)!r})\nimport torch, gguf, cosmos3_runtime, " \
             f"cosmos3_runtime.weights.gguf_convert\n{PEAK}\n{code}\n{PEAK}"
    err = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stderr
    numbers = [int(line) for line in err.split() if line.isdigit()]
    return numbers[0], numbers[-1]


def layer_bytes(entries: dict[str, int], layers: int) -> int:
    """Bytes of a whole model from a two-layer file's tensors: every layer but the last has layer 0's tensors,
    the last one (whose text tail generation never reads) layer 1's."""
    def of(prefix):
        return sum(n for name, n in entries.items() if name.startswith(prefix))

    rest = sum(n for name, n in entries.items() if not name.startswith("layers."))
    return rest + (layers - 1) * of("layers.0.") + of("layers.1.")


def released(name: str, tmp: Path) -> None:
    widths = RELEASED[name]
    layers = widths["num_hidden_layers"]
    kind = "edge" if name == "edge" else "gated"
    root = make_tiny_checkpoint(tmp / name, kind=kind, shards=1, overrides={**widths, "num_hidden_layers": 2})
    # Only what generation reads counts (the converter leaves out the LM head and the last layer's text tail).
    headers, _ = read_headers(root / "transformer")
    sizes = {}
    for qtype in WRITABLE:
        out = tmp / f"{name}-{qtype}.gguf"
        base, peak = peak_rss(f"cosmos3_runtime.weights.gguf_convert.convert({str(root)!r}, {str(out)!r}, {qtype!r})")
        file = GGUFFile(out)
        sizes[qtype] = ({t.name: int(t.n_bytes) for t in file.reader.tensors}, peak - base)
        if qtype != WRITABLE[-1]:
            out.unlink()
    kept = set(sizes[WRITABLE[0]][0])
    bf16 = {k: (e["data_offsets"][1] - e["data_offsets"][0]) for k, e in headers.items() if k in kept}
    largest = max(bf16.values())
    total = layer_bytes(bf16, layers)
    print(f"\n{name} at released widths ({layers} layers, random weights): transformer bf16 {total / GIB:.2f} GiB; "
          f"largest tensor {largest / GIB:.2f} GiB")
    print(f"{'type':8} {'GiB':>8} {'x bf16':>8} {'convert peak RSS over imports':>30}")
    for qtype, (entries, rss) in sizes.items():
        n = layer_bytes(entries, layers)
        print(f"{qtype:8} {n / GIB:8.2f} {n / total:8.3f} {rss / GIB:22.2f} GiB = {rss / largest:.2f} x largest")
    gguf_path = tmp / f"{name}-{WRITABLE[-1]}.gguf"
    load = "cosmos3_runtime.load({!r}, device='cpu', dtype='bf16', load_vae_weights=False{})"
    base_bf16, peak_bf16 = peak_rss(load.format(str(root), ""))
    base_q, peak_q = peak_rss(load.format(str(root), f", transformer_file={str(gguf_path)!r}"))
    print(f"load peak RSS over imports (two layers): bf16 {(peak_bf16 - base_bf16) / GIB:.2f} GiB, {WRITABLE[-1]} "
          f"{(peak_q - base_q) / GIB:.2f} GiB ({(peak_q - base_q) / (peak_bf16 - base_bf16):.2f}x; the BF16 "
          "embedding dominates a two-layer file)")
    shutil.rmtree(root)
    gguf_path.unlink()


def relative(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    scale = b.abs().mean()
    return ((a - b).abs().mean() / scale).item(), ((a - b).abs().max() / scale).item()


def one_forward(pipe) -> torch.Tensor:
    model = pipe.transformer
    latents = torch.randn(1, 48, 3, 12, 12, generator=torch.Generator().manual_seed(0)).to(pipe.device)
    text = model.encode_text(torch.arange(64) % model.config.vocab_size, pipe.device)
    return model(latents, torch.tensor(700.0), text).vision


def one_linear() -> None:
    """Each type's error on one Gaussian linear layer (as the gguf package quantizes it), for scale."""
    from gguf import GGMLQuantizationType, dequantize, quantize

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(1536, 512, generator=generator) / 512**0.5
    x = torch.randn(64, 512, generator=generator)
    print("\none linear layer, Gaussian weights 1536x512, relative mean error of x @ W.T:")
    for label in WRITABLE:
        kind = GGMLQuantizationType[label.upper()]
        stored = torch.from_numpy(dequantize(quantize(weight.numpy(), kind), kind).copy())
        print(f"{label:8} {relative(x @ stored.T, x @ weight.T)[0]:.4f}")


def small(tmp: Path) -> None:
    root = make_tiny_checkpoint(tmp / "small", kind="gated", size="small")
    request = dict(width=256, height=256, num_frames=9, steps=4, seed=0, output="latents", negative_prompt="blurry")
    runs = {}
    for label in ("bf16", *WRITABLE):
        file = None if label == "bf16" else tmp / f"small-{label}.gguf"
        if file is not None:
            convert(root, file, label)
        pipe = cosmos3_runtime.load(root, device="cpu", dtype="fp32", transformer_file=file)
        forward = one_forward(pipe)
        pipe.generate("a cat", **{**request, "steps": 1})  # warm-up
        start = time.perf_counter()
        latents = pipe.generate("a cat", **request).latents
        runs[label] = (forward, latents, (time.perf_counter() - start) / request["steps"])
    print("\nsmall config (6 layers, hidden 512), 256x256x9, 4 steps with CFG, fp32 compute on the CPU:")
    print(f"{'type':8} {'forward mean':>13} {'forward max':>12} {'4-step latents':>15} {'s/step':>8} {'x bf16':>7}")
    ref_forward, ref_latents, ref_time = runs["bf16"]
    for label, (forward, latents, seconds) in runs.items():
        mean, peak = relative(forward, ref_forward)
        end, _ = relative(latents, ref_latents)
        print(f"{label:8} {mean:13.4f} {peak:12.4f} {end:15.4f} {seconds:8.3f} {seconds / ref_time:7.2f}")


def dequant_per_forward() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from gguf_files import random_blocks
    from virtual_device import VirtualDevice

    from cosmos3_runtime.weights.gguf_dequant import dequantize

    c = RELEASED["nano"]
    H, I, A, K, D = (c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"],
                     c["head_dim"])
    shapes = [(A * D, H), (K * D, H), (K * D, H), (H, A * D), (I, H), (I, H), (H, I)]
    ways = {"before: float32, then cast":
            lambda raw, q, shape: dequantize(raw, q, shape, chunk_values=raw.numel() * 256).bfloat16(),
            "after: slices into bf16": lambda raw, q, shape: dequantize(raw, q, shape, torch.bfloat16)}
    print("\nDequantization of one Nano layer's media linears into bf16 (per layer per forward)")
    print(f"{'type':6} {'way':28} {'CPU seconds':>11} {'temporaries peak':>17}")
    for qtype in ("Q8_0", "Q4_0", "Q4_K", "Q6_K"):
        raws = [torch.from_numpy(random_blocks(qtype, rows, cols)) for rows, cols in shapes]
        for name, way in ways.items():
            way(raws[0], qtype, shapes[0])  # warm-up
            start = time.perf_counter()
            for raw, shape in zip(raws, shapes):
                way(raw, qtype, shape)
            seconds = time.perf_counter() - start
            peak = 0
            for raw, shape in zip(raws, shapes):
                with VirtualDevice() as virtual:
                    way(raw.to("meta"), qtype, shape)
                peak = max(peak, virtual.peak - shape[0] * shape[1] * 2)  # beyond the bf16 result
            print(f"{qtype:6} {name:28} {seconds:11.3f} {peak / GIB:14.3f} GiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-released", action="store_true", help="only the small-config measurements")
    parser.add_argument("--dequant-only", action="store_true", help="only the dequantization per forward")
    parser.add_argument("--variants", nargs="+", default=list(RELEASED), choices=list(RELEASED))
    args = parser.parse_args()
    dequant_per_forward()
    if args.dequant_only:
        return
    one_linear()
    with tempfile.TemporaryDirectory() as tmp:
        small(Path(tmp))
        if not args.skip_released:
            for name in args.variants:
                released(name, Path(tmp))
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
