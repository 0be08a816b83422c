"""The project's GPU check: the CUDA code paths on a tiny checkpoint, then speed and memory at released shapes.

    python benchmarks/gpu_check.py            # needs a CUDA device; about five minutes on an H200-class GPU

Checks (each prints PASS or FAIL with its figure): bf16 generation on the GPU close to fp32 on the CPU;
offload_text and blocks_to_swap bit-identical to the default on the GPU (side-stream prefetch with
pinned memory); fp8 and GGUF (Q8_0, Q4_0 files from the converter) weights run and stay close, GGUF with
block swap bit-identical to GGUF alone, and GGUF layers left in CPU memory (as ComfyUI's memory manager
leaves what does not fit) running from there; the text tower and swapped layers are off the GPU after a run;
a two-control transfer over two chunks in bf16 close to fp32 on the CPU; the Reasoner (an image and a question,
both families) in bf16 on the GPU against fp32 on the CPU: the same first tokens, last-step logits close.
Then one speed table from `bench_memory.py --measure` (random weights in the released shapes): Edge
832x480x81 with CFG, seconds per step (and for 35 steps) and peak VRAM for bf16, fp8, Q8_0, Q4_0,
offload_text and blocks_to_swap; Nano at its default size with fp8 and Q4_0 when the GPU has room. What
could not run is printed with the reason.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import cosmos3_runtime  # noqa: E402
from cosmos3_runtime.gguf_convert import convert  # noqa: E402
from cosmos3_runtime.gguf_weights import GGUFLinear  # noqa: E402
from cosmos3_runtime.quantize import Fp8Linear  # noqa: E402
from cosmos3_runtime.tiny import make_tiny_checkpoint  # noqa: E402

REQUEST = dict(width=128, height=96, num_frames=9, steps=4, seed=3, output="latents", negative_prompt="blurry")


def check(name: str, ok: bool, figure: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {figure}")
    return ok


def check_transfer(folder: Path) -> bool:
    """A two-chunk transfer with two controls (three passes a step) in bf16 on the GPU against fp32 on the CPU."""
    root = make_tiny_checkpoint(folder, kind="gated", size="small")
    controls = {"edge": torch.rand(9, 96, 128, 3), "depth": torch.rand(9, 96, 128, 3)}
    options = dict(width=128, height=96, steps=4, seed=3, chunk_frames=5, control_videos=controls, guidance_scale=3.0)
    cpu = cosmos3_runtime.load(root, device="cpu", dtype="fp32").generate("a cat", **options).frames
    torch.cuda.reset_peak_memory_stats()
    gpu = cosmos3_runtime.load(root, device="cuda", dtype="bf16").generate("a cat", **options).frames
    error = (gpu - cpu).abs().mean().item()
    return check("transfer, two controls over two chunks, bf16 on the GPU vs fp32 on the CPU", error < 0.05,
                 f"mean abs difference of the frames {error:.4f}, peak VRAM {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")  # fmt: skip


def check_reasoner(folder: Path) -> list[bool]:
    """Greedy answers about one image, bf16 on the GPU against fp32 on the CPU, for both families."""
    import numpy as np

    image = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    results = []
    for kind in ("gated", "edge"):
        root = make_tiny_checkpoint(folder / f"reasoner-{kind}", kind=kind, size="small")
        ask = dict(images=[image], max_new_tokens=8, temperature=0.0, keep_logits=True)
        cpu = cosmos3_runtime.load(root, device="cpu", dtype="fp32", parts="reasoner").reason("What is this?", **ask)
        torch.cuda.reset_peak_memory_stats()
        gpu = cosmos3_runtime.load(root, device="cuda", dtype="bf16", parts="reasoner").reason("What is this?", **ask)
        same = next((i for i, (a, b) in enumerate(zip(cpu.token_ids, gpu.token_ids)) if a != b), len(gpu.token_ids))
        error = (gpu.logits[0] - cpu.logits[0]).abs().max().item() / cpu.logits[0].abs().max().item()
        results.append(check(f"Reasoner ({kind}) bf16 on the GPU vs fp32 on the CPU", same >= 1 and error < 0.05,
                             f"first {same} of 8 tokens equal, first-step logits relative max difference {error:.4f}, "
                             f"{gpu.prefill_seconds * 1000:.0f} ms prefill, {len(gpu.token_ids) / gpu.decode_seconds:.0f} "
                             f"tokens/s, peak VRAM {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"))  # fmt: skip
    return results


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = make_tiny_checkpoint(tmp, kind="edge", size="small")
        cpu = cosmos3_runtime.load(root, device="cpu", dtype="fp32").generate("a cat", **REQUEST).latents
        gpu = cosmos3_runtime.load(root, device="cuda", dtype="bf16")
        base = gpu.generate("a cat", **REQUEST).latents
        error = (base - cpu).abs().mean().item() / cpu.abs().mean().item()
        results.append(check("bf16 on the GPU vs fp32 on the CPU", error < 0.05, f"relative mean difference {error:.4f}"))
        for options in (dict(offload_text=True), dict(blocks_to_swap=3), dict(offload_text=True, blocks_to_swap=6)):
            pipe = cosmos3_runtime.load(root, device="cuda", dtype="bf16", **options)
            same = torch.equal(pipe.generate("a cat", **REQUEST).latents, base)
            held = [p for part in (pipe.text_offload, pipe.block_swap) if part is not None for p in part.held()]
            off = all(p.device.type == "cpu" for p in held)
            results.append(check(f"{options} bit-identical, offloaded parts in CPU memory", same and off,
                                 f"identical={same}, {len(held)} offloaded tensors on the CPU={off}"))  # fmt: skip
        fp8_pipe = cosmos3_runtime.load(root, device="cuda", dtype="bf16", quantize="fp8")
        fp8 = fp8_pipe.generate("a cat", **REQUEST).latents
        error = (fp8 - base).abs().mean().item() / base.abs().mean().item()
        results.append(check("fp8 weights", error < 0.1, f"relative mean difference to bf16 {error:.4f}"))
        for m in [m for m in fp8_pipe.transformer.modules() if isinstance(m, Fp8Linear)][::2]:
            m.weight.data, m.scale.data = m.weight.data.cpu(), m.scale.data.cpu()
        same = torch.equal(fp8_pipe.generate("a cat", **REQUEST).latents, fp8)
        results.append(check("fp8 layers left in CPU memory run from there", same, f"bit-identical={same}"))
        for qtype, bound in (("q8_0", 0.05), ("q4_0", 0.4)):
            path = Path(tmp) / f"{qtype}.gguf"
            convert(root, path, qtype)
            quantized = cosmos3_runtime.load(root, device="cuda", dtype="bf16", transformer_file=path)
            latents = quantized.generate("a cat", **REQUEST).latents
            swapped = cosmos3_runtime.load(root, device="cuda", dtype="bf16", transformer_file=path, blocks_to_swap=3)
            same = torch.equal(swapped.generate("a cat", **REQUEST).latents, latents)
            error = (latents - base).abs().mean().item() / base.abs().mean().item()
            results.append(check(f"GGUF {qtype} on the GPU (and with 3 blocks swapped)", error < bound and same,
                                 f"relative mean difference to bf16 {error:.4f}, swap bit-identical={same}"))  # fmt: skip
            left = [m for m in quantized.transformer.modules() if isinstance(m, GGUFLinear)][::2]
            for m in left:  # as ComfyUI's memory manager leaves layers it cannot fit: in CPU memory
                m.weight.data = m.weight.data.cpu()
            same = torch.equal(quantized.generate("a cat", **REQUEST).latents, latents)
            results.append(check(f"GGUF {qtype} layers left in CPU memory run from there", same,
                                 f"{len(left)} layers on the CPU, bit-identical={same}"))  # fmt: skip
        results.append(check_transfer(Path(tmp) / "gated"))
        results += check_reasoner(Path(tmp))
    bench = [sys.executable, str(ROOT / "benchmarks" / "bench_memory.py"), "--measure", "--no-table", "--steps", "2"]
    runs = [("edge", ["--size", "832x480x81", "--options", "default", "fp8", "gguf Q8_0", "gguf Q4_0", "offload_text",
                      "blocks_to_swap=8"])]  # fmt: skip
    if torch.cuda.get_device_properties(0).total_memory > 80 * 2**30:
        runs.append(("nano", ["--options", "fp8", "gguf Q4_0"]))
    else:
        print("not run: Nano at 1280x720x81 (needs a GPU with more than 80 GiB)")
    for variant, extra in runs:
        done = subprocess.run(bench + ["--variant", variant, *extra], check=False, timeout=240)
        if done.returncode != 0:
            print(f"not run: the {variant} speed table (bench_memory.py exited with {done.returncode}; see above)")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
