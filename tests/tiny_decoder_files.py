"""Wan 2.2 tiny autoencoder files (taew2_2 / lighttaew2_2) in their published layout, with random weights, written
from the layout as ComfyUI's `comfy/taesd/taehv.py` builds it (`TAEHV(latent_channels=48)`), spelled out here rather
than taken from the runtime, so that the loader is tested against the layout and not against itself."""

from pathlib import Path

import torch
from safetensors.torch import save_file

WIDTHS = (256, 128, 64, 64)  # TAEHV's decoder stage widths (n_f)


def published_state(seed: int = 0, dtype: torch.dtype = torch.float16, widths=WIDTHS) -> dict[str, torch.Tensor]:
    """Every decoder tensor of a 48-channel TAEHV (and a few encoder ones, which a decoder ignores): index 0 the
    tanh clamp, 1 conv 48 -> 256 (3x3), 2 ReLU; per stage three memory blocks (conv.0 on 2n -> n, conv.2 and conv.4
    n -> n, all 3x3 with bias; no skip weight, their widths do not change), a 2x upsample, a temporal grow (1x1, no
    bias: stride 1 in the first stage, 2 after) and a 3x3 conv without bias into the next width; 21 ReLU, 22 conv
    64 -> 12 (3 x 2 x 2 for the pixel shuffle)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"decoder.1.weight": (widths[0], 48, 3, 3), "decoder.1.bias": (widths[0],),
              "decoder.22.weight": (12, widths[3], 3, 3), "decoder.22.bias": (12,),
              "encoder.0.weight": (64, 12, 3, 3), "encoder.0.bias": (64,)}
    for stage, (first, grow, stride) in enumerate(((3, 7, 1), (9, 13, 2), (15, 19, 2))):
        n = widths[stage]
        for block in range(first, first + 3):
            shapes |= {f"decoder.{block}.conv.0.weight": (n, 2 * n, 3, 3), f"decoder.{block}.conv.0.bias": (n,),
                       f"decoder.{block}.conv.2.weight": (n, n, 3, 3), f"decoder.{block}.conv.2.bias": (n,),
                       f"decoder.{block}.conv.4.weight": (n, n, 3, 3), f"decoder.{block}.conv.4.bias": (n,)}
        shapes[f"decoder.{grow}.conv.weight"] = (n * stride, n, 1, 1)
        shapes[f"decoder.{grow + 1}.weight"] = (widths[stage + 1], n, 3, 3)
    # scaled about as He initialises a ReLU network, so the frames spread over 0..1 rather than sit at one end
    return {k: (torch.randn(s, generator=g) * (1.2 / (s[1] * s[2] * s[3]) ** 0.5 if len(s) == 4 else 0.02)).to(dtype)
            for k, s in shapes.items()}


def write(path: Path, state: dict[str, torch.Tensor] | None = None, **options) -> Path:
    """A .safetensors or (weights-only) .pth file holding `state` (default: `published_state(**options)`)."""
    state = published_state(**options) if state is None else state
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    return path


if __name__ == "__main__":  # a random file to try the fast decoder with (docs/causal.md)
    import argparse

    parser = argparse.ArgumentParser(description="Write a Wan 2.2 tiny autoencoder file in its published layout with "
                                                 "random weights (for trying: its frames mean nothing)")
    parser.add_argument("path", type=Path, help="a .safetensors or .pth file; named lighttae* it takes raw latents")
    args = parser.parse_args()
    print(f"wrote {write(args.path)}")
