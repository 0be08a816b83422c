"""Command line: `python -m cosmos3_runtime {generate,demo,info,make-tiny} ...`."""

import argparse
import logging
import sys
import tempfile
import time

import torch

from .errors import Cosmos3Error
from .media import save
from .parallel import init_from_env
from .pipeline import load
from .tiny import KINDS, SIZES, make_tiny_checkpoint
from .vae import TileSpec


def cmd_make_tiny(args) -> None:
    root = make_tiny_checkpoint(args.folder, kind=args.kind, size=args.size, distilled=args.distilled)
    print(f"wrote a random {args.size} {args.kind} checkpoint to {root}")


def cmd_generate(args) -> None:
    parallel, device = None, args.device
    if args.sp > 1 or args.cfg_parallel:
        parallel, device = init_from_env(args.sp, args.cfg_parallel)
    main = parallel is None or parallel.is_main
    say = print if main else lambda *a, **k: None
    latents_only = args.output.endswith(".safetensors")
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint is None:
            say("No --checkpoint given: using a tiny RANDOM checkpoint (real layout, meaningless weights); "
                "the output is noise.")  # fmt: skip
            args.checkpoint = make_tiny_checkpoint(tmp, kind=args.kind)
        pipe = load(args.checkpoint, device=device, dtype=args.dtype)
        say(f"{pipe.checkpoint.root}: {pipe.variant.describe()}")
        image = video = None
        if args.image:
            from PIL import Image

            image = Image.open(args.image)
        if args.video:
            import av

            with av.open(args.video) as container:
                video = [frame.to_image() for frame in container.decode(video=0)]
        interval = None if args.guidance_interval == "off" else args.guidance_interval
        if interval not in (None, "auto"):
            interval = tuple(float(v) for v in interval.split(","))
        start = time.perf_counter()

        def progress(step, total, _latents):
            say(f"\rstep {step}/{total}  {time.perf_counter() - start:.1f}s", end="", flush=True)

        result = pipe.generate(
            args.prompt, negative_prompt=args.negative_prompt, width=args.width, height=args.height,
            num_frames=args.frames, fps=args.fps, steps=args.steps, guidance_scale=args.guidance,
            flow_shift=args.flow_shift, schedule=args.schedule, guidance_interval=interval, seed=args.seed,
            image=image, video=video, vae_tile=TileSpec(args.tile, args.tile // 4) if args.tile else None,
            output="latents" if latents_only else "frames", callback=progress, parallel=parallel,
        )  # fmt: skip
        say()
        s = result.settings
        say(f"{s.mode} {s.width}x{s.height}, {s.num_frames} frames @ {s.fps:g} fps, {s.steps} steps "
            f"({s.schedule}), guidance {s.guidance_scale:g}")  # fmt: skip
        if not main:
            return
        if latents_only:
            from safetensors.torch import save_file

            save_file({"latents": result.latents.contiguous()}, args.output)
            paths = [args.output]
        else:
            paths = save(result.frames, args.output, s.fps)
        for path in paths:
            print(f"wrote {path}")


def cmd_info(args) -> None:
    pipe = load(args.checkpoint, device=args.device, dtype=args.dtype)
    config = pipe.transformer.config
    params = sum(p.numel() for p in pipe.transformer.parameters())
    print(f"checkpoint: {pipe.checkpoint.root}")
    print(f"variant:    {pipe.variant.describe()}")
    print(f"backbone:   hidden {config.hidden_size}, {config.num_hidden_layers} layers, "
          f"{config.num_attention_heads}/{config.num_key_value_heads} heads, {params / 1e6:.1f}M parameters loaded")  # fmt: skip


def cmd_demo(args) -> None:
    """Load a checkpoint (a tiny random one unless given) and time one transformer forward."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint is None:
            print("No checkpoint given: building a tiny RANDOM checkpoint (real layout, meaningless weights).")
            args.checkpoint = make_tiny_checkpoint(tmp, kind=args.kind)
        start = time.perf_counter()
        pipe = load(args.checkpoint, device=args.device, dtype=args.dtype)
        print(f"loaded {pipe.checkpoint.root} in {time.perf_counter() - start:.2f}s")
        print(f"variant: {pipe.variant.describe()}")
        model = pipe.transformer
        h, w, frames = args.height // 16, args.width // 16, (args.frames - 1) // 4 + 1
        latents = torch.randn(1, model.config.latent_channel, frames, h, w, generator=torch.Generator().manual_seed(0))
        text = model.encode_text(torch.arange(64) % model.config.vocab_size)
        timestep = torch.tensor(999)
        model(latents, timestep, text)  # warm-up
        if pipe.device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        velocity = model(latents, timestep, text).vision
        if pipe.device.type == "cuda":
            torch.cuda.synchronize()
        tokens = frames * -(-h // 2) * -(-w // 2)
        print(f"one transformer forward, {args.width}x{args.height}x{args.frames} ({tokens} media tokens): "
              f"{(time.perf_counter() - start) * 1000:.1f} ms, velocity {tuple(velocity.shape)}")  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cosmos3_runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate an image or a video")
    p.add_argument("--checkpoint", help="folder or HF repo id (default: a tiny random checkpoint)")
    p.add_argument("--kind", choices=KINDS, default="edge", help="kind of the tiny checkpoint")
    p.add_argument("--prompt", required=True, help="prose or a JSON caption")
    p.add_argument("--negative-prompt", default=None)
    p.add_argument("--output", required=True, help="out.png for an image (--frames 1), out.mp4 for a video, "
                   "out.safetensors for the latents")
    p.add_argument("--width", type=int)
    p.add_argument("--height", type=int)
    p.add_argument("--frames", type=int, help="1 for an image; video frame counts are 1 + 4k (default 81)")
    p.add_argument("--fps", type=float)
    p.add_argument("--steps", type=int)
    p.add_argument("--guidance", type=float)
    p.add_argument("--flow-shift", type=float)
    p.add_argument("--schedule", choices=["auto", "unipc", "checkpoint", "distilled"], default="auto")
    p.add_argument("--guidance-interval", default="auto", help="auto, off, or LOW,HIGH in timesteps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image", help="image file for image-to-video")
    p.add_argument("--video", help="video file for video-to-video")
    p.add_argument("--tile", type=int, default=0, help="decode in tiles of this many latents (0: no tiling)")
    p.add_argument("--sp", type=int, default=1, help="sequence-parallel ranks (under torchrun)")
    p.add_argument("--cfg-parallel", action="store_true", help="run the two CFG branches on separate ranks")
    p.set_defaults(run=cmd_generate)
    generate = p

    p = sub.add_parser("demo", help="load a checkpoint and time one transformer forward")
    p.add_argument("--checkpoint", help="folder or HF repo id (default: a tiny random checkpoint)")
    p.add_argument("--kind", choices=KINDS, default="edge", help="kind of the tiny checkpoint")
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--frames", type=int, default=9)
    p.set_defaults(run=cmd_demo)

    p = sub.add_parser("info", help="print a checkpoint's detected variant")
    p.add_argument("checkpoint")
    p.set_defaults(run=cmd_info)

    for loading in (generate, sub.choices["demo"], sub.choices["info"]):
        loading.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
        loading.add_argument("--dtype", default=None, help="auto, bf16, fp16, fp32 (default: bf16 on GPU, fp32 on CPU)")

    p = sub.add_parser("make-tiny", help="write a tiny random checkpoint in the released layout")
    p.add_argument("folder")
    p.add_argument("--kind", choices=KINDS, default="gated")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--distilled", action="store_true")
    p.set_defaults(run=cmd_make_tiny)

    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s: %(message)s", level=logging.WARNING)  # settings notes, load warnings
    try:
        args.run(args)
    except Cosmos3Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
