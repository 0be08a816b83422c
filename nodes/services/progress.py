"""Progress bars, latent previews, Cancel and progress text, as ComfyUI shows them."""

import torch

from .base import _comfy, prompt_server


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
        self.preview_factors = _preview_factors() if previews else None

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
        if self.preview_factors is not None and latents is not None:
            preview = ("JPEG", latent_rgb(latents, *self.preview_factors), _preview_size())
        self.bar.update_absolute(step, self.total, preview)


def _preview_factors():
    """Wan 2.2 latent->RGB factors from ComfyUI when previews are on, else None."""
    cli = _comfy("comfy.cli_args")
    formats = _comfy("comfy.latent_formats")
    if cli is None or formats is None or not hasattr(formats, "Wan22"):
        return None
    method = getattr(cli.args.preview_method, "value", cli.args.preview_method)
    if str(method) == "none":
        return None
    wan22 = formats.Wan22()
    return torch.tensor(wan22.latent_rgb_factors), torch.tensor(wan22.latent_rgb_factors_bias)


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
