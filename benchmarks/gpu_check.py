"""The project's GPU check: the CUDA code paths on tiny checkpoints, then kernels, speed and memory at released shapes.

    python benchmarks/gpu_check.py                   # on a CUDA GPU: stops starting checks after 7 minutes
    python benchmarks/gpu_check.py --device cpu      # every check's code path at tiny sizes, here (3 to 7 minutes)
    benchmarks/gpu_check.sh                          # on a lent GPU machine: installs carried wheels, then the above

Each check runs on its own: a failure prints FAIL with its reason and the run goes on; what cannot run here (no
`gguf` package, no scaled fp8 matmuls) is a SKIP with the reason. Checks run most valuable first; once `--deadline`
seconds (on a GPU 420 unless given, inside gpu_check.sh's `timeout 470`) have passed, the rest are SKIPs ("deadline
reached"), and a SIGTERM (that timeout) ends the running check as a FAIL: the summary table ends the run either way,
and every figure, traceback and table goes to the log (`--log`, default gpu_check.log).

Correctness (tiny random checkpoints, bf16 on the device against fp32 on the CPU; each bound is 2.5 times what
`--device cpu` measures for the same comparison, bf16 on the CPU, so a GPU fails only well beyond the dtype's own
error):
generation; offload_text and blocks_to_swap bit-identical; fp8 weight-only and fp8_scaled; GGUF Q8_0 and Q4_0 (also
with block swap, and with layers left in CPU memory); a model whose small modules stay in CPU memory while its
linears are on the device (as ComfyUI's low-VRAM loading leaves it) equal to one held wholly on the device; a
two-control transfer over two chunks; a causal Sim-Transfer rollout; a Sim-Bimanual session (three ticks against the
batch run and fp32 on the CPU, history in CPU memory); a causal rollout whose steady chunks replay a CUDA graph against
it eager (bit-identical expected, and the time per chunk both ways; compiled under the graph within bf16);
audio-conditioned image-to-video (the soundtrack encoded on the device, held, handed back); the Reasoner of both
families.
Device and code paths: the device record (`cosmos3_runtime.devices.facts`) printed, its grouped-K/V answer for bf16
and fp32 against torch's own SDPA kernel choice; one generate with the media block compiled (inductor; the eager
backend on the CPU), no graph breaks and equal to the uncompiled run; a first load through the nodes' memory path
(the pack's `empty_cache` before CUDA starts, a block-swapped generate, `empty_cache` again) in a fresh process.
Kernels and speed (random weights in the released shapes; tiny ones with --device cpu): which SDPA kernel runs for
2k-token bf16 and fp32 attention; SDPA at Edge's media-attention shape (8k tokens) under cuDNN, flash and
memory-efficient kernels with K/V expanded, and flash with grouped K/V; the official-FP8 W8A8 linear with the fp8
GEMM turned off (its emulation, as on an A100) against W8A16 at Nano width; SeaCache against the cache off, 8 steps
of Edge at 832x480x81 (8 of its 28 layers), forwards skipped and time per step; the VAE decode with cuDNN autotuning
and channels-last 3-D (Conv3d weights and the latents) against the default; the Reasoner's tokens per second eager,
compiled (CUDA graphs) and with a GGUF text tower; one Edge forward at 832x480x81 under torch.profiler (the SDPA
kernel, and the time split into matmuls, attention and the rest); one Edge generate at 832x480x81, 3 steps with CFG,
timed per stage (text, steps, VAE decode) and extrapolated to 35 steps; the memory block swap reserves (12 Edge
layers, 10 swapped, against held whole); GGUF dequantization of one Nano layer whole and in slices of 2M, 8M and 16M
values into bf16; official FP8 W8A8 against W8A16 at Edge and Nano widths; the bench_memory table (bf16, fp8,
fp8_scaled, GGUF, offload_text, blocks_to_swap: seconds per step, peak allocated and reserved memory), and Nano's
where the GPU has room; NVIDIA's two shortest published workloads beside its figures (`bench_workloads.py`, whose
docstring gives the commands for the rest).
"""

import argparse
import dataclasses
import importlib.util
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_memory import random_model  # noqa: E402
from virtual_device import place_like_a_host  # noqa: E402

import cosmos3_runtime  # noqa: E402
from cosmos3_runtime.weights.local_fp8 import Fp8Linear, scaled_fp8_available  # noqa: E402
from cosmos3_runtime.action import ActionRequest  # noqa: E402
from cosmos3_runtime.tiny import RELEASED, make_tiny_checkpoint, sim_bimanual_block, sim_transfer_block  # noqa: E402
from cosmos3_runtime.transformer import Segment, TransformerConfig, attention  # noqa: E402
from cosmos3_runtime.vae import WanVAE  # noqa: E402

# SeaCache off where precision is compared: a skip decided differently in bf16 and fp32 is not a precision error; eager
# (compile's auto default compiles on a GPU): every check would pay its own compile, and the compiled block has its own
REQUEST = dict(width=128, height=96, num_frames=9, steps=4, seed=3, output="latents", negative_prompt="blurry",
               cache="off", compile=False)
# Bounds: 2.5 times what `--device cpu` measured for the same comparison (bf16 on the CPU against fp32; the README
# lists those figures), rounded up: a GPU's bf16 kernels round differently, not 2.5 times worse.
BOUNDS = {"bf16": 0.075, "fp8": 0.22, "fp8_scaled": 0.41, "q8_0": 0.11, "q4_0": 0.5, "transfer": 0.009,
          "reasoner": 0.03, "causal": 0.005, "causal_recompute": 0.025, "audio": 0.01,
          # the sound encoder runs in fp32, its convolutions in TF32 on CUDA by default (8.2e-4 on an H200): bounded by
          # bf16's rounding, which the transformer applies to the held latents anyway
          "audio_encode": 0.004}


class Skip(Exception):
    """A check that cannot run on this machine; the message says why."""


class Stopped(BaseException):
    """SIGTERM (gpu_check.sh's timeout) arrived: not an Exception, so no check's own handling swallows it."""


def stop(*_) -> None:
    raise Stopped


@dataclass
class Row:
    check: str
    status: str  # PASS, FAIL or SKIP
    figure: str


class Check:
    def __init__(self, device: torch.device, log: Path, folder: Path, deadline: float):
        self.device, self.folder, self.deadline = device, folder, deadline  # deadline: a time.perf_counter() value
        self.full = device.type == "cuda"  # released shapes on a GPU; tiny ones elsewhere
        self.rows: list[Row] = []
        self.log = log.open("w", encoding="utf-8")
        self.cache: dict = {}

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")
        self.log.flush()

    def row(self, check: str, ok: bool | None, figure: str) -> bool:
        status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        self.rows.append(Row(check, status, figure))
        self.say(f"{status} {check}: {figure}")
        return bool(ok)

    def run(self, name: str, function) -> None:
        """Run one check; an exception is its FAIL (traceback in the log), Skip its SKIP."""
        start = time.perf_counter()
        try:
            function(self)
        except Skip as why:
            self.row(name, None, str(why))
        except Stopped:
            self.row(name, False, "stopped by SIGTERM (gpu_check.sh's timeout) while running")
            self.deadline = 0.0  # the rest are skipped: the summary must print before the wrapper kills the process
        except Exception as exc:  # noqa: BLE001 - any failure of a check is that check's result
            self.row(name, False, f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
            self.log.write(traceback.format_exc())
        finally:
            self.log.write(f"({name}: {time.perf_counter() - start:.1f} s)\n")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def summary(self) -> bool:
        self.say("\n| check | result | figure |\n|---|---|---|")
        for r in self.rows:
            self.say(f"| {r.check} | {r.status} | {r.figure} |")
        counts = {s: sum(r.status == s for r in self.rows) for s in ("PASS", "FAIL", "SKIP")}
        self.say(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
        return counts["FAIL"] == 0

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def left(self) -> float:
        """Seconds until the deadline (a subprocess's timeout: it must not outlive the run)."""
        return max(1.0, self.deadline - time.perf_counter())


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().mean() / b.float().abs().mean()).item()


def tiny(c: Check, **options) -> Path:
    key = tuple(sorted(options.items()))
    if key not in c.cache:
        name = "-".join(f"{k}={v}" for k, v in key) or "edge"
        c.cache[key] = make_tiny_checkpoint(c.folder / name, **{"kind": "edge", "size": "small", **options})
    return c.cache[key]


def baseline(c: Check) -> torch.Tensor:
    """bf16 latents of the tiny Edge checkpoint on the device (the reference of the weight-format checks)."""
    if "base" not in c.cache:
        c.cache["base"] = cosmos3_runtime.load(tiny(c), device=c.device, dtype="bf16").generate("a cat", **REQUEST).latents
    return c.cache["base"]


def fp32_reference(c: Check) -> torch.Tensor:
    """fp32 latents of the tiny Edge checkpoint on the CPU (what bf16 runs on the device are measured against)."""
    if "fp32" not in c.cache:
        c.cache["fp32"] = cosmos3_runtime.load(tiny(c), device="cpu", dtype="fp32").generate("a cat", **REQUEST).latents
    return c.cache["fp32"]


# --- correctness on tiny checkpoints ---------------------------------------------------------------------------


def check_bf16(c: Check) -> None:
    error = relative(baseline(c), fp32_reference(c))
    c.row("bf16 on the device vs fp32 on the CPU", error < BOUNDS["bf16"], f"relative mean difference {error:.4f}")


def check_low_vram(c: Check) -> None:
    for options in (dict(offload_text=True), dict(blocks_to_swap=3), dict(offload_text=True, blocks_to_swap=6)):
        pipe = cosmos3_runtime.load(tiny(c), device=c.device, dtype="bf16", **options)
        same = torch.equal(pipe.generate("a cat", **REQUEST).latents, baseline(c))
        held = [p for part in (pipe.denoiser.text_offload, pipe.block_swap) if part is not None for p in part.held()]
        off = all(p.device.type == "cpu" for p in held)
        c.row(f"{options}", same and off, f"bit-identical={same}, {len(held)} offloaded tensors in CPU memory={off}")


def check_fp8(c: Check) -> None:
    pipe = cosmos3_runtime.load(tiny(c), device=c.device, dtype="bf16", quantize="fp8")
    fp8 = pipe.generate("a cat", **REQUEST).latents
    error = relative(fp8, baseline(c))
    c.row("fp8 weight-only", error < BOUNDS["fp8"], f"relative mean difference to bf16 {error:.4f}")
    for m in [m for m in pipe.transformer.modules() if isinstance(m, Fp8Linear)][::2]:
        m.weight.data, m.scale.data = m.weight.data.cpu(), m.scale.data.cpu()
    same = torch.equal(pipe.generate("a cat", **REQUEST).latents, fp8)
    c.row("fp8 layers left in CPU memory run from there", same, f"bit-identical={same}")


def check_fp8_scaled(c: Check) -> None:
    if not scaled_fp8_available(c.device):
        raise Skip(f"no scaled fp8 matmuls on {c.device} (compute capability 9.0+)")
    latents = cosmos3_runtime.load(tiny(c), device=c.device, dtype="bf16", quantize="fp8_scaled").generate(
        "a cat", **REQUEST).latents
    error = relative(latents, baseline(c))
    c.row("fp8_scaled", error < BOUNDS["fp8_scaled"], f"relative mean difference to bf16 {error:.4f}")


def check_gguf(c: Check) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise Skip("the gguf package is not installed (carry its wheel: see benchmarks/gpu_check.sh)")
    from cosmos3_runtime.weights.gguf_convert import convert
    from cosmos3_runtime.weights.gguf import GGUFLinear

    for qtype in ("q8_0", "q4_0"):
        path = c.folder / f"{qtype}.gguf"
        convert(tiny(c), path, qtype)
        quantized = cosmos3_runtime.load(tiny(c), device=c.device, dtype="bf16", transformer_file=path)
        latents = quantized.generate("a cat", **REQUEST).latents
        swapped = cosmos3_runtime.load(tiny(c), device=c.device, dtype="bf16", transformer_file=path, blocks_to_swap=3)
        same = torch.equal(swapped.generate("a cat", **REQUEST).latents, latents)
        error = relative(latents, baseline(c))
        c.row(f"GGUF {qtype} (and with 3 blocks swapped)", error < BOUNDS[qtype] and same,
              f"relative mean difference to bf16 {error:.4f}, swap bit-identical={same}")
        left = [m for m in quantized.transformer.modules() if isinstance(m, GGUFLinear)][::2]
        for m in left:  # as ComfyUI's memory manager leaves layers it cannot fit: in CPU memory
            m.weight.data = m.weight.data.cpu()
        same = torch.equal(quantized.generate("a cat", **REQUEST).latents, latents)
        c.row(f"GGUF {qtype} layers left in CPU memory run from there", same,
              f"{len(left)} layers in CPU memory, bit-identical={same}")


def check_host_placement(c: Check) -> None:
    """Linears on the device, every other module (norms, embeddings, time embedder, action tables) in CPU memory:
    the forward runs on the device and equals the one of a model wholly there."""
    root = tiny(c, action=True)
    whole = cosmos3_runtime.load(root, device=c.device, dtype="bf16").transformer
    held = cosmos3_runtime.load(root, device="cpu", dtype="bf16").transformer
    place_like_a_host(held, str(c.device))
    g = torch.Generator().manual_seed(0)
    latents, actions = torch.randn(1, 48, 3, 6, 8, generator=g).to(c.device), torch.randn(8, 64, generator=g)
    outputs = []
    for model in (whole, held):
        with torch.inference_mode():
            text = model.encode_text(torch.arange(40) % 500, c.device)
            out = model(latents, torch.tensor(900), text, tracks=[Segment("action", actions.to(c.device), domain=2)])
        outputs.append(out)
    same = torch.equal(outputs[0].vision, outputs[1].vision) and torch.equal(outputs[0].tracks[0], outputs[1].tracks[0])
    where = outputs[1].vision.device
    c.row("small modules in CPU memory, linears on the device", same and where.type == c.device.type,
          f"ran on {where}, bit-identical to the model wholly on the device={same}")


def check_transfer(c: Check) -> None:
    root = tiny(c, kind="gated")
    controls = {"edge": torch.rand(9, 96, 128, 3), "depth": torch.rand(9, 96, 128, 3)}
    options = dict(width=128, height=96, steps=4, seed=3, chunk_frames=5, control_videos=controls, guidance_scale=3.0,
                   cache="off", compile=False)
    cpu = cosmos3_runtime.load(root, device="cpu", dtype="fp32").generate("a cat", **options).frames
    gpu = cosmos3_runtime.load(root, device=c.device, dtype="bf16").generate("a cat", **options).frames
    error = (gpu - cpu).abs().mean().item()
    c.row("transfer, two controls over two chunks", error < BOUNDS["transfer"],
          f"mean abs difference of the frames {error:.4f}")


def check_causal(c: Check) -> None:
    """A causal Sim-Transfer rollout on the device: bf16 against fp32 on the CPU, the K/V rollout against the
    recompute, and the history in pinned CPU memory (each layer's rows brought to the device) against on the device."""
    root = c.folder / "sim-transfer"
    if not root.exists():
        make_tiny_checkpoint(root, kind="gated", size="small", distilled=True, causal=sim_transfer_block())
    options = dict(width=128, height=96, seed=3, control_videos={"edge": torch.rand(33, 96, 128, 3)}, compile=False)
    cpu = cosmos3_runtime.load(root, device="cpu", dtype="fp32").generate("a cat", **options).frames
    pipe = cosmos3_runtime.load(root, device=c.device, dtype="bf16")
    kv = pipe.generate("a cat", **options)
    error = (kv.frames - cpu).abs().mean().item()
    recomputed = relative(pipe.generate("a cat", causal_cache="recompute", **options).latents, kv.latents)
    host = torch.equal(pipe.generate("a cat", causal_history="cpu", **options).latents, kv.latents)
    c.row("causal rollout, 3 chunks", error < BOUNDS["causal"] and recomputed < BOUNDS["causal_recompute"] and host,
          f"mean abs difference of the frames {error:.4f}; K/V vs recompute {recomputed:.4f} relative; history in CPU "
          f"memory bit-identical={host}")


def check_session(c: Check) -> None:
    """A Sim-Bimanual session on the device, three ticks: bf16 against a batch run of the same actions on the device
    (the same kernels: equal) and against fp32 on the CPU; the history in pinned CPU memory against on the device."""
    root = c.folder / "sim-bimanual"
    if not root.exists():
        make_tiny_checkpoint(root, kind="gated", size="small", distilled=True, action=True,
                             causal=sim_bimanual_block(window_frames=8))
    table = torch.randn(48, 29, generator=torch.Generator().manual_seed(0))
    first = torch.rand(1, 96, 128, 3, generator=torch.Generator().manual_seed(1))

    def options(actions=None, **extra):
        return dict(action=ActionRequest(mode="forward_dynamics", image=first, actions=actions, domain="agibotworld"),
                    width=128, height=96, seed=3, compile=False, **extra)

    cpu = cosmos3_runtime.load(root, device="cpu", dtype="fp32").generate("a robot", **options(table)).frames
    pipe = cosmos3_runtime.load(root, device=c.device, dtype="bf16")
    batch = pipe.generate("a robot", **options(table)).frames
    start = time.perf_counter()
    with pipe.session("a robot", **options()) as s:
        ticks = torch.cat([s.tick(table[16 * k : 16 * (k + 1)]) for k in range(3)])
    seconds = (time.perf_counter() - start) / 3
    with pipe.session("a robot", **options(causal_history="cpu")) as s:
        host = torch.cat([s.tick(table[16 * k : 16 * (k + 1)]) for k in range(3)])
    same = (ticks - batch).abs().max().item()
    error = (ticks - cpu).abs().mean().item()
    c.row("Sim-Bimanual session, 3 ticks", same <= 1 / 255 and error < BOUNDS["causal"] and torch.equal(host, ticks),
          f"ticks vs batch max abs {same:.5f}; vs fp32 on the CPU mean abs {error:.4f}; history in CPU memory "
          f"bit-identical={torch.equal(host, ticks)}; {seconds:.2f} s a tick (tiny model, 128x96)")


def check_chunk_step(c: Check) -> None:
    """A framewise Sim-Transfer rollout whose steady-state chunks replay a CUDA graph (`chunk_step`: window 4, chunk 3
    eager, 4 captured, 5 to 10 replayed) against the same rollout eager on the device, and the seconds per steady
    chunk both ways. Expected bit-identical: the replay runs the kernels the eager forward runs, on the same values;
    it passes within the causal bf16 bound and says which, as cuBLAS may choose another algorithm inside a capture.
    Then compile's default on a GPU, the inductor block under the graph: within bf16's bound of eager (inductor keeps
    a fused op's intermediates in fp32, as the compiled block check says)."""
    from cosmos3_runtime import chunk_step

    if c.device.type != "cuda":
        raise Skip("CUDA graphs need an NVIDIA GPU (tests/test_chunk_step.py runs the step's buffers and its capture "
                   "path on the CPU)")
    root = c.folder / "sim-transfer-framewise"
    if not root.exists():
        make_tiny_checkpoint(root, kind="gated", size="small", distilled=True,
                             causal=sim_transfer_block(1, window_frames=4, sink_frames=1))
    pipe = cosmos3_runtime.load(root, device=c.device, dtype="bf16")
    control = torch.rand(41, 96, 128, 3, generator=torch.Generator().manual_seed(0))
    original, made = chunk_step.for_run, []

    def rollout(compile: bool) -> tuple[torch.Tensor, float]:
        stamps = []

        def progress(stage, done, total):
            if stage == "chunk":
                c.sync()
                stamps.append(time.perf_counter())

        latents = pipe.generate("a cat", control_videos={"edge": control}, width=128, height=96, seed=3,
                                compile=compile, progress=progress).latents
        return latents, statistics.median(b - a for a, b in zip(stamps[5:], stamps[6:]))

    chunk_step.for_run = lambda *args: made.append(original(*args)) or made[-1]
    try:
        graphed, graphed_seconds = rollout(False)
        start = time.perf_counter()
        compiled, compiled_seconds = rollout(True)
        compiling = time.perf_counter() - start
        chunk_step.for_run = lambda *args: None
        eager, eager_seconds = rollout(False)
    finally:
        chunk_step.for_run = original
    captured = all(step is not None and step.replay is not None for step in made)
    same, error, to_compiled = torch.equal(graphed, eager), relative(graphed, eager), relative(compiled, eager)
    c.row("causal chunk step, CUDA graphs",
          captured and (same or error < BOUNDS["causal"]) and to_compiled < BOUNDS["bf16"],
          f"captured={captured}; bit-identical to eager={same}, relative mean difference {error:.5f}; compiled "
          f"(inductor) under the graph {to_compiled:.4f}, its rollout with the compile {compiling:.0f} s; a steady "
          f"chunk {eager_seconds * 1e3:.1f} ms eager, {graphed_seconds * 1e3:.1f} ms graphed "
          f"({eager_seconds / graphed_seconds:.2f}x), {compiled_seconds * 1e3:.1f} ms compiled and graphed (tiny "
          f"model, 128x96)")


TIMING_CAP = 120  # seconds each real-time row may take: the rows after them get time too


def check_session_latency(c: Check) -> None:
    """Sim-Bimanual tick latency at the released shape (Nano's, random weights, bf16, 832x480, its 96-frame window),
    the decode included (beside the commits on a second stream): p50 / p99 over the ticks after the window fills, as
    many as the deadline leaves (at most 200), against 0.53 s (16 frames at 30 fps)."""
    if not c.full:
        raise Skip("the released shape needs a GPU")
    import bench_session

    root = c.folder / "sim-bimanual-96"
    if not root.exists():
        make_tiny_checkpoint(root, kind="gated", size="small", distilled=True, action=True, causal=sim_bimanual_block())
    pipe = random_pipeline(root, TransformerConfig(**RELEASED["nano"], action_gen=True, action_dim=64), c.device)
    seconds, _ = bench_session.tick_latencies(pipe, 832, 480, 200, min(c.left() - 30, TIMING_CAP))
    full = 96 // 4  # ticks before the window is full
    later = seconds[full:]
    if len(later) < 10:
        raise Skip(f"the deadline left {len(seconds)} ticks; the window fills after {full}")
    p50, p99 = (bench_session.percentile(later, p) for p in (50, 99))
    c.row("Sim-Bimanual ticks at 832x480, window 96 (Nano, random weights)", p99 <= 0.53,
          f"p50 {p50:.3f} s, p99 {p99:.3f} s over {len(later)} ticks with the window full, the decode included; "
          f"target p99 <= 0.53 s; peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


EPISODE = 1 + 16 * 37  # the 601-frame horizon in whole chunks (1 + 16k)


def check_transfer_fps(c: Check) -> None:
    """Sim-Transfer chunkwise at the released shape (Nano's, random weights, bf16, 832x480, all history kept) as a
    camera drives it, an episode of up to 593 frames (601 in whole chunks) tick by tick (16 control frames a tick),
    each tick timed from its controls to its frames in host memory (the control encode, 4 steps, the commits and the
    decode beside them): fps at the episode's start and end, with the full decoder and then the fast one (a random
    file in the tiny autoencoder's published layout), as many ticks as the deadline leaves, against 16 fps sustained
    (24 with the fast decoder)."""
    if not c.full:
        raise Skip("the released shape needs a GPU")
    from tiny_decoder_files import published_state, write

    root = c.folder / "sim-transfer-chunkwise"
    if not root.exists():
        make_tiny_checkpoint(root, kind="gated", size="small", distilled=True, causal=sim_transfer_block())
    pipe = random_pipeline(root, TransformerConfig(**RELEASED["nano"]), c.device)
    fast = write(c.folder / "taew2_2.safetensors", published_state(seed=0))
    generator = torch.Generator().manual_seed(0)
    control = (torch.rand(17, 480, 832, 3, generator=generator) * 255).to(torch.uint8)  # reused tick after tick
    results = {}
    for name, decoder, target in (("full decoder", None, 16.0), ("fast decoder", str(fast), 24.0)):
        budget, rates = min((c.left() - 30) / (2 if decoder is None else 1), TIMING_CAP / 2), []
        start = time.perf_counter()
        with pipe.session("A red ball rolls across a stone floor.", control="edge", num_frames=EPISODE, width=832,
                          height=480, fast_decoder=decoder) as s:
            s.tick(control[:1])
            while s.frames < EPISODE and time.perf_counter() - start < budget:
                begin = time.perf_counter()
                s.tick(control[1:17])
                rates.append(16 / (time.perf_counter() - begin))
        if len(rates) < 6:
            raise Skip(f"the deadline left {len(rates)} ticks of the {name}")
        results[name] = (statistics.median(rates[1:4]), statistics.median(rates[-3:]), min(rates[1:]), len(rates),
                         target)
    c.row("Sim-Transfer chunkwise at 832x480 (Nano, random weights)",
          all(low >= target for _, _, low, _, target in results.values()),
          "; ".join(f"{name}: {first:.1f} fps at the start, {last:.1f} after {ticks} ticks ({16 * ticks + 1} frames), "
                    f"lowest {low:.1f} (target {target:.0f})" for name, (first, last, low, ticks, target)
                    in results.items()) + f"; peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")


def check_audio(c: Check) -> None:
    """Audio-conditioned image-to-video on the device: the soundtrack encoded there (the sound tokenizer in fp32 under
    a bf16 model) holds the latents the CPU encodes, the run's sound is the soundtrack, and the frames are within bf16
    of fp32 on the CPU."""
    root = tiny(c, kind="gated", sound=True)
    g = torch.Generator().manual_seed(4)
    tone = 0.5 * torch.sin(2 * torch.pi * 440 * torch.arange(22050) / 44100)  # 0.5 s at 44.1 kHz, mono
    options = dict(width=128, height=96, num_frames=9, steps=4, seed=3, cache="off", compile=False,
                   negative_prompt="silence",
                   image=torch.rand(1, 96, 128, 3, generator=g), audio=(tone.unsqueeze(0), 44100))
    cpu = cosmos3_runtime.load(root, device="cpu", dtype="fp32").generate("a drummer", **options)
    pipe = cosmos3_runtime.load(root, device=c.device, dtype="bf16")
    gpu = pipe.generate("a drummer", **options)
    held = cpu.sound.shape[1] // 320  # the tiny tokenizer's hop: whole sound latents are held
    encoded = relative(gpu.sound_latents[:, :held], cpu.sound_latents[:, :held])
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # cuDNN's fp32 convolutions are TF32 by default
        exact = relative(pipe.codec.encode_sound(cpu.sound).cpu()[:, :held], cpu.sound_latents[:, :held])
    error = (gpu.frames - cpu.frames).abs().mean().item()
    same = torch.equal(gpu.sound, cpu.sound)
    c.row("audio-conditioned image-to-video", error < BOUNDS["audio"] and encoded < BOUNDS["audio_encode"]
          and exact < 1e-4 and same,
          f"mean abs difference of the frames {error:.4f}; held sound latents {encoded:.1e} relative ({exact:.1e} with "
          f"TF32 convolutions off); the soundtrack out equal={same}")


def check_reasoner(c: Check) -> None:
    image = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    for kind in ("gated", "edge"):
        root = tiny(c, kind=kind)
        ask = dict(images=[image], max_new_tokens=8, temperature=0.0, keep_logits=True)
        cpu = cosmos3_runtime.load(root, device="cpu", dtype="fp32", parts="reasoner").reason("What is this?", **ask)
        gpu = cosmos3_runtime.load(root, device=c.device, dtype="bf16", parts="reasoner").reason("What is this?", **ask)
        same = next((i for i, (a, b) in enumerate(zip(cpu.token_ids, gpu.token_ids)) if a != b), len(gpu.token_ids))
        error = (gpu.logits[0] - cpu.logits[0]).abs().max().item() / cpu.logits[0].abs().max().item()
        c.row(f"Reasoner ({kind})", same >= 1 and error < BOUNDS["reasoner"],
              f"first {same} of 8 tokens equal, first-step logits relative max difference {error:.4f}, "
              f"{gpu.prefill_seconds * 1000:.0f} ms prefill, {len(gpu.token_ids) / gpu.decode_seconds:.0f} tokens/s")


# --- the device record and code paths ----------------------------------------------------------------------------


def check_device_record(c: Check) -> None:
    """The record the runtime reads for this device, and its grouped-K/V answer for Edge's heads (16 query, 8 key/value,
    head dim 128) against torch's own SDPA kernel choice: grouped K/V where torch would run its math kernel costs
    memory (69 GB of scores for Edge at 832x480x81), K/V expanded where a fused kernel takes them grouped costs time."""
    from torch.nn.attention import SDPBackend

    from cosmos3_runtime.devices import facts

    record = facts(c.device)
    c.say(f"device record: {record}")
    agree, answers = True, []
    for dtype in (torch.bfloat16, torch.float32):
        q = torch.zeros(1, 16, 64, 128, device=c.device, dtype=dtype)
        kv = torch.zeros(1, 8, 64, 128, device=c.device, dtype=dtype)
        choice = torch._fused_sdp_choice(q, kv, kv, enable_gqa=True)
        grouped = record.grouped_kv(dtype, 128)
        agree &= grouped == (choice != int(SDPBackend.MATH))
        answers.append(f"{str(dtype).split('.')[-1]}: record grouped={grouped}, torch {SDPBackend(choice).name}")
    c.row("device record: grouped K/V as torch chooses", agree, "; ".join(answers))


def check_compiled_block(c: Check) -> None:
    """One generate with the media block through torch.compile (inductor on a GPU; on the CPU the eager backend,
    which traces the same graph without inductor's minutes of C++ compiling): no graph breaks, and with the eager
    backend bit-equal to the uncompiled run; inductor's kernels keep a fused op's intermediates in fp32, so its
    result parts from the uncompiled bf16 one by as much as bf16 from fp32 (0.041 and 0.030 on the CPU): it passes
    within the bf16 bound of the fp32 reference, as the uncompiled run does."""
    from torch._dynamo.utils import counters

    from cosmos3_runtime import transformer
    from cosmos3_runtime.transformer import compiled_media_block

    reference, fp32 = baseline(c), fp32_reference(c)  # made before the counters start
    pipe = cosmos3_runtime.load(tiny(c), device=c.device, dtype="bf16")
    torch._dynamo.reset()
    counters.clear()
    inductor = c.device.type == "cuda"
    original = transformer.compiled_media_block
    if not inductor:
        transformer.compiled_media_block = lambda: compiled_media_block("eager")
    try:
        start = time.perf_counter()
        latents = pipe.generate("a cat", **{**REQUEST, "compile": True}).latents
        seconds = time.perf_counter() - start
    finally:
        transformer.compiled_media_block = original
    reasons = dict(counters["graph_break"])
    breaks = sum(reasons.values())
    error = relative(latents, reference)
    to_fp32 = relative(latents, fp32)
    same = to_fp32 < BOUNDS["bf16"] if inductor else torch.equal(latents, reference)
    c.row(f"compiled media block ({'inductor' if inductor else 'eager backend'})", breaks == 0 and same,
          f"{breaks} graph breaks{f' {reasons}' if breaks else ''}, {counters['stats']['unique_graphs']} graphs, "
          f"relative mean difference to the uncompiled run {error:.4f}, to fp32 {to_fp32:.4f}, generate with the "
          f"compile {seconds:.0f} s")


# A fresh process, as ComfyUI's first load: the pack imported as a package named after its folder (its own copy of
# the runtime), the nodes' empty_cache before anything started CUDA, a block-swapped generate (pinned CPU copies),
# then empty_cache again once they are freed (PyTorch's pinned host cache given back).
FIRST_LOAD = """
import gc, importlib.util, sys, time
from pathlib import Path
root, checkpoint, device = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
spec = importlib.util.spec_from_file_location("cosmos3_pack", root / "__init__.py",
                                              submodule_search_locations=[str(root)])
sys.modules["cosmos3_pack"] = pack = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pack)
from cosmos3_pack import cosmos3_runtime
from cosmos3_pack.nodes.services.memory import empty_cache
start = time.perf_counter()
empty_cache()
pipe = cosmos3_runtime.load(checkpoint, device=device, dtype="bf16", blocks_to_swap=2)
pipe.generate("a cat", width=128, height=96, num_frames=9, steps=1, output="latents")
del pipe
gc.collect()
empty_cache()
print(f"empty_cache, load, one step, empty_cache: {time.perf_counter() - start:.1f} s")
"""


def check_first_load(c: Check) -> None:
    timeout = min(180, c.left())
    try:
        done = subprocess.run([sys.executable, "-c", FIRST_LOAD, str(ROOT), str(tiny(c)), str(c.device)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Skip(f"stopped after {timeout:.0f} s (the deadline)") from None
    c.log.write(done.stderr)
    lines = (done.stdout if done.returncode == 0 else done.stderr).strip().splitlines()
    c.row("first load through the nodes' memory path", done.returncode == 0,
          lines[-1] if lines else f"exited with {done.returncode}")


# --- kernels and speed at released shapes ------------------------------------------------------------------------


def kernels(profile) -> list[str]:
    return sorted({e.name for e in profile.events() if "attention" in e.name.lower() or "fmha" in e.name.lower()
                   or "flash" in e.name.lower()})


def check_attention_kernels(c: Check) -> None:
    """2k tokens, Edge's heads (16 query, 8 key/value): no math kernel in bf16 or fp32."""
    from torch.profiler import ProfilerActivity, profile

    for dtype in (torch.bfloat16, torch.float32):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2048, h, 128, generator=g).to(c.device, dtype) for h in (16, 8, 8))
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if c.device.type == "cuda" else [])
        with profile(activities=activities) as p:
            attention(q, k, v)
            c.sync()
        names = kernels(p)
        math = any("math" in n for n in names)
        c.row(f"attention kernel, 2048 tokens, {str(dtype).split('.')[-1]}", not math and bool(names), ", ".join(names))


def check_sdpa_backends(c: Check) -> None:
    """SDPA at Edge's media-attention shape (16 query heads, 8 K/V heads, head dim 128, bf16; 8k tokens, 256 on the
    CPU): cuDNN, flash and memory-efficient kernels with K/V expanded to the query heads, and flash with grouped K/V
    (enable_gqa), ms per call; a kernel that refuses these inputs is unavailable (a SKIP), one that runs must agree
    with the first that ran."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tokens, repeats = (8192, 20) if c.full else (256, 3)
    q = torch.randn(1, 16, tokens, 128, device=c.device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, 8, tokens, 128, device=c.device, dtype=torch.bfloat16) for _ in range(2))
    expanded = (k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1))
    cases = [("cuDNN", SDPBackend.CUDNN_ATTENTION, expanded, {}), ("flash", SDPBackend.FLASH_ATTENTION, expanded, {}),
             ("memory-efficient", SDPBackend.EFFICIENT_ATTENTION, expanded, {}),
             ("flash, grouped K/V", SDPBackend.FLASH_ATTENTION, (k, v), {"enable_gqa": True})]
    reference = None
    for name, backend, (key, value), extra in cases:
        check = f"SDPA {name}, {tokens} tokens"
        if c.device.type != "cuda" and backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            c.row(check, None, "a CUDA kernel")
            continue
        try:
            with sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(q, key, value, **extra)  # warm-up
                c.sync()
                start = time.perf_counter()
                for _ in range(repeats):
                    torch.nn.functional.scaled_dot_product_attention(q, key, value, **extra)
                c.sync()
        except RuntimeError as exc:  # SDPA's "No available kernel": the reasons are in its warnings (the log)
            c.row(check, None, f"unavailable: {str(exc).splitlines()[0][:200]}")
            continue
        ms = (time.perf_counter() - start) / repeats * 1000
        reference = out if reference is None else reference
        error = relative(out, reference)
        c.row(check, error < 0.02, f"{ms:.2f} ms ({4 * tokens**2 * 128 * 16 / ms / 1e9:.3g} TFLOP/s), relative mean "
              f"difference to the first kernel {error:.4f}")


def check_seacache(c: Check) -> None:
    """SeaCache against the cache off: 8 steps with CFG of Edge at its default size in the released shapes, 8 of its
    28 layers on a GPU (the check's minute; a step of all 28 takes about 3.5 times as long), 2 at 128x96x9
    elsewhere: the forwards it skipped, and the time per step."""
    config, (w, h, f) = released_edge(c)
    if c.full:
        config = TransformerConfig(**{**RELEASED["edge"], "num_hidden_layers": 8})
    pipe = released_pipeline(c, config)
    prompt, request = "A robot arm stacks two cubes.", dict(width=w, height=h, num_frames=f, seed=3, output="latents",
                                                     compile=False)
    pipe.generate(prompt, **request, steps=1, cache="off")  # warm-up; the prompts' text K/V are kept
    runs = {}
    for cache in ("off", "seacache"):
        stamps = []

        def stamp(*_):
            c.sync()
            stamps.append(time.perf_counter())

        result = pipe.generate(prompt, **request, steps=8, cache=cache, callback=stamp)
        runs[cache] = ((stamps[-1] - stamps[0]) / (len(stamps) - 1), result)  # steps 2 to 8: no setup in them
    (off, plain), (on, cached) = runs["off"], runs["seacache"]
    c.row(f"SeaCache, Edge {w}x{h}x{f} ({config.num_hidden_layers} of 28 layers), 8 steps", cached.cache is not None,
          f"{cached.cache}; {on:.2f} s per step against {off:.2f} s off ({on / off:.2f}x), relative mean difference "
          f"{relative(cached.latents, plain.latents):.3f}")


def released_edge(c: Check) -> tuple[TransformerConfig, tuple[int, int, int]]:
    """Edge at its default video size on a GPU; two layers at 128x96x9 elsewhere."""
    if c.full:
        return TransformerConfig(**RELEASED["edge"]), (832, 480, 81)
    return TransformerConfig(**{**RELEASED["edge"], "num_hidden_layers": 2}), (128, 96, 9)


def check_profile(c: Check) -> None:
    from torch.profiler import ProfilerActivity, profile

    config, (w, h, f) = released_edge(c)
    model = random_model(config, str(c.device))
    latents = torch.randn(1, 48, 1 + (f - 1) // 4, h // 16, w // 16, device=c.device)
    with torch.inference_mode():
        text = model.encode_text(torch.arange(300) % config.vocab_size, c.device)
        model(latents, torch.tensor(900), text)  # warm-up
        c.sync()
        cuda = c.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        start = time.perf_counter()
        with profile(activities=activities) as p:
            model(latents, torch.tensor(900), text)
            c.sync()
        seconds = time.perf_counter() - start
    split = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for event in p.key_averages():
        own = event.self_device_time_total if cuda else event.self_cpu_time_total
        name = event.key.lower()
        if any(s in name for s in ("attention", "fmha", "flash")):
            split["attention"] += own
        elif any(s in name for s in ("gemm", "mm", "matmul", "linear", "cutlass", "nvjet", "xmma")):
            split["matmul"] += own
        elif cuda or name.startswith("aten::") and not name.startswith(("aten::to", "aten::copy", "aten::empty")):
            split["other"] += own
    total = sum(split.values()) or 1.0
    names = kernels(p)
    c.row(f"Edge forward {w}x{h}x{f} ({config.num_hidden_layers} layers), profiled", not any("math" in n for n in names),
          f"{seconds * 1000:.0f} ms; " + ", ".join(f"{k} {v / total:.0%}" for k, v in split.items()) +
          f"; SDPA: {', '.join(names)}")


def released_pipeline(c: Check, config: TransformerConfig):
    """A pipeline with random weights in the released Edge shapes (the tiny checkpoint's tokenizer and configs)."""
    return random_pipeline(tiny(c), config, c.device, released_vae=c.full)


def random_pipeline(root: Path, config: TransformerConfig, device: torch.device, released_vae: bool = True):
    """A pipeline of the tiny checkpoint `root` (its tokenizer, configs and variant) with random weights: the
    transformer in `config`'s shapes, the VAE at the released widths (`released_vae` False: the checkpoint's own)."""
    pipe = cosmos3_runtime.load(root, device=device, dtype="bf16")
    pipe.transformer = random_model(config, str(device))
    vae_config = dataclasses.replace(pipe.vae.config, base_dim=160, decoder_base_dim=256) if released_vae else \
        pipe.vae.config
    with torch.device("meta"):
        vae = WanVAE(vae_config)
    pipe.vae = vae.to_empty(device=device).to(torch.bfloat16)
    for name, p in pipe.vae.named_parameters():
        with torch.no_grad():
            p.fill_(1.0) if name.endswith("gamma") else p.normal_(0, 0.02)
    pipe.planner.transformer_config, pipe.planner.vae_config = config, vae_config
    return pipe


def check_generate_stages(c: Check) -> None:
    """One generate with CFG, 3 steps, each stage timed; the total extrapolated to 35 steps."""
    config, (w, h, f) = released_edge(c)
    pipe = released_pipeline(c, config)
    request = cosmos3_runtime.Request(width=w, height=h, num_frames=f, steps=3, guidance_scale=5.0, output="latents",
                                      cache="off", compile=False)  # every step runs in full, eager (as first measured)
    _, cond, uncond = pipe.planner.prepare("A robot arm stacks two cubes.", request)
    c.sync()
    start = time.perf_counter()
    pipe.denoiser.text_kv(cond), pipe.denoiser.text_kv(uncond)
    c.sync()
    text = time.perf_counter() - start
    stamps = []

    def stamp(*_):
        c.sync()
        stamps.append(time.perf_counter())

    start = time.perf_counter()
    latents = pipe.generate("A robot arm stacks two cubes.", request, callback=stamp).latents
    steps = [b - a for a, b in zip([start, *stamps], stamps)]
    step = min(steps[1:]) if len(steps) > 1 else steps[0]
    start = time.perf_counter()
    pipe.decode(latents)
    c.sync()
    decode = time.perf_counter() - start
    peak = f", peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if c.device.type == "cuda" else ""
    c.row(f"Edge generate {w}x{h}x{f}, stages", True,
          f"text {text:.2f} s, first step {steps[0]:.2f} s, step {step:.2f} s, VAE decode {decode:.2f} s; "
          f"35 steps: {text + 35 * step + decode:.0f} s without SeaCache{peak}")


def check_block_swap_memory(c: Check) -> None:
    """Block swap bounds what the allocator reserves, not only what Python points at: the Edge stack with 10 of its
    layers swapped reserves at least 80 % of 8 layers' media weights less than the stack held whole."""
    if c.device.type != "cuda":
        raise Skip("reserved memory is the CUDA allocator's figure (the swap's order of copies and events is tested "
                   "on the CPU: tests/test_low_vram.py)")
    from cosmos3_runtime.offload import BlockSwap
    from cosmos3_runtime.transformer import tower_of

    config = TransformerConfig(**{**RELEASED["edge"], "num_hidden_layers": 12})
    latents = torch.randn(1, 48, 11, 30, 52, device=c.device)  # 832x480x41
    reserved, seconds = {}, {}
    for swap in (0, 10):
        model = random_model(config, str(c.device))
        if swap:
            model.hooks = dataclasses.replace(model.hooks, layer=BlockSwap(model, swap))  # to pinned CPU memory
        torch.cuda.empty_cache()  # freed device copies are not the run's: the allocator gives them back
        layer_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters()
                          if n.startswith("layers.1.") and tower_of(n) == "media tower")
        with torch.inference_mode():
            text = model.encode_text(torch.arange(300) % config.vocab_size, c.device)
            model(latents, torch.tensor(900), text)  # warm-up
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            model(latents, torch.tensor(900), text)
            torch.cuda.synchronize()
        seconds[swap], reserved[swap] = time.perf_counter() - start, torch.cuda.max_memory_reserved()
        del model, text
        torch.cuda.empty_cache()
    saved = reserved[0] - reserved[10]
    c.row("block swap, reserved memory", saved >= 0.8 * 8 * layer_bytes,
          f"12 Edge layers at 832x480x41: {reserved[0] / 2**30:.2f} GiB reserved whole, {reserved[10] / 2**30:.2f} GiB "
          f"with 10 swapped (saved {saved / layer_bytes:.1f} layers' media weights of 8 possible); forward "
          f"{seconds[0]:.2f} s whole, {seconds[10]:.2f} s swapped")


def check_gguf_dequant(c: Check) -> None:
    """One Nano layer's media linears expanded to bf16 on the device: the whole weight in float32 then cast (the
    old way) against slices of 2M, 8M and 16M values straight into bf16, and the default (`slice_values`)."""
    if importlib.util.find_spec("gguf") is None:
        raise Skip("the gguf package is not installed")
    from gguf_files import random_blocks

    from cosmos3_runtime.weights.gguf_dequant import dequantize, slice_values

    r = RELEASED["nano"]
    H, I, A, K, D = (r["hidden_size"], r["intermediate_size"], r["num_attention_heads"], r["num_key_value_heads"],
                     r["head_dim"])
    shapes = [(A * D, H), (K * D, H), (K * D, H), (H, A * D), (I, H), (I, H), (H, I)] if c.full else [(256, 512)] * 3
    ways = {"whole": 1 << 40, "2M": 1 << 21, "8M": 1 << 23, "16M": 1 << 24, "default": slice_values(c.device)}
    figures = []
    for qtype in ("Q8_0", "Q4_K"):
        raws = [torch.from_numpy(random_blocks(qtype, rows, cols)).to(c.device) for rows, cols in shapes]
        times = {}
        for name, chunk in ways.items():
            def expand():
                for raw, shape in zip(raws, shapes):
                    if name == "whole":
                        dequantize(raw, qtype, shape, chunk_values=chunk).bfloat16()
                    else:
                        dequantize(raw, qtype, shape, torch.bfloat16, chunk_values=chunk)

            expand()
            c.sync()
            if c.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            expand()
            c.sync()
            peak = torch.cuda.max_memory_allocated() / 2**20 if c.device.type == "cuda" else 0
            times[name] = f"{name} {(time.perf_counter() - start) * 1000:.1f} ms / {peak:.0f} MiB"
        figures.append(f"{qtype}: " + ", ".join(times.values()))
    c.row("GGUF dequantization per layer (time / peak)", True, "; ".join(figures))


def w8a8_against_w8a16(c: Check, hidden: int, intermediate: int, tokens: int) -> tuple[float, float]:
    """One media layer's linears ([H, H], [I, H], [H, I]) on a `tokens` batch, W8A8 (`w8a8_linear`: fp8 activations
    by a static scale) against W8A16 (the fp8 weight upcast): W8A8's time as a multiple of W8A16's, and the relative
    mean difference of their outputs."""
    from cosmos3_runtime.weights.fp8 import FP8
    from cosmos3_runtime.weights.modelopt_fp8 import w8a8_linear

    weights = [(torch.randn(o, i, device=c.device) * 0.02) for o, i in ((hidden, hidden), (intermediate, hidden),
                                                                         (hidden, intermediate))]
    scales = [w.abs().max().float() / 448 for w in weights]
    fp8 = [(w / s).to(FP8) for w, s in zip(weights, scales)]
    x = torch.randn(tokens, hidden, device=c.device, dtype=torch.bfloat16)
    input_scales = []  # static, as a calibrated checkpoint's: each linear's input range on this batch

    def run(w8a8: bool):
        h = x
        for k, (w, s) in enumerate(zip(fp8, scales)):
            if len(input_scales) < len(fp8):
                input_scales.append(h.abs().amax().float() / 448)
            h = (w8a8_linear(h, w, s, input_scales[k], None) if w8a8 else
                 torch.nn.functional.linear(h, w.to(h.dtype) * s.to(h.dtype)))
        return h

    times = {}
    for mode in (False, True):
        run(mode)
        c.sync()
        start = time.perf_counter()
        for _ in range(5):
            out = run(mode)
        c.sync()
        times[mode] = ((time.perf_counter() - start) / 5, out)
    return times[True][0] / times[False][0], relative(times[True][1], times[False][1])


def check_modelopt_w8a8(c: Check) -> None:
    """An official FP8 checkpoint's two arithmetics on one media layer's linears at Edge and Nano widths (a 4096-token
    batch on a GPU): W8A8 (`torch._scaled_mm` where the GPU has fp8 matmuls) against W8A16, time and difference."""
    from cosmos3_runtime.devices import facts

    figures = []
    for variant in ("edge", "nano"):
        r = RELEASED[variant]
        H, I = (r["hidden_size"], r["intermediate_size"]) if c.full else (256, 512)
        ratio, difference = w8a8_against_w8a16(c, H, I, 4096 if c.full else 64)
        figures.append(f"{variant} W8A8 {ratio:.2f}x the time of W8A16, difference {difference:.3f}")
    c.row("official FP8: W8A8 vs W8A16", True, f"{'; '.join(figures)} (fp8 GEMM: {facts(c.device).fp8_tensorwise})")


def check_w8a8_emulation(c: Check) -> None:
    """W8A8 where the GPU has no fp8 GEMM (A100, RTX 30xx): this device's record with fp8_tensorwise off, so
    `w8a8_linear` takes its emulation, against W8A16 at Nano width (4096 tokens on a GPU)."""
    from cosmos3_runtime import devices

    record = devices.facts(c.device)
    devices.remember(c.device, dataclasses.replace(record, fp8_tensorwise=False))
    try:
        H, I = (RELEASED["nano"]["hidden_size"], RELEASED["nano"]["intermediate_size"]) if c.full else (256, 512)
        ratio, difference = w8a8_against_w8a16(c, H, I, 4096 if c.full else 64)
    finally:
        devices.remember(c.device, record)
    c.row("W8A8 emulation path (no fp8 GEMM) vs W8A16", True,
          f"Nano width ({H}/{I}): {ratio:.2f}x the time of W8A16, difference {difference:.3f}")


def check_reasoner_decoding(c: Check) -> None:
    """Tokens per second of the Reasoner (the tiny Nano-layout checkpoint) eager, compiled (CUDA graphs on a GPU)
    and with its text tower in GGUF Q8_0 (expanded once per answer); the compiled answer's first 16 tokens equal the
    eager one's, but where the first that differs was a near-tie of the eager logits (their gap within the two runs'
    logit difference at that step): the random model's logits lie close, and the CPU's inductor answer parts from the
    eager one at its 5th token over a 0.03 gap."""
    root = tiny(c, kind="gated")
    pipe = cosmos3_runtime.load(root, device=c.device, dtype="bf16", parts="reasoner")
    ask = dict(max_new_tokens=128 if c.full else 16, temperature=0.0, keep_logits=True)
    pipe.reason("Tell me a story.", **ask)  # warm-up
    eager = pipe.reason("Tell me a story.", **ask)
    start = time.perf_counter()
    pipe.reason("Tell me a story.", **ask, compile=True)
    compile_s = time.perf_counter() - start
    compiled = pipe.reason("Tell me a story.", **ask, compile=True)
    rate = lambda a: len(a.token_ids) / a.decode_seconds
    figure = (f"eager {rate(eager):.0f} tokens/s, compiled {rate(compiled):.0f} tokens/s (first answer "
              f"{compile_s:.0f} s)")
    c.log.write(f"eager tokens {eager.token_ids}\ncompiled tokens {compiled.token_ids}\n")
    ok, parted = eager.token_ids[:16] == compiled.token_ids[:16], ""
    pairs = list(zip(eager.token_ids[:16], compiled.token_ids[:16]))
    n = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    if n is not None:  # the same context up to here: the two runs' logits at step n compare
        mine, theirs = eager.logits[n], compiled.logits[n]
        gap, moved = (mine[pairs[n][0]] - mine[pairs[n][1]]).item(), (mine - theirs).abs().max().item()
        ok = gap <= moved
        parted = (f"; the first {n} tokens equal, then eager's pick led the compiled one's by {gap:.3f} (the runs' "
                  f"logits differ by up to {moved:.3f} there)")
    if importlib.util.find_spec("gguf") is not None:
        from cosmos3_runtime.weights.gguf_convert import convert

        path = c.folder / "reasoner-q8_0.gguf"
        convert(root, path, "q8_0")
        quantized = cosmos3_runtime.load(root, device=c.device, dtype="bf16", transformer_file=path)
        quantized.reason("Tell me a story.", **ask)
        figure += f", GGUF Q8_0 text tower {rate(quantized.reason('Tell me a story.', **ask)):.0f} tokens/s"
    c.row("Reasoner decoding", ok, figure + parted)


def check_vae_layouts(c: Check) -> None:
    """The VAE decode of a 480p chunk (released widths; the tiny VAE at 64x64x5 elsewhere) with cuDNN autotuning and
    with channels-last 3-D (Conv3d weights and the latents), each against the default, to decide whether the pack
    should turn them on."""
    pipe = released_pipeline(c, TransformerConfig(**{**RELEASED["edge"], "num_hidden_layers": 2}))
    shape = (6, 30, 52) if c.full else (2, 4, 4)  # 832x480x21 or 64x64x5 (the CPU's bf16 3-D convolutions are slow)
    latents = torch.randn(1, pipe.vae.config.z_dim, *shape, device=c.device)
    times = {}
    try:
        for name in ("default", "cudnn.benchmark", "channels_last_3d"):
            torch.backends.cudnn.benchmark = name == "cudnn.benchmark"
            if name == "channels_last_3d":  # last: the weights stay converted (this pipeline is the check's own)
                latents = latents.contiguous(memory_format=torch.channels_last_3d)
                # only the 5-D weights: Module.to(memory_format=channels_last_3d) raises on the 2-D convolutions' 4-D
                # weights (and the 1-D ones)
                for m in pipe.vae.modules():
                    if isinstance(m, torch.nn.Conv3d) or getattr(m, "weight", None) is not None and m.weight.dim() == 5:
                        m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last_3d)
            pipe.decode(latents)  # warm-up (and autotuning)
            c.sync()
            start = time.perf_counter()
            pipe.decode(latents)
            c.sync()
            times[name] = time.perf_counter() - start
    finally:
        torch.backends.cudnn.benchmark = False
    size = "832x480x21" if c.full else "64x64x5"
    c.row(f"VAE decode layouts, {size}", True, ", ".join(f"{k} {v:.2f} s ({v / times['default']:.2f}x)"
                                                       for k, v in times.items()))


def check_speed_table(c: Check) -> None:
    bench = [sys.executable, str(ROOT / "benchmarks" / "bench_memory.py"), "--measure", "--no-table", "--steps", "2",
             "--device", str(c.device.type)]
    options = ["default", "fp8", "offload_text", "blocks_to_swap=8"]
    if scaled_fp8_available(c.device):
        options.append("fp8_scaled")
    if importlib.util.find_spec("gguf") is not None:
        options += ["gguf Q8_0", "gguf Q4_0"]
    runs = [("edge", ["--options", *options] + ([] if c.full else ["--layers", "2", "--size", "128x96x9"]))]
    if c.full and torch.cuda.get_device_properties(0).total_memory > 80 * 2**30:
        runs.append(("nano", ["--options", "default", "fp8", *(["gguf Q4_0"] if "gguf Q4_0" in options else [])]))
    for variant, extra in runs:
        timeout = min(240, c.left())
        try:
            done = subprocess.run(bench + ["--variant", variant, *extra], capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as stopped:  # the rows it printed before the deadline still count
            printed = stopped.stdout.decode() if isinstance(stopped.stdout, bytes) else stopped.stdout or ""
            c.say(printed.rstrip())
            c.row(f"speed table, {variant}", None, f"stopped after {timeout:.0f} s (the deadline)")
            continue
        c.say(done.stdout.rstrip())
        c.log.write(done.stderr)
        c.row(f"speed table, {variant}", done.returncode == 0,
              f"bench_memory.py exited with {done.returncode}" + ("" if done.returncode == 0 else
                                                                   f": {done.stderr.strip().splitlines()[-1:]}"))


def check_workloads(c: Check) -> None:
    """NVIDIA's two shortest published workloads (`bench_workloads.py`: Edge image-to-video 480p x121, Nano
    text-to-image 480p; bf16 and official FP8, SeaCache off and on, after a warm-up; tiny sizes elsewhere): seconds
    end to end and per stage beside NVIDIA's figures for this GPU. The others take minutes each (its docstring)."""
    path = c.folder / "workloads.json"
    bench = [sys.executable, str(ROOT / "benchmarks" / "bench_workloads.py"), "--warmup", "--device", c.device.type,
             "--only", "edge-i2v-480p", "nano-t2i-480p", "--json", str(path)]
    timeout = min(420, c.left())
    try:
        done = subprocess.run(bench, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as stopped:  # the rows it printed before the deadline still count
        c.say(stopped.stdout.decode() if isinstance(stopped.stdout, bytes) else stopped.stdout or "")
        raise Skip(f"stopped after {timeout:.0f} s (the deadline)") from None
    c.say(done.stdout.rstrip())
    c.log.write(done.stderr)
    rows = [r for r in json.loads(path.read_text())["rows"] if "error" not in r] if path.exists() else []
    figures = [f"{r['workload']} {r['precision']} {r['cache']} {r['total_s']:.1f} s"
               + ("" if r["ratio"] is None else f" ({r['ratio']:.2f}x NVIDIA's)") for r in rows]
    c.row("NVIDIA's workloads", done.returncode == 0,
          "; ".join(figures) or f"bench_workloads.py exited with {done.returncode}: {done.stderr.strip()[-300:]}")


CHECKS = [  # the most valuable first: the deadline skips what is left
    ("bf16", check_bf16), ("low VRAM", check_low_vram), ("fp8", check_fp8), ("fp8_scaled", check_fp8_scaled),
    ("GGUF", check_gguf), ("host placement", check_host_placement), ("transfer", check_transfer),
    ("causal", check_causal), ("session", check_session), ("causal graphs", check_chunk_step),
    ("session latency", check_session_latency), ("transfer fps", check_transfer_fps), ("audio", check_audio),
    ("Reasoner", check_reasoner),
    ("device record", check_device_record), ("attention kernels", check_attention_kernels),
    ("compiled block", check_compiled_block), ("first load", check_first_load), ("SDPA kernels", check_sdpa_backends),
    ("W8A8 emulation", check_w8a8_emulation), ("SeaCache", check_seacache), ("VAE layouts", check_vae_layouts),
    ("Reasoner decoding", check_reasoner_decoding),
    ("profile", check_profile), ("generate stages", check_generate_stages),
    ("block swap memory", check_block_swap_memory), ("GGUF dequantization", check_gguf_dequant),
    ("official FP8", check_modelopt_w8a8), ("speed table", check_speed_table), ("workloads", check_workloads),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu: the code paths at tiny sizes")
    parser.add_argument("--log", default="gpu_check.log", help="where every figure and traceback goes")
    parser.add_argument("--only", nargs="+", default=(), help="run only these checks (names as in CHECKS)")
    parser.add_argument("--deadline", type=float, help="seconds after which no further check starts (they are "
                        "skipped; the summary still prints); default 420 on a GPU (gpu_check.sh's timeout is 470), "
                        "none elsewhere (a CPU shared with other work may take longer, and no wrapper kills it)")
    args = parser.parse_args()
    device = torch.device(args.device)
    seconds = args.deadline if args.deadline is not None else 420.0 if device.type == "cuda" else float("inf")
    deadline = time.perf_counter() + seconds
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for the code paths at tiny sizes")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        c = Check(device, Path(args.log), Path(tmp), deadline)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
        c.say(f"GPU check on {name}, torch {torch.__version__}, log {Path(args.log).resolve()}")
        signal.signal(signal.SIGTERM, stop)
        try:
            for check_name, function in CHECKS:
                if args.only and check_name not in args.only:
                    continue
                if time.perf_counter() >= c.deadline:
                    c.row(check_name, None, "deadline reached")
                else:
                    c.run(check_name, function)
        except Stopped:  # between two checks: those not reached are missing from the table
            c.say("stopped by SIGTERM")
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the table prints whole
        return 0 if c.summary() else 1


if __name__ == "__main__":
    sys.exit(main())
