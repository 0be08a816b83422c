"""Cancelling a run between transformer layers and VAE frames, not only between steps.

A denoising step at large sizes takes minutes, so a host's Cancel checked only by the step callback leaves the run
going that long. A host installs its check for the duration of a run (`checking`); the transformer calls `check`
between layers (of the text tower and of the media stack) and the VAE after every latent frame of every tile, so a
Cancel ends a run within about one layer's (or one frame's) time.

The check is held on a plain class attribute, not a ContextVar (as `weights.precision`'s step is): compiled code
reads no ContextVar without a graph break, and a process runs one generation at a time. Inside a compiled region
`check` does nothing: a call out to the host would break the graph, so a compiled forward is cancelled at its edges.

Under sequence (or CFG) parallelism, the ranks of a torch.distributed job (`workers`, or torchrun with `parallel`),
no check is installed: one rank stopping mid-step while another waits for it in a collective would hang them both,
so the ranks agree on cancelling at step boundaries only.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

Interrupt = Callable[[], None]  # raises to cancel


class _Current:
    """The check installed now, or None."""

    interrupt: Interrupt | None = None


_current = _Current()


@contextmanager
def checking(interrupt: Interrupt | None) -> Iterator[None]:
    """Run the block with `interrupt` as the check (None: none), restoring the previous one afterwards."""
    before, _current.interrupt = _current.interrupt, interrupt
    try:
        yield
    finally:
        _current.interrupt = before


def check() -> None:
    """Call the installed check (which raises to cancel); nothing without one or inside compiled code."""
    if torch.compiler.is_compiling():
        return
    if _current.interrupt is not None:
        _current.interrupt()
