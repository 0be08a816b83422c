"""Causal rollouts: time and memory per chunk of a 20-chunk rollout, next to today's long video making the same
frames, and what a chunk costs at Cosmos3-Nano's released shape.

1. Measured, one run each on this machine's CPU, fp32, a "small" random checkpoint at 256x256: a framewise Sim-Transfer
   rollout (one latent frame a chunk, a window of 8 latent frames with 1 sink) of 20 chunks after latent frame 0, timed
   per chunk (from the "chunk" progress events), with the process's resident memory after each; a chunkwise one
   (4 latent frames a chunk, all history) over as many frames for comparison; and the same frames made by the
   bidirectional model as a long video (chunks of 17 frames, 1 latent frame of overlap: it decodes and re-encodes
   between chunks) on the same weights, 4 steps a chunk, as fair a pair as the two models allow.
2. Computed, no device: FLOPs of one chunk at Nano's released shape, 832x480, window full (the four denoising forwards
   over [text | history | control chunk | itself] and the commits), counted on the meta device, and the real-time
   factor that implies on one H200 at its dense bf16 peak (989 TFLOP/s; a real run reaches a fraction of it).
3. Counted, no device: the bytes one such chunk copies (`cat` and `copy_`, read and written) with 150 latent frames of
   history held on the device, and how much of that the history adds to an empty one: attention reads the held keys
   and values where they are, so the history adds nothing (its frame index on the host aside); what `copy_` copies is
   the chunk's own K/V rows written into the cache, what `cat` copies RoPE's rotation.

    python benchmarks/bench_causal.py [--chunks 20 --size 256]
"""

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cosmos3_runtime  # noqa: E402
from cosmos3_runtime import devices, timing  # noqa: E402
from cosmos3_runtime.devices import DeviceFacts  # noqa: E402
from cosmos3_runtime.tiny import RELEASED, make_tiny_checkpoint, sim_transfer_block  # noqa: E402
from cosmos3_runtime.transformer import Cosmos3Transformer, MediaKV, TransformerConfig  # noqa: E402
from bench_roofline import Counts, counted_attention  # noqa: E402

H200_BF16 = 989e12  # dense bf16 FLOP/s, NVIDIA's H200 datasheet


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed_chunks(pipe, frames: int, size: int, **options) -> tuple[list[float], list[float], float]:
    """Seconds and resident MiB (as it starts) per chunk, and the whole run's seconds (with the clip's decode)."""
    clip = torch.rand(frames, size, size, 3, generator=torch.Generator().manual_seed(0))
    stamps, memory, last_step = [], [], []

    def progress(stage, done, total):
        if stage == "chunk":
            stamps.append(time.perf_counter())
            memory.append(rss_mib())

    start = time.perf_counter()
    pipe.generate("a robot arm stacks cubes", control_videos={"edge": clip}, width=size, height=size, seed=0,
                  progress=progress, callback=lambda *a: last_step.append(time.perf_counter()), output="frames",
                  **options)
    end = time.perf_counter()
    stamps.append(last_step[-1])  # the last chunk ends at its last step (it commits nothing); the clip's decode follows
    return [b - a for a, b in zip(stamps, stamps[1:])], memory, end - start


def flops_per_chunk(window: int, chunk: int, text_tokens: int = 300) -> float:
    """One chunk at Nano's shape, 832x480 (26 x 15 patches a latent frame), its history a full window of control and
    RGB frames: four denoising forwards of `chunk` frames over the history, the control commit and the frame commits.
    The history's keys and values count as extra text rows (the same attention cost)."""
    config = TransformerConfig(**RELEASED["nano"])
    tokens = 26 * 15
    history = 2 * (window - chunk) * tokens
    forward = timing.forward_flops(config, (chunk, 30, 52), text_tokens + history, 0, torch.bfloat16)
    control = forward  # the control chunk's commit: the same shape, attending to the same history
    commits = chunk * timing.forward_flops(config, (1, 30, 52), text_tokens + history + chunk * tokens, 0,
                                           torch.bfloat16)
    return 4 * forward + control + commits


COPY_OPS = ("cat", "copy_")


def copied_bytes_per_chunk(variant: str, chunk: int, held_frames: int, text_tokens: int = 300) -> dict[str, int]:
    """The bytes a chunk at 832x480 copies (`COPY_OPS`, read and written: `BytesMoved`) with `held_frames` latent
    frames of Sim-Transfer history (control and RGB rows) held on the device, counted on the meta device in bf16: the
    control commit, four denoising forwards and a commit a frame, as `flops_per_chunk` counts them; the prompt's text
    K/V already placed (once per prompt)."""
    config = TransformerConfig(**RELEASED[variant])
    meta = torch.device("meta")
    devices.remember(meta, DeviceFacts("cuda", (9, 0)))
    with meta:
        model = Cosmos3Transformer(config).to(torch.bfloat16)
    tokens = 26 * 15
    cache = MediaKV(config, (2 * held_frames + 2 * chunk) * tokens, torch.bfloat16, meta)
    cache.frames = torch.arange(2 * held_frames).repeat_interleave(tokens)
    counts = Counts()

    def forward(frames: int, start: int, keep: bool) -> None:
        latents = torch.empty(1, config.latent_channel, frames, 30, 52, device=meta)
        model(latents, torch.tensor(900), text, None, hooks=replace(model.hooks, cache=cache, start_frame=start))
        if keep:
            cache.append()

    with torch.inference_mode(), counted_attention(counts):
        text = model.encode_text(torch.zeros(text_tokens, dtype=torch.long), meta)
        forward(chunk, 2 * held_frames, False)  # the prompt's first forward places its text K/V
        with counts:
            forward(chunk, 2 * held_frames, True)  # the control chunk's commit
            for _ in range(4):
                forward(chunk, 2 * held_frames + chunk, False)
            for f in range(chunk):
                forward(1, 2 * held_frames + chunk + f, True)
    return {op: counts.by_op.get(op, [0, 0])[1] for op in COPY_OPS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--size", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    frames = 1 + 4 * args.chunks  # latent frame 0, then one latent frame (4 frames) a chunk
    with tempfile.TemporaryDirectory() as tmp:
        common = dict(kind="gated", size="small", distilled=True, dtype="float32", reasoner=False)
        framewise = cosmos3_runtime.load(make_tiny_checkpoint(Path(tmp) / "fw", **common, causal=sim_transfer_block(
            1, window_frames=8, sink_frames=1)), dtype="fp32")
        chunkwise = cosmos3_runtime.load(make_tiny_checkpoint(Path(tmp) / "cw", **common, causal=sim_transfer_block()),
                                         dtype="fp32")
        plain = cosmos3_runtime.load(make_tiny_checkpoint(Path(tmp) / "plain", **common), dtype="fp32")

        timed_chunks(framewise, 9, args.size)  # warm-up
        seconds, memory, total = timed_chunks(framewise, frames, args.size)
        print(f"Framewise Sim-Transfer rollout, {args.size}x{args.size}, {frames} frames: chunk 0 then {args.chunks} "
              f"chunks of 1 latent frame, window 8 (1 sink), fp32 CPU, {torch.get_num_threads()} threads\n")
        print("| chunk | seconds | resident MiB as it starts |")
        print("|---|---|---|")
        for k, (s, m) in enumerate(zip(seconds, memory)):
            print(f"| {k} | {s:.3f} | {m:.0f} |")
        full = min(8, args.chunks)  # the chunk whose history first fills the window
        print(f"\nonce the window is full (chunks {full}-{args.chunks}): max/min time per chunk "
              f"{max(seconds[full:]) / min(seconds[full:]):.2f}x, median {statistics.median(seconds[full:]):.3f} s; "
              f"resident memory {memory[full]:.0f} -> {memory[-1]:.0f} MiB; whole run {total:.1f} s")

        cw_seconds, cw_memory, cw_total = timed_chunks(chunkwise, frames, args.size)
        print(f"chunkwise rollout (4 latent frames a chunk, all history) of the same {frames} frames: "
              f"{len(cw_seconds)} chunks, first/last chunk of 4 {cw_seconds[1]:.3f} / {cw_seconds[-1]:.3f} s, "
              f"whole run {cw_total:.1f} s, resident {cw_memory[-1]:.0f} MiB")

        start = time.perf_counter()
        plain.generate("a robot arm stacks cubes", width=args.size, height=args.size, num_frames=frames,
                       chunk_frames=17, chunk_overlap_frames=1, seed=0, output="frames")
        long_total = time.perf_counter() - start
        print(f"today's long video, the bidirectional model on the same weights: {frames} frames in chunks of 17 "
              f"(overlap 1, 4 steps): {long_total:.1f} s; framewise rollout / long video {total / long_total:.2f}x, "
              f"chunkwise rollout / long video {cw_total / long_total:.2f}x\n")

    for window, chunk, what in ((8, 1, "framewise, window 8"), (151, 4, "chunkwise, 151 latent frames of history")):
        f = flops_per_chunk(window, chunk)
        seconds = f / H200_BF16
        clip_seconds = 4 * chunk / 30  # 4 frames a latent frame at 30 fps
        print(f"Nano at 832x480, {what}: {f / 1e12:.1f} TFLOP a chunk of {chunk} latent frame(s) = {4 * chunk} "
              f"frames; at the H200's dense bf16 peak {seconds * 1e3:.0f} ms, {clip_seconds / seconds:.2f}x real time "
              f"at 30 fps (an upper bound: real runs reach a fraction of the peak)")
    for chunk, what in ((4, "chunkwise"), (1, "framewise")):
        held, empty = copied_bytes_per_chunk("nano", chunk, 150), copied_bytes_per_chunk("nano", chunk, 0)
        print(f"Nano at 832x480, {what}, 150 latent frames of history held on the device: copied a chunk (read and "
              f"written) cat {held['cat'] / 1e9:.2f} GB, copy_ {held['copy_'] / 1e9:.2f} GB; the history adds "
              f"{(sum(held.values()) - sum(empty.values())) / 1e9:.3f} GB to an empty one's")


if __name__ == "__main__":
    main()
