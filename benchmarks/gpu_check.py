"""The project's GPU check: the CUDA code paths on a tiny checkpoint, then the memory benchmark at released shapes.

    python benchmarks/gpu_check.py            # needs a CUDA device; about two minutes on an H100-class GPU

Checks (each prints PASS or FAIL with its figure): bf16 generation on the GPU close to fp32 on the CPU;
offload_text and blocks_to_swap bit-identical to the default on the GPU (side-stream prefetch with
pinned memory); fp8 weights run and stay close; the text tower and swapped layers are off the GPU
after a run. Then `bench_memory.py --measure` for Edge (and Nano when the GPU has room).
"""

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import cosmos3_runtime  # noqa: E402
from cosmos3_runtime.tiny import make_tiny_checkpoint  # noqa: E402

REQUEST = dict(width=128, height=96, num_frames=9, steps=4, seed=3, output="latents", negative_prompt="blurry")


def check(name: str, ok: bool, figure: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {figure}")
    return ok


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
        fp8 = cosmos3_runtime.load(root, device="cuda", dtype="bf16", quantize="fp8").generate("a cat", **REQUEST).latents
        error = (fp8 - base).abs().mean().item() / base.abs().mean().item()
        results.append(check("fp8 weights", error < 0.1, f"relative mean difference to bf16 {error:.4f}"))
    bench = [sys.executable, str(ROOT / "benchmarks" / "bench_memory.py"), "--measure"]
    subprocess.run(bench + ["--variant", "edge"], check=False)
    if torch.cuda.get_device_properties(0).total_memory > 80 * 2**30:
        subprocess.run(bench + ["--variant", "nano"], check=False)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
