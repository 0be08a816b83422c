"""Command line: `python -m cosmos3_runtime {demo,info,make-tiny} ...`."""

import argparse
import sys
import tempfile
import time

import torch

from .errors import Cosmos3Error
from .pipeline import load
from .tiny import KINDS, SIZES, make_tiny_checkpoint


def cmd_make_tiny(args) -> None:
    root = make_tiny_checkpoint(args.folder, kind=args.kind, size=args.size, distilled=args.distilled)
    print(f"wrote a random {args.size} {args.kind} checkpoint to {root}")


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

    for p in (sub.choices["demo"], p):
        p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
        p.add_argument("--dtype", default=None, help="auto, bf16, fp16, fp32 (default: bf16 on GPU, fp32 on CPU)")

    p = sub.add_parser("make-tiny", help="write a tiny random checkpoint in the released layout")
    p.add_argument("folder")
    p.add_argument("--kind", choices=KINDS, default="gated")
    p.add_argument("--size", choices=sorted(SIZES), default="tiny")
    p.add_argument("--distilled", action="store_true")
    p.set_defaults(run=cmd_make_tiny)

    args = parser.parse_args(argv)
    try:
        args.run(args)
    except Cosmos3Error as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
