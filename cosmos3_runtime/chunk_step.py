"""A causal chunk's denoising forward as a fixed-shape step, replayed under a CUDA graph: gpt-fast's
`decode_one_token` over its static K/V cache, for a rollout's chunks.

Once a rollout's history window is full, every chunk's denoising forwards have the same shapes (the held rows of
sinks and window, the chunk's tokens, the prompt's text rows) and read the history where it is: the `MediaKV` slabs,
at fixed addresses, each forward writing its own rows right after the held ones. What changes from step to step is
copied into static buffers: the latents, the timestep, the rotary tables of the chunk's positions (made outside the
graph: positions move with the start frame) and the rows beside the video (Sim-Bimanual's actions). The forward over
those buffers is captured once and replayed at every step; its velocity is copied out, as the next replay overwrites
it.

Outside the graph stay the re-noising draws (CPU generators seeded per step, `causal.SEEDS`: every device draws the
same numbers), the host's cancel check (once a step instead of once a layer) and the commits. A commit stays eager:
its rows are kept by `MediaKV.append` from a host record its forward makes (which a replay would not), and within a
chunk each commit holds one frame more than the one before, so each would need its own graph and memory pool.
"""

import logging
from collections.abc import Callable
from dataclasses import replace

import torch

from . import cancel
from .devices import facts
from .transformer import VIDEO, Cosmos3Transformer, Segment, TextKV, Velocity, tower_of
from .weights import precision

log = logging.getLogger("cosmos3")
CAPTURES = 2  # a run's captures at most (`ChunkStep`)
WARMUP = 3  # eager calls on a side stream before a capture, as PyTorch's CUDA graph example makes


class CudaGraph:
    """`fn` captured in a CUDA graph, warmed up on a side stream first (a compiled block compiles there, and every
    lazily made workspace is made before the capture); a call replays it and returns the outputs of the capture,
    which the next replay overwrites."""

    def __init__(self, fn: Callable):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn()

    def __call__(self):
        self.graph.replay()
        return self.out


def for_run(model: Cosmos3Transformer, device: torch.device, history: str) -> "ChunkStep | None":
    """The fixed-shape step a rollout's chunks run through, chosen once a run (None: eager): CUDA graphs on an NVIDIA
    GPU, for a history held on the device as it is and weights all on it. A history in CPU memory or fp8 comes through
    a host copy or a dequantization per layer; per-layer hooks (block swap, a host's weight streaming) run host code
    between layers, which a replay would skip; and a module of the media forward a host leaves in CPU memory (ComfyUI
    keeps small ones there) copies its weights in during it, which a capture refuses (the text tower is not run: the
    prompt's K/V are made before)."""
    if not (facts(device).cuda and history == "device" and model.hooks.layer is None):
        return None
    weights = (*model.named_parameters(), *model.named_buffers())
    if any(tower_of(name) != "text tower" and t.device != model.device for name, t in weights):
        return None
    return ChunkStep(model, CudaGraph)


class ChunkStep:
    """Called as the transformer is (`denoiser.WindowInputs.forward`). A shape runs eagerly until a second chunk
    brings it, then is captured by `graph` (`CudaGraph`, or a stand-in with its interface) and replayed: before the
    window is full each chunk holds more history than the last, and a rollout that never evicts never repeats a
    shape, so only the steady state is captured. One capture at a time: a new shape that repeats replaces it, at most
    `CAPTURES` times a run (a step policy that changes precision inside each chunk would otherwise recapture every
    chunk, slower than running eagerly: its other shapes run eagerly)."""

    def __init__(self, model: Cosmos3Transformer, graph: Callable[[Callable], Callable]):
        self.model, self.graph = model, graph
        self.seen: tuple | None = None  # (shape, start frame) of the latest chunk run eagerly
        self.shape: tuple | None = None  # the captured shape
        self.replay: Callable | None = None
        self.placed: tuple | None = None  # the start frames whose rotary tables the static buffers hold
        self.failed = False  # a capture failed: eager for the rest of the run
        self.captures = 0

    def __call__(self, latents: torch.Tensor, timestep: torch.Tensor, text: TextKV, noisy: list[int], fps: float,
                 tracks: list[Segment] = (), sp=None, context=(), hooks=None) -> Velocity:
        cache = hooks.cache
        # What the kernels depend on besides the buffers' values; objects by id (the capture holds them alive)
        shape = (cache.held, id(cache.slabs[0]), id(text), tuple(latents.shape), latents.dtype, timestep.dtype,
                 tuple(noisy), fps, hooks.block, precision.runs_native("media"), precision.runs_native("text"),
                 *((s.head, tuple(s.latents.shape), s.domain, s.zeroed, s.noisy) for s in tracks))
        if shape != self.shape:
            if (self.failed or self.captures == CAPTURES or self.seen is None or self.seen[0] != shape
                    or self.seen[1] == hooks.start_frame):
                self.seen = (shape, hooks.start_frame)
                return self.model(latents, timestep, text, noisy, fps, tracks, sp, context, hooks)
            try:
                self.capture(shape, latents, timestep, text, noisy, fps, tracks, hooks)
            except RuntimeError as error:  # a capture CUDA refuses (a kernel that syncs): the run goes on eagerly
                log.warning("Cosmos3: the causal chunk step runs eagerly: its CUDA graph capture failed (%s)", error)
                self.failed, self.shape, self.replay = True, None, None
                return self.model(latents, timestep, text, noisy, fps, tracks, sp, context, hooks)
        self.latents.copy_(latents)
        self.timestep.copy_(timestep)
        for buffer, s in zip(self.rows, tracks):
            buffer.copy_(s.latents)
        placed = (hooks.start_frame, *(s.start_frame for s in tracks))
        if placed != self.placed:  # a new chunk: its positions (the same for each of its steps)
            segments = [Segment(VIDEO, latents, noisy, start_frame=hooks.start_frame), *tracks]
            for buffer, table in zip(self.rope, self.model.rotary(segments, text.length, fps, latents.device)):
                buffer.copy_(table)
            self.placed = placed
        cancel.check()
        out = self.replay()
        return Velocity(out.vision.clone(), [t.clone() for t in out.tracks])

    def capture(self, shape: tuple, latents: torch.Tensor, timestep: torch.Tensor, text: TextKV, noisy: list[int],
                fps: float, tracks: list[Segment], hooks) -> None:
        """Static buffers for the step's inputs, and the forward over them captured."""
        self.replay = None  # an earlier capture's memory goes first
        self.captures += 1
        self.shape, self.placed = shape, None
        self.latents, self.timestep = latents.clone(), timestep.clone()
        self.rows = [s.latents.clone() for s in tracks]
        segments = [Segment(VIDEO, latents, noisy, start_frame=hooks.start_frame), *tracks]
        self.rope = [t.clone() for t in self.model.rotary(segments, text.length, fps, latents.device)]
        static = [replace(s, latents=rows) for s, rows in zip(tracks, self.rows)]
        hooks = replace(hooks, rope=tuple(self.rope))
        self.replay = self.graph(lambda: self.model(self.latents, self.timestep, text, noisy, fps, static,
                                                    hooks=hooks))
