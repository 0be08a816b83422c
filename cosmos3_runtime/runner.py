"""What a loaded generator offers its callers, whether it runs in this process (`Cosmos3Pipeline`) or in worker
processes on other GPUs (`WorkerPool`): one interface, so callers ask `local` instead of checking classes."""

from typing import Protocol

import torch

from .checkpoint import Checkpoint, Variant


class Runner(Protocol):
    local: bool  # its weights live in this process (a host's memory manager may move them)
    checkpoint: Checkpoint

    @property
    def variant(self) -> Variant: ...

    def plan(self, prompt, request=None, **options): ...

    def generate(self, prompt, request=None, *, callback=None, progress=None, interrupt=None, **options): ...

    def session(self, prompt, request=None, guardrails=None, control=None, **options): ...

    def decode(self, latents: torch.Tensor, tile=None, progress=None, raw: bool = False) -> torch.Tensor: ...

    def encode(self, frames: torch.Tensor, progress=None, raw: bool = False) -> torch.Tensor: ...

    def raw_latents(self, latents: torch.Tensor) -> torch.Tensor: ...
