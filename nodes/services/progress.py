"""Progress bars, latent previews, Cancel and progress text, as ComfyUI shows them."""

import functools
import os
from collections.abc import Callable

import torch

from ...cosmos3_runtime.errors import CheckpointError
from ...cosmos3_runtime.tiny_decoder import FILE_SUFFIXES, TinyDecoder
from .base import _comfy, log, prompt_server

# the Wan 2.2 tiny autoencoders previews decode with, by file name; lighttaew2_2 first, as ComfyUI's own Wan 2.2
# previews look for it
PREVIEW_DECODERS = ("lighttaew2_2", "taew2_2")


def check_interrupt() -> None:
    """Raise ComfyUI's interrupt exception when the user pressed Cancel (never swallowed here)."""
    mm = _comfy("comfy.model_management")
    if mm is not None:
        mm.throw_exception_if_processing_interrupted()


class Progress:
    """ComfyUI's progress bar (every update is also an interrupt point), with latent previews."""

    def __init__(self, total: int, previews: bool = True):
        utils = _comfy("comfy.utils")
        self.bar = utils.ProgressBar(total) if utils is not None else None
        self.total = total
        self.preview = _previewer() if previews else None

    @classmethod
    def bar(cls):
        """A `progress(done, total)` callback for work whose total is known only once it starts (VAE)."""
        progress = None

        def update(done: int, total: int) -> None:
            nonlocal progress
            progress = progress or cls(total, previews=False)
            progress.update(done)

        return update

    def update(self, step: int, latents: torch.Tensor | None = None) -> None:
        check_interrupt()
        if self.bar is None:
            return
        preview = None
        if self.preview is not None and latents is not None:
            preview = ("JPEG", self.preview(latents), _preview_size())
        self.bar.update_absolute(step, self.total, preview)


def preview_decoder_name(method: str, approx_names: list[str]) -> str | None:
    """The models/vae_approx file (of `approx_names`) previews decode with: under ComfyUI's TAESD preview method, the
    first named like a Wan 2.2 tiny autoencoder (`PREVIEW_DECODERS`' order); None otherwise (linear previews)."""
    if method != "taesd":
        return None
    for prefix in PREVIEW_DECODERS:
        found = sorted(n for n in approx_names
                       if os.path.basename(n).startswith(prefix) and n.lower().endswith(FILE_SUFFIXES))
        if found:
            return found[0]
    return None


def _previewer() -> Callable[[torch.Tensor], object] | None:
    """Latents -> the preview image of their last latent frame, as ComfyUI's preview setting asks (None when it turns
    previews off): decoded by the Wan 2.2 tiny autoencoder where the method is TAESD and models/vae_approx has one,
    else the linear map of the 48 channels to RGB (ComfyUI's Wan 2.2 factors)."""
    cli = _comfy("comfy.cli_args")
    formats = _comfy("comfy.latent_formats")
    if cli is None or formats is None or not hasattr(formats, "Wan22"):
        return None
    method = str(getattr(cli.args.preview_method, "value", cli.args.preview_method))
    if method == "none":
        return None
    wan22 = formats.Wan22()
    folder_paths = _comfy("folder_paths")
    name = preview_decoder_name(method, folder_paths.get_filename_list("vae_approx") if folder_paths else [])
    if name is not None:
        try:
            decoder = _preview_decoder(folder_paths.get_full_path("vae_approx", name))
        except CheckpointError as exc:  # a bad file costs the previews their decoder, never the run
            log.warning("previews: %s; showing linear previews", exc)
        else:
            return lambda latents: decoded_preview(latents, decoder, wan22.latents_mean, wan22.latents_std)
    factors, bias = torch.tensor(wan22.latent_rgb_factors), torch.tensor(wan22.latent_rgb_factors_bias)
    return lambda latents: latent_rgb(latents, factors, bias)


@functools.lru_cache(maxsize=1)
def _preview_decoder(path: str) -> TinyDecoder:
    """The previews' decoder, read once per process (a run makes a previewer per progress bar)."""
    return TinyDecoder.load(path)


def _preview_size() -> int:
    cli = _comfy("comfy.cli_args")
    return getattr(cli.args, "preview_size", 512) if cli is not None else 512


def latent_rgb(latents: torch.Tensor, factors: torch.Tensor, bias: torch.Tensor):
    """A PIL preview of the last latent frame: a linear map of the 48 channels to RGB."""
    from PIL import Image

    frame = latents[0, :, -1].float().cpu()  # [48, h, w]
    rgb = torch.einsum("chw,cr->hwr", frame, factors) + bias
    pixels = ((rgb.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).numpy()
    return Image.fromarray(pixels)


def decoded_preview(latents: torch.Tensor, decoder: TinyDecoder, mean: torch.Tensor, std: torch.Tensor):
    """A PIL preview of the last latent frame (normalized, as the sampler's estimate is) decoded by the tiny
    autoencoder alone, in the latent space its file takes (`mean`, `std`: the VAE's latent statistics)."""
    from PIL import Image

    frame = latents[:, :, -1:].float()
    if decoder.latent_space == "raw":
        frame = frame * std.to(frame).view(1, -1, 1, 1, 1) + mean.to(frame).view(1, -1, 1, 1, 1)
    pixels = decoder.to(frame.device).decode(frame)[0, :, 0].float().cpu()  # [3, H, W] in [-1, 1]
    return Image.fromarray(((pixels.permute(1, 2, 0) + 1) * 127.5).round().to(torch.uint8).numpy())


def progress_text(text: str, node_id: str | None) -> None:
    """Text shown on a running node (ComfyUI's progress text); nothing outside ComfyUI."""
    server = prompt_server()
    if server is not None and node_id is not None:
        server.send_progress_text(text, node_id)


class RunProgress:
    """A sampler's run in ComfyUI: the progress bar and previews over every step (of every chunk), and "chunk k of N"
    under the node (`step` is generate's callback, `stage` its progress)."""

    def __init__(self, node_id: str | None):
        self.node_id, self.bar = node_id, None

    def step(self, step: int, total: int, denoised) -> None:
        self.bar = self.bar or Progress(total)
        self.bar.update(step, denoised)

    def stage(self, stage: str, done: int, total: int) -> None:
        if stage == "chunk":
            progress_text(f"chunk {done} of {total}", self.node_id)
