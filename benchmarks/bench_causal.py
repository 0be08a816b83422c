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
3. Counted, no device (`--counted` prints only this, with 4): per chunk at Nano's 480p shape, chunkwise at the
   601-frame horizon, framewise with its window full and a Sim-Bimanual tick, the FLOPs, bytes moved (weights,
   attention with its K/V reads, the rest) and the floor that puts on an H200 (`bench_roofline.GPUS`) with and
   without W8A8 linears and FP8 attention, against 16 fps and the 0.53 s tick.
5. Measured on the CPU (`--fp8-attention` prints only this): FP8 attention's error (`fp8_attention_errors`).
4. Counted, no device: the bytes one such chunk copies (`cat` and `copy_`, read and written) with 150 latent frames of
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
from cosmos3_runtime.tiny import vae_config  # noqa: E402
from cosmos3_runtime.vae import VAEConfig  # noqa: E402
from bench_roofline import GPUS, Counts, counted_attention  # noqa: E402



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
TOKENS = 26 * 15  # a latent frame's patches at 832x480


class ChunkCounts(Counts):
    """`Counts` with the attention's outputs apart: FP8 attention reads its queries, keys and values in one byte."""

    def __init__(self):
        super().__init__()
        self.attention_out_bytes = 0.0

    def attention(self, q, k, v, out) -> None:
        super().attention(q, k, v, out)
        self.attention_out_bytes += out.numel() * out.element_size()


def count_chunk(variant: str, chunk: int, held_frames: int, steps: int = 4, controls: bool = True,
                text_tokens: int = 300) -> ChunkCounts:
    """What one chunk at 832x480 computes and moves, counted op by op on the meta device in bf16 (Hopper's branches:
    grouped K/V into flash attention) with `held_frames` latent frames of history held on the device (control and RGB
    frames counted apart): the control commit (`controls`), `steps` denoising forwards and a commit a frame; the
    prompt's text K/V already placed (once per prompt). Sim-Bimanual's 4 action tokens a frame are left out (1 % of
    its rows)."""
    config = TransformerConfig(**RELEASED[variant])
    meta = torch.device("meta")
    with meta:
        model = Cosmos3Transformer(config).to(torch.bfloat16)
    cache = MediaKV(config, (held_frames + (1 + controls) * chunk) * TOKENS, torch.bfloat16, meta)
    cache.frames = torch.arange(held_frames).repeat_interleave(TOKENS)
    counts = ChunkCounts()

    def forward(frames: int, start: int, keep: bool) -> None:
        latents = torch.empty(1, config.latent_channel, frames, 30, 52, device=meta)
        model(latents, torch.tensor(900), text, None, hooks=replace(model.hooks, cache=cache, start_frame=start))
        if keep:
            cache.append()

    with torch.inference_mode(), counted_attention(counts), devices.answering_as(meta, DeviceFacts("cuda", (9, 0))):
        text = model.encode_text(torch.zeros(text_tokens, dtype=torch.long), meta)
        forward(chunk, held_frames, False)  # the prompt's first forward places its text K/V
        with counts:
            if controls:
                forward(chunk, held_frames, True)
            for _ in range(steps):
                forward(chunk, held_frames + controls * chunk, False)
            for f in range(chunk):
                forward(1, held_frames + controls * chunk + f, True)
    return counts


def copied_bytes_per_chunk(variant: str, chunk: int, held_frames: int, text_tokens: int = 300) -> dict[str, int]:
    """The bytes a Sim-Transfer chunk copies (`COPY_OPS`, read and written: `BytesMoved`) with `held_frames` latent
    frames of history (control and RGB rows) held on the device (`count_chunk`)."""
    counts = count_chunk(variant, chunk, 2 * held_frames, text_tokens=text_tokens)
    return {op: counts.by_op.get(op, [0, 0])[1] for op in COPY_OPS}


# (name, chunk latent frames, latent frames of history held, steps, control commits, frames the chunk makes, target)
REAL_TIME = (
    ("Sim-Transfer chunkwise, 601-frame horizon (150 latent frames held)", 4, 2 * 150, 4, True, 16, "16 fps"),
    ("Sim-Transfer framewise, window full (29 held: window 30, 3 sinks)", 1, 2 * 29, 4, True, 4, "16 fps"),
    ("Sim-Bimanual tick, window full (96 held)", 4, 96, 2, False, 16, "0.53 s tick"),
)


def chunk_floor(counts: ChunkCounts, decode: float, w8a8: bool, fp8_attention: bool) -> float:
    """Seconds one chunk cannot go below on an H200 (`GPUS`): linears and attention each at the slower of their FLOPs
    at the peak rate and their bytes at the bandwidth, the rest's bytes (norms, RoPE, copies: eager traffic), and the
    VAE decode's FLOPs at the bf16 rate (a second stream hides its latency, not its work: the GPU is shared). W8A8:
    the linears at the fp8 rate, weights and inputs in one byte; FP8 attention: the attention at the fp8 rate, its
    queries, keys and values in one byte."""
    gpu = GPUS["H200"]
    linear_bytes = counts.bytes["linears"] - (counts.weight_bytes / 2 if w8a8 else 0)
    linears = max(counts.flops["linears"] / gpu["fp8" if w8a8 else "bf16"], linear_bytes / gpu["bandwidth"])
    qkv = counts.attention_bytes - counts.attention_out_bytes
    attention_bytes = qkv / 2 + counts.attention_out_bytes if fp8_attention else counts.attention_bytes
    attention = max(counts.flops["attention"] / gpu["fp8" if fp8_attention else "bf16"], attention_bytes / gpu["bandwidth"])
    return linears + attention + counts.bytes["the rest"] / gpu["bandwidth"] + decode / gpu["bf16"]


def real_time_table() -> None:
    """Per chunk at Nano's released 480p shape: FLOPs, bytes moved, the H200 floor and the fps (or tick) it allows,
    bf16, with W8A8 linears, with FP8 attention and with both. Counted, not measured."""
    vae = VAEConfig.from_dict(vae_config(base_dim=160, decoder_base_dim=256))
    print("| chunk (Nano, 832x480, bf16) | TFLOP (transformer + VAE decode) | GB moved: weights / attention (K/V read) / "
          "the rest | H200 floor bf16 → W8A8 → FP8 attention → both | ceiling bf16 → both | target |")
    print("|---|---|---|---|---|---|")
    for name, chunk, held, steps, controls, frames, target in REAL_TIME:
        counts = count_chunk("nano", chunk, held, steps, controls)
        # a later piece of the clip's decode: its latent frames after the first (which makes one frame)
        decode = timing.decode_flops(vae, 1 + chunk, 30, 52, torch.bfloat16) - timing.decode_flops(vae, 1, 30, 52,
                                                                                                     torch.bfloat16)
        floors = [chunk_floor(counts, decode, w8a8, fp8) for w8a8, fp8 in
                  ((False, False), (True, False), (False, True), (True, True))]
        flops = counts.flops["linears"] + counts.flops["attention"]

        def ceiling(seconds):
            return f"{seconds:.2f} s a tick" if "tick" in target else f"{frames / seconds:.1f} fps"

        print(f"| {name}: {frames} frames | {flops / 1e12:.0f} + {decode / 1e12:.0f} | "
              f"{counts.weight_bytes / 1e9:.0f} / {counts.attention_bytes / 1e9:.0f} / {counts.bytes['the rest'] / 1e9:.0f} | "
              f"{' → '.join(f'{f * 1e3:.0f}' for f in floors)} ms | {ceiling(floors[0])} → {ceiling(floors[-1])} | "
              f"{target} |")


def fp8_attention_errors(seed: int = 0) -> dict[str, float]:
    """FP8 attention's error (`causal_attention="fp8"`), measured on this machine's CPU: relative mean difference
    against full attention (a) of the latents of a chunkwise Sim-Transfer rollout (33 frames, tiny random checkpoint,
    fp32 and bf16; bf16 against fp32 beside it for scale) and (b) of one Nano media layer at the released shape with
    random weights in bf16: a framewise chunk (390 tokens) over a 300-token prompt and a full window's history (58
    latent frames, control and RGB), its keys RMS-normed as the layer's own, values unit normal."""
    from cosmos3_runtime.causal_run import fp8_attention
    from cosmos3_runtime.transformer import DecoderLayer

    def relative(x, reference):
        return ((x.float() - reference.float()).abs().mean() / reference.float().abs().mean()).item()

    errors = {}
    clip = torch.rand(33, 32, 48, 3, generator=torch.Generator().manual_seed(seed))
    with tempfile.TemporaryDirectory() as tmp:
        root = make_tiny_checkpoint(Path(tmp) / "cw", kind="gated", distilled=True, dtype="float32", reasoner=False,
                                    causal=sim_transfer_block())
        latents = {}
        for dtype in ("fp32", "bf16"):
            pipe = cosmos3_runtime.load(root, dtype=dtype)
            for attention in ("full", "fp8"):
                latents[dtype, attention] = pipe.generate("a robot arm stacks cubes", control_videos={"edge": clip},
                                                          width=48, height=32, seed=3,
                                                          causal_attention=attention).latents
    for dtype in ("fp32", "bf16"):
        errors[f"tiny rollout latents, {dtype}: FP8 attention against full"] = relative(latents[dtype, "fp8"], latents[dtype, "full"])
    errors["tiny rollout latents, full attention: bf16 against fp32 (for scale)"] = relative(latents["bf16", "full"],
                                                                                  latents["fp32", "full"])
    config = TransformerConfig(**RELEASED["nano"])
    g = torch.Generator().manual_seed(seed)
    layer = DecoderLayer(config, text_output=False).to(torch.bfloat16)
    K, D, rows = config.num_key_value_heads, config.head_dim, 300 + 2 * 29 * TOKENS
    x = torch.randn(TOKENS, config.hidden_size, generator=g).to(torch.bfloat16)
    keys = torch.randn(rows, K, D, generator=g)
    keys = (keys * torch.rsqrt(keys.pow(2).mean(-1, keepdim=True))).to(torch.bfloat16)
    values = torch.randn(rows, K, D, generator=g).to(torch.bfloat16)
    cos, sin = torch.ones(TOKENS, D, dtype=torch.bfloat16), torch.zeros(TOKENS, D, dtype=torch.bfloat16)
    with torch.inference_mode():
        full = layer.self_attn.media(x, cos, sin, keys, values)
        fp8 = layer.self_attn.media(x, cos, sin, keys, values, attend=fp8_attention)
    errors["one Nano media layer at the released shape, bf16, its attention's output: FP8 against full"] = \
        relative(fp8, full)
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--counted", action="store_true", help="only the counted per-chunk table (no CPU runs)")
    parser.add_argument("--fp8-attention", action="store_true", help="only FP8 attention's measured error")
    args = parser.parse_args()
    if args.counted:
        real_time_table()
        return
    if args.fp8_attention:
        for what, error in fp8_attention_errors().items():
            print(f"{what}: {error:.2%} relative mean difference")
        return
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
        seconds = f / GPUS["H200"]["bf16"]
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
