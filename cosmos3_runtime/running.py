"""What every run on a loaded model runs inside (`running`), a generation's and each session tick's alike: the
media block it runs, inference mode, the text tower's precision, the host's Cancel, the finite check, and the
guardrail's frame filter. Works on the parts (`tracks.Parts`: the denoiser and the codec), never the pipeline."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

from . import cancel
from .errors import NumericalError
from .guardrails import Guardrails
from .settings import Settings
from .tracks import Parts
from .vae import Progress
from .weights import precision


class FiniteCheck:
    """Whether each part of a generation (text tower, media tower, VAE decoder) gave finite values, read back once
    at its end: an overflow (fp16's above all) is named with its part and dtype, not returned as a black or noisy
    clip. Noting costs no host read (the flags stay on the device until `check`)."""

    def __init__(self):
        self.flags: list[tuple[str, torch.dtype, torch.Tensor]] = []

    def note(self, part: str, dtype: torch.dtype, *tensors: torch.Tensor) -> None:
        flags = [torch.isfinite(t).all() for t in tensors]
        self.flags.append((part, dtype, torch.stack(flags).all() if len(flags) > 1 else flags[0]))

    def check(self) -> None:
        if not self.flags:
            return
        finite = torch.stack([flag.to(self.flags[0][2].device) for _, _, flag in self.flags]).tolist()  # one read
        for (part, dtype, _), fine in zip(self.flags, finite):
            if not fine:
                name = str(dtype).removeprefix("torch.")
                fix = ("fp16 overflows there: load in bf16 (dtype 'bf16'; fp32 on a card without bf16)"
                       if dtype == torch.float16 else "the result would be garbage: check the checkpoint's files (a "
                       "damaged download), or load in fp32")
                raise NumericalError(f"{part} produced inf or NaN values in {name}; {fix}")


@contextmanager
def running(parts: Parts, settings: Settings, block: Callable, interrupt: Callable[[], None] | None = None,
            guardrails: Guardrails | None = None, progress: Progress | None = None
            ) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
    """One run (a generation, a session's tick) on `parts`, its media layers run by `block` (compiled or not; the
    model's own hooks are unchanged): its text tower in the run's precision (each step sets the media pathway's),
    `interrupt` asked between layers and VAE frames (`cancel`), every part's output checked finite as the run ends.
    Yields the guardrail's frame filter (faces pixelated, a blocked clip refused; as it is without `guardrails`),
    `progress` told of it as the "guardrail" stage. One run at a time per model: the parts' observers are this run's."""
    finite = FiniteCheck()
    parts.codec.observe = parts.denoiser.observe = finite.note
    parts.denoiser.hooks = replace(parts.denoiser.transformer.hooks, block=block)
    stage = None if progress is None else lambda done, total: progress("guardrail", done, total)

    def guarded(frames: torch.Tensor) -> torch.Tensor:
        return frames if guardrails is None else guardrails.filter_frames(frames, stage)

    try:
        with torch.inference_mode(), precision.for_text(settings.precision), cancel.checking(interrupt):
            yield guarded
        finite.check()
    finally:
        parts.codec.observe = parts.denoiser.observe = None
