"""Sim-Bimanual sessions: ticks per second and latency per tick, measured on this machine for a small random
checkpoint, and what a tick costs at Cosmos3-Nano's released shape on one H200.

1. Measured, one session on this machine's CPU, fp32, a "small" random checkpoint in Sim-Bimanual's layout at
   256x256, window 8 latent frames: `--ticks` ticks of 16 random actions each, timed one by one (each tick: its
   chunk's steps, the commit of its four frames, their decode), with the process's resident memory after each (a
   soak: memory must stay flat once the window is full), and the tick latency's p50 / p99 once the window is full.
   The GPU check runs `tick_latencies` at the released shape (`gpu_check.check_session_latency`).
2. Computed, no device: FLOPs of one tick at Nano's shape, 832x480, window full (96 latent frames of history: the
   tick's denoising forwards of 4 latent frames and its four one-frame commits, each attending to the history; the
   16 action tokens a forward adds are left out, 1 % of its tokens), counted on the meta device, for two steps a
   chunk (the default) and four. The latency this implies on one H200 is given at the bf16 rate a Nano forward
   reached there (the GPU check's speed table: 1280x720x81, 1.907 s a step of two forwards) and at the dense peak.

    python benchmarks/bench_session.py [--ticks 24 --size 256]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cosmos3_runtime  # noqa: E402
from bench_causal import rss_mib  # noqa: E402
from bench_roofline import GPUS  # noqa: E402
from cosmos3_runtime import timing  # noqa: E402
from cosmos3_runtime.action import ActionRequest  # noqa: E402
from cosmos3_runtime.tiny import RELEASED, make_tiny_checkpoint, sim_bimanual_block  # noqa: E402
from cosmos3_runtime.transformer import TransformerConfig  # noqa: E402

H200_BF16 = GPUS["H200"]["bf16"]
H200_NANO_STEP = 1.907  # s a step of two forwards, Nano 1280x720x81, bf16 (the GPU check's speed table, 2026-12-04)
FPS = 30.0


def nano_rate() -> float:
    """The bf16 FLOP/s one Nano forward reached on the H200 (1280x720x81: 21 x 45 x 80 latents, 300 text tokens)."""
    config = TransformerConfig(**RELEASED["nano"])
    return timing.forward_flops(config, (21, 45, 80), 300, 0, torch.bfloat16) / (H200_NANO_STEP / 2)


def flops_per_tick(steps: int, window: int = 96, chunk: int = 4, text_tokens: int = 300) -> float:
    """One tick at Nano's shape, 832x480 (26 x 15 patches and 4 action tokens a latent frame), its history a full
    window (96 latent frames before the chunk): `steps` denoising forwards of the chunk and its four one-frame
    commits."""
    config = TransformerConfig(**RELEASED["nano"])
    rows = 26 * 15 + 4
    history = window * rows
    forward = timing.forward_flops(config, (chunk, 30, 52), text_tokens + history, 0, torch.bfloat16)
    commits = sum(timing.forward_flops(config, (1, 30, 52), text_tokens + history + f * rows, 0, torch.bfloat16)
                  for f in range(chunk))
    return steps * forward + commits


def tick_latencies(pipe, width: int, height: int, ticks: int, budget: float = float("inf"),
                   generator: torch.Generator | None = None) -> tuple[list[float], list[float]]:
    """Seconds and resident MiB after each of up to `ticks` ticks of a Sim-Bimanual session of `pipe` (16 random
    actions each, AgiBot's 29 values), a tick timed from the call to its frames in host memory (its steps, commits and
    decode); it stops early once `budget` seconds have passed."""
    generator = generator or torch.Generator().manual_seed(0)
    image = torch.rand(1, height, width, 3, generator=generator)
    action = ActionRequest(mode="forward_dynamics", image=image, domain="agibotworld")
    seconds, memory, start = [], [], time.perf_counter()
    with pipe.session("The robot folds a towel.", action=action, width=width, height=height) as s:
        while len(seconds) < ticks and time.perf_counter() - start < budget:
            begin = time.perf_counter()
            s.tick(torch.randn(16, 29, generator=generator))
            seconds.append(time.perf_counter() - begin)
            memory.append(rss_mib())
    return seconds, memory


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank `p`-th percentile."""
    ranked = sorted(values)
    return ranked[max(0, min(len(ranked) - 1, -(-len(ranked) * p // 100) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ticks", type=int, default=24)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_tiny_checkpoint(Path(tmp) / "bimanual", kind="gated", size="small", distilled=True, action=True,
                                    dtype="float32", reasoner=False, causal=sim_bimanual_block(window_frames=8))
        pipe = cosmos3_runtime.load(root, dtype="fp32")
        seconds, memory = tick_latencies(pipe, args.size, args.size, args.ticks, generator=generator)
        print(f"Sim-Bimanual session, small random checkpoint, {args.size}x{args.size}, window 8 latent frames, "
              f"{args.ticks} ticks of 16 actions (16 frames each, the decode included), fp32 CPU, "
              f"{torch.get_num_threads()} threads\n")
        print("| tick | seconds | resident MiB after it |")
        print("|---|---|---|")
        for k, (t, m) in enumerate(zip(seconds, memory)):
            print(f"| {k} | {t:.3f} | {m:.0f} |")
        full = 3  # the tick whose history first fills the window (1 + 4 * 2 latent frames)
        later = seconds[full:]
        print(f"\nonce the window is full (ticks {full}-{args.ticks - 1}): median {statistics.median(later):.3f} s a "
              f"tick, {1 / statistics.median(later):.2f} ticks/s ({16 / statistics.median(later):.1f} frames/s), "
              f"max/min {max(later) / min(later):.2f}x, p50 {percentile(later, 50):.3f} s, p99 "
              f"{percentile(later, 99):.3f} s; resident memory {memory[full]:.0f} -> {memory[-1]:.0f} MiB\n")

    rate = nano_rate()
    print(f"A Nano forward reached {rate / 1e12:.0f} TFLOP/s in bf16 on the H200 ({rate / H200_BF16:.0%} of the dense "
          f"peak). A tick makes 16 frames: {16 / FPS:.3f} s of video at {FPS:.0f} fps.")
    for steps in (2, 4):
        f = flops_per_tick(steps)
        at_rate, at_peak = f / rate, f / H200_BF16
        print(f"- Nano 832x480, window 96 full, {steps} steps a chunk: {f / 1e12:.1f} TFLOP a tick; {at_rate:.3f} s at "
              f"the measured rate ({16 / FPS / at_rate:.2f}x real time at {FPS:.0f} fps), {at_peak:.3f} s at the peak")


if __name__ == "__main__":
    main()
