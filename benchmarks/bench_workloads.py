"""NVIDIA's published Cosmos3 workloads on the pack's runtime: seconds, end to end and by stage, and NVIDIA's figures.

    python benchmarks/bench_workloads.py [--only NAME ...] [--precision bf16 fp8] [--cache off default] [--steps N]
                                         [--device cuda] [--warmup] [--tiny] [--json PATH]

On a GPU, the whole table (about 35 minutes on an H200, estimated below):
    python benchmarks/bench_workloads.py --warmup --json workloads.json
The two shortest, which `gpu_check.py` runs (its check "workloads": 3 to 4 minutes with the four compiles):
    python benchmarks/bench_workloads.py --warmup --only edge-i2v-480p nano-t2i-480p
The rest in commands under 10 minutes each (a lent machine's limit), each with a --json of its own:
    --warmup --only nano-t2v-256p nano-t2v-480p --precision bf16      (~4 min; and --precision fp8, ~4 min)
    --warmup --only nano-i2v-480p --precision bf16                    (~3.5 min; and --precision fp8, ~3 min)
    --warmup --only nano-t2v-720p --precision bf16 --cache off        (~5 min; and each of the other three
                                                                       precision x cache pairs, 4 to 5 min)
    --warmup --only nano-transfer-480p --precision bf16               (~5 min; and --precision fp8, ~4.5 min)
On a CPU (or with --tiny): the same code on the tiny checkpoints (`tiny.make_tiny_checkpoint`, their own weights
and VAE) at 64x48 (9 frames; images 1), 2 steps: well under a minute.

Each workload (WORKLOADS) is NVIDIA's (one GPU, batch 1; NVIDIA/cosmos inference_benchmarks/cosmos3-edge-generator.md,
cosmos3-nano-generator.md, cosmos3-nano-fp8-generator.md), run with random weights in the released shapes (Edge,
Nano: `bench_memory.random_model`; the VAE at its released widths, as `gpu_check.random_pipeline` makes it) and the
tiny checkpoint's tokenizer, configs and variant (Edge's or the gated one's defaults): speed and memory, not quality.
What a run sets: size, frames, the image (i2v) or edge control clip (transfer), and --steps when given; all
else is `Request()`'s default. So video takes 35 steps with CFG (Edge guidance 5, Nano 4; flow shift 3 on Edge, 10
on Nano), T2I 35 steps at guidance 4 inside timesteps [400, 1000] (shift 3), the transfer the model authors' values:
50 steps, guidance 3, control guidance 1.5 (three passes a step), shift 10; each row's settings are printed.

Each row is one generation, `pipe.generate(..., output="frames")` as a user calls it, in one precision and cache:
- precision bf16: the random bf16 model; fp8: NVIDIA's official FP8 as a loaded checkpoint holds it (`official_fp8`):
  every linear inside the layers (both towers; not proj_in, proj_out or the time embedder) fp8 with one tensorwise
  weight scale and a static input scale, W8A8 throughout (no step policy: no W8A16 first or last steps);
- cache off, or default: `Request()`'s step cache (SeaCache at its default settings);
- ours: seconds end to end (planning, the image or control encode, text, steps, decode, the frames to the CPU);
  text: the prompts' encoding (`denoiser.encode_prompts`); steps: the sampling steps (from the step callback), with
  the transformer's forward passes run and skipped (SeaCache's count; off: every pass runs); decode: the VAE decodes
  (`codec.decode_pixels`); other: the rest (the image or controls encoded, noise, copies). The GPU is synchronized
  at every mark, so each stage holds its kernels. Peak: `torch.cuda.max_memory_allocated` over the run, weights
  included;
- NVIDIA: its PyTorch figure in the row's precision and ours / NVIDIA, then its other engines for reference, for the
  GPU this runs on (H200 or B200, the SXM parts; on any other GPU ours alone).
--warmup runs one untimed 1-step generation per workload and precision first (torch.compile of the media block,
first-call kernel choices and allocations excluded); each model then compiles afresh (`torch._dynamo.reset`), as in
a process of its own. One model is held at a time (Nano: 26.8 GiB in bf16, about half in FP8), freed before the next.

Time on an H200 (estimated, not measured: from docs/memory-and-gpus.md's 1.91 s a Nano step at 1280x720x81, i.e.
19,320 media tokens, two passes; 0.19 s an Edge step at 832x480x81, 8,190 tokens; 2.1 s its VAE decode; attention
grows with the square of the tokens), bf16, cache off: edge-i2v-480p 12,090 tokens, ~0.3 s a step, ~15 s;
nano-t2v-256p 2,880 tokens, ~9 s; nano-t2v-480p and nano-i2v-480p 18,720 tokens, ~1.85 s a step, ~70 s each;
nano-t2v-720p 44,160 tokens, ~7 s a step, ~250 s; nano-t2i-480p 390 tokens, ~3 s; nano-transfer-480p 18,720 tokens
(93 frames and their control), 150 passes, ~145 s. A workload's four rows take about 3.2 times that (SeaCache
~0.7x, FP8 ~0.9x, guessed), plus per model a warm-up step and a compile (~1 min).
Not a test: numbers depend on the machine.
"""

import argparse
import gc
import json
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from gpu_check import random_pipeline  # noqa: E402
from torch import nn  # noqa: E402

import cosmos3_runtime  # noqa: E402
from cosmos3_runtime.kinds import Controlled  # noqa: E402
from cosmos3_runtime.weights.format import weight_bytes  # noqa: E402
from cosmos3_runtime.weights.fp8 import FP8, FP8_MAX  # noqa: E402
from cosmos3_runtime.weights.modelopt_fp8 import ModelOptFp8, remember_input_ranges  # noqa: E402
from cosmos3_runtime.tiny import RELEASED, make_tiny_checkpoint  # noqa: E402
from cosmos3_runtime.transformer import DecoderLayer, TransformerConfig, pathway_of  # noqa: E402

GIB = 2**30
PROMPT = "A robot arm picks up a red cube from a wooden table and places it in a blue bin beside it."
# NVIDIA's engines; a row's own precision is compared with PyTorch's figure, the rest are printed for reference
COLUMNS = ("PyTorch BF16", "vLLM-Omni BF16", "Diffusers BF16", "PyTorch FP8", "Diffusers FP8", "NIM FP8")
SAME_PRECISION = {"bf16": "PyTorch BF16", "fp8": "PyTorch FP8"}
GPUS = ("H200", "B200")  # the SXM parts of NVIDIA's tables
PRECISIONS, CACHES = ("bf16", "fp8"), ("off", "default")
TINY_SIZE, TINY_STEPS = (64, 48, 9), 2
NOTES = (
    "NVIDIA's pages do not state the steps or the cache of a table; its framework's defaults are 35 steps with CFG "
    "for video (guidance 6, flow shift 10) and 50 steps at guidance 4 for T2I, and its inference CLI runs SeaCache by "
    "default since 2026-08-20.",
    "NVIDIA's PyTorch FP8 is static per-tensor W8A8 on every linear of both towers (not proj_in, proj_out or the time "
    "embedder), with no higher-precision first or last steps: the fp8 rows run the same.",
    "NVIDIA's PyTorch figures are average generation latency (Nano: 'generation (sampling)'; Edge: 'not "
    "diffusion-only'); its NIM figures FP8 latency profiles, request latency end to end; ours are end to end.",
    "The transfer runs one 93-frame chunk (NVIDIA's chunk): NVIDIA's FP8 transfer (56.78 s) is 2.14x its FP8 T2V "
    "480p x189 (26.59 s), as 50 steps of three passes against 35 of two over the same tokens (93 frames beside "
    "their control) are; 189 frames would take three chunks.",
    "Random weights in the released shapes: speed and memory, not quality.",
)


def figures(*seconds: float | None) -> dict[str, float]:
    """NVIDIA's seconds in COLUMNS order (None: no figure)."""
    return {column: s for column, s in zip(COLUMNS, seconds) if s is not None}


@dataclass(frozen=True)
class Workload:
    name: str
    title: str  # as NVIDIA's tables name it
    kind: str  # "edge" or "nano"
    mode: str  # "t2v", "i2v", "t2i" or "transfer"
    width: int
    height: int
    frames: int
    nvidia: dict[str, dict[str, float]]  # GPU -> {column: seconds}


WORKLOADS = (
    Workload("edge-i2v-480p", "Edge I2V 480p x121", "edge", "i2v", 832, 480, 121,
             {"H200": figures(12.31, 13.13), "B200": figures(7.45)}),
    Workload("nano-t2v-256p", "Nano T2V 256p x189", "nano", "t2v", 320, 192, 189,
             {"H200": figures(7.53, 6.79, 9.00, 3.09, None, 5.72)}),
    Workload("nano-t2v-480p", "Nano T2V 480p x189", "nano", "t2v", 832, 480, 189,
             {"H200": figures(60.18, 58.14, 67.00, 26.59, 68.32, 51.90), "B200": figures(33.20, None, None, 14.85)}),
    Workload("nano-i2v-480p", "Nano I2V 480p x189", "nano", "i2v", 832, 480, 189,
             {"H200": figures(60.51, 59.64, 67.20, 25.56, 69.69, 53.25)}),
    Workload("nano-t2v-720p", "Nano T2V 720p x189", "nano", "t2v", 1280, 720, 189,
             {"H200": figures(214.28, 208.36, 239.60, 94.57, 237.18, 200.63)}),
    Workload("nano-t2i-480p", "Nano T2I 480p", "nano", "t2i", 832, 480, 1,
             {"H200": figures(3.04, 1.52, 3.00, 1.14, 7.44, 1.18)}),
    Workload("nano-transfer-480p", "Nano transfer, edge, 480p", "nano", "transfer", 832, 480, 93,
             {"H200": figures(None, None, None, 56.78, 169.21)}),
)


def nvidia_gpu(name: str | None) -> str | None:
    """The GPU of NVIDIA's tables a device is (None: not listed; an NVL card's figures differ from the SXM part's)."""
    if name is None or "NVL" in name:
        return None
    return next((gpu for gpu in GPUS if gpu in name), None)


def synchronized(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Stages:
    """One generation's stages, timed around the pipeline's own calls (the prompts' encoding, the VAE decodes) and
    from its step callback; the transformer's forward passes counted."""

    def __init__(self, pipe, device: torch.device):
        self.pipe, self.device = pipe, device
        self.text = self.decode = 0.0
        self.steps: list[float] = []
        self.passes = 0
        self.last = 0.0  # the end of the last stage timed: a step runs from there to its callback

    def timed(self, function, stage: str):
        def run(*args, **kwargs):
            start = synchronized(self.device)
            try:
                return function(*args, **kwargs)
            finally:
                self.last = synchronized(self.device)
                setattr(self, stage, getattr(self, stage) + self.last - start)
        return run

    def step(self, *_) -> None:
        now = synchronized(self.device)
        self.steps.append(now - self.last)
        self.last = now

    def count(self, *_) -> None:
        self.passes += 1

    def __enter__(self):
        denoiser, codec = self.pipe.denoiser, self.pipe.codec
        denoiser.encode_prompts = self.timed(denoiser.encode_prompts, "text")
        codec.decode_pixels = self.timed(codec.decode_pixels, "decode")  # codec.decode decodes through it too
        self.hook = self.pipe.transformer.register_forward_pre_hook(self.count)
        return self

    def __exit__(self, *_):
        del self.pipe.denoiser.encode_prompts, self.pipe.codec.decode_pixels  # the classes' methods again
        self.hook.remove()


def forwards(report: str | None, passes: int) -> tuple[int, int]:
    """(run, skipped) of a generation's forward passes, from its step cache's report (None: off, every pass ran)."""
    if report is None:
        return passes, 0
    found = re.fullmatch(r"SeaCache: (\d+) forwards run, (\d+) skipped", report)
    if found is None:
        raise RuntimeError(f"unexpected step cache report {report!r}")
    return int(found[1]), int(found[2])


def official_fp8(pipe, calibration: dict) -> None:
    """The transformer as a loaded official FP8 checkpoint holds it, from its bf16 weights: the format's own shells
    (`ModelOptFp8.build`, given the headers such a checkpoint has) for every linear inside the layers, each filled as
    `load_weights` fills it (fp8 weight, its one tensorwise scale, a static input scale), then
    `remember_input_ranges`. Input scales are calibrated as ModelOpt's max calibration does (amax / 448), on one
    eager generation of `calibration`, so linears reading one activation (q, k, v; gate, up) share its range."""
    model = pipe.transformer
    linears = {name: m for name, m in model.named_modules() if name.startswith("layers.") and isinstance(m, nn.Linear)}
    ranges = {}

    def observe(name: str):
        def hook(_, args):
            amax = args[0].detach().abs().amax().float()
            ranges[name] = amax if name not in ranges else torch.maximum(ranges[name], amax)
        return hook

    handles = [m.register_forward_pre_hook(observe(name)) for name, m in linears.items()]
    try:
        pipe.generate(PROMPT, **calibration)
    finally:
        for handle in handles:
            handle.remove()
    pipe.denoiser.text_cache.clear()  # the bf16 text tower's K/V
    scalar = {"dtype": "F32", "shape": []}
    headers = {}
    for name, m in linears.items():
        headers.update({f"{name}.weight": {"dtype": "F8_E4M3", "shape": list(m.weight.shape)},
                        f"{name}.weight_scale": scalar, f"{name}.input_scale": scalar})
    ModelOptFp8(None, headers).build(model, lambda key: key, pathway_of)
    with torch.no_grad():
        for name in list(linears):
            weight = linears.pop(name).weight.float()  # its bf16 copy goes as its shell is filled
            scale = weight.abs().amax() / FP8_MAX
            model.get_submodule(name).load_state_dict(
                {"weight": (weight / scale).to(FP8), "scale": scale,
                 "input_scale": ranges[name].clone() / FP8_MAX}, strict=False, assign=True)  # (out of inference mode)
    remember_input_ranges(model)


def build(kind: str, precision: str, device: torch.device, tiny: bool, folder: Path):
    """A pipeline of `kind` in `precision`: the tiny checkpoint's own weights (`tiny`), or random ones in the released
    shapes."""
    root = folder / kind
    if not root.exists():
        make_tiny_checkpoint(root, kind="edge" if kind == "edge" else "gated", reasoner=False)
    if tiny:
        pipe = cosmos3_runtime.load(root, device=device, dtype="bf16")
    else:
        pipe = random_pipeline(root, TransformerConfig(**RELEASED[kind]), device)
    if precision == "fp8":
        width, height, frames = TINY_SIZE if tiny else (256, 256, 5)
        official_fp8(pipe, dict(width=width, height=height, num_frames=frames, steps=1, output="latents", cache="off",
                                compile=False))  # eager: hooks inside a compiled block would not run as written
    return pipe


def request(w: Workload, tiny: bool, steps: int | None) -> dict:
    """The options a workload sets; everything else is `Request()`'s default."""
    width, height, frames = TINY_SIZE if tiny else (w.width, w.height, w.frames)
    frames = 1 if w.mode == "t2i" else frames
    options = dict(width=width, height=height, num_frames=frames, steps=TINY_STEPS if tiny and steps is None else steps)
    g = torch.Generator().manual_seed(0)
    if w.mode == "i2v":
        options["image"] = torch.rand(1, height, width, 3, generator=g)
    elif w.mode == "transfer":
        options["control_videos"] = {"edge": torch.rand(frames, height, width, 3, generator=g)}
    return options


def warm_up(pipe, w: Workload, options: dict) -> None:
    """One untimed step at the workload's size (compile and first calls), and a decode of its first latent frame (a
    transfer hands back frames only: it decodes them all)."""
    if w.mode == "transfer":
        pipe.generate(PROMPT, **{**options, "steps": 1})
    else:
        pipe.decode(pipe.generate(PROMPT, **{**options, "steps": 1, "output": "latents"}).latents[:, :, :1])


def measure(pipe, w: Workload, precision: str, cache: str, options: dict, device: torch.device, gpu: str | None) -> dict:
    pipe.denoiser.text_cache.clear()  # the text tower runs in every row
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with Stages(pipe, device) as stages:
        start = synchronized(device)
        result = pipe.generate(PROMPT, **options, callback=stages.step, **({"cache": "off"} if cache == "off" else {}))
        total = synchronized(device) - start
    s, kind = result.settings, result.settings.kind
    run, skipped = forwards(result.cache, stages.passes)
    nvidia = w.nvidia.get(gpu, {})
    same = nvidia.get(SAME_PRECISION[precision])
    return dict(
        workload=w.name, title=w.title, precision=precision, cache=cache, width=s.width, height=s.height,
        frames=s.num_frames, steps=s.steps, guidance=s.guidance_scale, guidance_interval=s.guidance_interval,
        flow_shift=s.flow_shift, control_guidance=kind.controls.control_guidance if isinstance(kind, Controlled) else None,
        chunks=1 if kind.chunks is None else kind.chunks.count, compiled=pipe.denoiser.hooks.block is not DecoderLayer.media,
        total_s=total, text_s=stages.text, steps_s=sum(stages.steps), decode_s=stages.decode,
        other_s=total - stages.text - sum(stages.steps) - stages.decode, passes=stages.passes, forwards_run=run,
        forwards_skipped=skipped, weights_gib=weight_bytes(pipe.transformer) / GIB,
        peak_gib=torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None,
        nvidia=nvidia, ratio=None if same is None else total / same)


def seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def print_table(rows: list[dict], gpu: str | None) -> None:
    reference = [c for c in COLUMNS if c not in SAME_PRECISION.values()]
    print(f"\n| workload | precision | cache | ours s | text s | steps s (forwards run / skipped) | decode s | other s "
          f"| peak GiB | NVIDIA PyTorch, same precision ({gpu or 'GPU not listed'}) s | ours / NVIDIA | "
          + " | ".join(f"{c} s" for c in reference) + " |")
    print("|---" * (11 + len(reference)) + "|")
    for r in rows:
        if "error" in r:
            print(f"| {r['workload']} | {r['precision']} | {r['cache']} | failed: {r['error']} |")
            continue
        same = r["nvidia"].get(SAME_PRECISION[r["precision"]])
        print(f"| {r['workload']} | {r['precision']} | {r['cache']} | {r['total_s']:.2f} | {r['text_s']:.2f} | "
              f"{r['steps_s']:.2f} ({r['forwards_run']} / {r['forwards_skipped']}) | {r['decode_s']:.2f} | "
              f"{r['other_s']:.2f} | {seconds(r['peak_gib'])} | {seconds(same)} | {ratio(r['ratio'])} | "
              + " | ".join(seconds(r["nvidia"].get(c)) for c in reference) + " |")


def failed(w: Workload, precision: str, cache: str, what: str, exc: Exception) -> dict:
    return dict(workload=w.name, precision=precision, cache=cache,
                error=f"{what}: {type(exc).__name__}: {exc}".splitlines()[0][:300])


def workload_rows(pipe, w: Workload, precision: str, args, device: torch.device, tiny: bool, gpu: str | None) -> list:
    """A workload's rows in one precision, one per cache (a failed run is its row's result), after its warm-up."""
    options = request(w, tiny, args.steps)
    try:
        if args.warmup:
            warm_up(pipe, w, options)
    except Exception as exc:  # noqa: BLE001 - its rows say so; the next workload may run
        return [failed(w, precision, c, "warm-up", exc) for c in args.cache]
    rows = []
    for cache in args.cache:
        try:
            row = measure(pipe, w, precision, cache, options, device, gpu)
            print(f"{w.name} {precision} {cache}: {row['total_s']:.2f} s (text {row['text_s']:.2f}, steps "
                  f"{row['steps_s']:.2f}, decode {row['decode_s']:.2f})", flush=True)
        except Exception as exc:  # noqa: BLE001 - one failed run is that row's result
            row = failed(w, precision, cache, "run", exc)
            print(f"{w.name} {precision} {cache}: {row['error']}", flush=True)
        rows.append(row)
    return rows


def settings_line(r: dict) -> str:
    cfg = ("no CFG" if r["guidance"] == 1.0 else f"guidance {r['guidance']:g}" +
           (f" inside timesteps {r['guidance_interval']}" if r["guidance_interval"] else " every step"))
    control = "" if r["control_guidance"] is None else f", control guidance {r['control_guidance']:g}"
    return (f"{r['workload']} ({r['title']}): {r['width']}x{r['height']}x{r['frames']} in {r['chunks']} "
            f"window{'s' * (r['chunks'] > 1)}, {r['steps']} steps, {cfg}{control}, flow shift {r['flow_shift']}, "
            f"media block {'compiled' if r['compiled'] else 'eager'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=(), metavar="NAME", help="these workloads: "
                        + ", ".join(w.name for w in WORKLOADS))
    parser.add_argument("--precision", nargs="+", choices=PRECISIONS, default=PRECISIONS)
    parser.add_argument("--cache", nargs="+", choices=CACHES, default=CACHES,
                        help="off, or default (Request()'s: SeaCache)")
    parser.add_argument("--steps", type=int, help="steps of every workload (default: the pack's: 35; the transfer "
                        f"50; --tiny {TINY_STEPS})")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--warmup", action="store_true", help="one untimed 1-step run per workload and precision "
                        "first (compile, first calls)")
    parser.add_argument("--tiny", action="store_true", help="the tiny checkpoints at toy sizes (always on a CPU)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    unknown = set(args.only) - {w.name for w in WORKLOADS}
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(sorted(unknown))}; workloads: "
                     + ", ".join(w.name for w in WORKLOADS))
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: --device cpu runs the tiny sizes")
    tiny = args.tiny or device.type != "cuda"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    gpu = nvidia_gpu(name)
    chosen = [w for w in WORKLOADS if not args.only or w.name in args.only]
    print(f"{name or device.type}, torch {torch.__version__}; "
          + ("tiny checkpoints at toy sizes" if tiny else "random weights in the released shapes")
          + f"; NVIDIA's figures: {gpu or 'none for this device'}")
    print("warm-up: one untimed 1-step run per workload and precision first, compile and first calls excluded"
          if args.warmup else "no warm-up: each workload's first timed run includes its compile and first calls "
          "(--warmup excludes them)")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for kind in ("edge", "nano"):
            mine = [w for w in chosen if w.kind == kind]
            for precision in args.precision if mine else ():
                try:
                    pipe = build(kind, precision, device, tiny, Path(folder))
                except Exception as exc:  # noqa: BLE001 - reported in its rows; the next model may fit
                    rows += [failed(w, precision, c, "building the model", exc) for w in mine for c in args.cache]
                else:
                    print(f"{kind} {precision}: transformer weights {weight_bytes(pipe.transformer) / GIB:.1f} GiB",
                          flush=True)
                    for w in mine:
                        rows += workload_rows(pipe, w, precision, args, device, tiny, gpu)
                    del pipe
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                # each model compiles afresh: in one process the models' graphs would reach dynamo's recompile limit,
                # past which the media block silently runs eagerly
                torch._dynamo.reset()
    order = {(w.name, p, c): i for i, (w, p, c) in enumerate(
        (w, p, c) for w in WORKLOADS for p in PRECISIONS for c in CACHES)}
    rows.sort(key=lambda r: order[r["workload"], r["precision"], r["cache"]])
    print_table(rows, gpu)
    print()
    said = set()
    for r in rows:
        if "error" not in r and r["workload"] not in said:
            said.add(r["workload"])
            print(settings_line(r))
    print("\n" + "\n".join(f"- {note}" for note in NOTES))
    if args.json:
        args.json.write_text(json.dumps(dict(device=name or device.type, torch=torch.__version__, tiny=tiny,
                                             warmup=args.warmup, nvidia_gpu=gpu, notes=NOTES, rows=rows), indent=2))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
