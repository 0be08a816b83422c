"""Low-VRAM placement of the transformer: the text tower off the GPU between prompts, and block swap.

- Text offload: the text tower (embeddings and every layer's text pathway) lives on the offload device
  and visits the compute device only while a prompt is encoded. Its per-layer K/V stay on the compute
  device, so sampling never needs it: results are bit-identical.
- Block swap: the media pathway of `count` layers lives in (pinned) CPU memory. Each one is copied to
  the compute device just before its layer runs, the next one already on its way on a side stream
  (CUDA) while the current layer computes, and dropped right after: at most two swapped layers are on
  the compute device at any time. Same weights, same kernels: bit-identical results.

Both work through the transformer's layer hook (`Cosmos3Transformer.streamer`), so they also serve
as the seam where a host (ComfyUI) plugs in its own weight streaming.
"""

import weakref
from contextlib import contextmanager

import torch
from torch import nn

from .transformer import tower_of


def _parameters(model: nn.Module, tower: str, layer: int | None = None):
    prefix = "" if layer is None else f"layers.{layer}."
    for name, p in model.named_parameters():
        if name.startswith(prefix) and tower_of(name) == tower:
            yield p


class TextOffload:
    """Keeps the text tower on `home` except inside `on(device)`. The home copies are made once (pinned on the first
    visit to a GPU, so the copies over run asynchronously) and never copied back: the weights do not change, so
    leaving a visit only points the parameters at their home copies again."""

    def __init__(self, model: nn.Module, home: torch.device):
        self.model, self.home = model, torch.device(home)
        self.on_compute = False
        self.homes = [(p, p.data.to(self.home)) for p in _parameters(model, "text tower")]
        self._point_home()

    def held(self) -> list[nn.Parameter]:
        return [p for p, _ in self.homes]

    def _point_home(self) -> None:
        for p, home in self.homes:
            p.data = home

    @contextmanager
    def on(self, device: torch.device):
        """The tower on `device` for the block (once for nested visits: both prompts of a request in one)."""
        if self.on_compute:
            yield
            return
        device = torch.device(device)
        if device.type == "cuda" and self.home.type == "cpu":
            self.homes = [(p, home if home.is_pinned() else home.pin_memory()) for p, home in self.homes]
        for p, home in self.homes:
            p.data = home.to(device, non_blocking=True)
        self.on_compute = True
        try:
            yield
        finally:
            self._point_home()
            self.on_compute = False


class BlockSwap:
    """Streams the media-pathway weights of the first `count` layers from CPU memory, one layer ahead."""

    def __init__(self, model: nn.Module, count: int):
        self.model = weakref.ref(model)  # the model holds this streamer: no reference cycle
        self.swapped = list(range(min(count, len(model.layers))))
        self.home: dict[int, list[tuple[nn.Parameter, torch.Tensor]]] = {}
        for i in self.swapped:
            pairs = []
            for p in _parameters(model, "media tower", i):
                p.data = p.data.to("cpu")
                pairs.append((p, p.data))
            self.home[i] = pairs
        self.stream: torch.cuda.Stream | None = None  # made on first use on a GPU
        self.ready: dict[int, torch.cuda.Event | None] = {}  # layers copied (or being copied) to the device
        self.most_resident = 0  # the largest number of swapped layers on the device at once (for tests)

    @property
    def device(self) -> torch.device:
        """Where the rest of the model runs (it follows the model when it moves)."""
        return self.model().device

    def _fetch(self, i: int) -> None:
        if i in self.ready:
            return
        device = self.device
        if device.type != "cuda":
            for p, cpu in self.home[i]:
                p.data = cpu.to(device)
            self.ready[i] = None
        else:  # pinned CPU copies, copied on a side stream while the current layer computes
            if self.stream is None or self.stream.device != device:
                self.stream = torch.cuda.Stream(device)
            self.home[i] = [(p, cpu if cpu.is_pinned() else cpu.pin_memory()) for p, cpu in self.home[i]]
            with torch.cuda.stream(self.stream):
                for p, cpu in self.home[i]:
                    p.data = cpu.to(device, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.stream)
            self.ready[i] = event
        self.most_resident = max(self.most_resident, len(self.ready))

    def before(self, i: int) -> None:
        """Layer i is about to run: its weights on the device, the next swapped layer's on their way."""
        if i not in self.home:
            return
        self._fetch(i)
        event = self.ready[i]
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)
            for p, _ in self.home[i]:
                p.data.record_stream(torch.cuda.current_stream(self.device))  # not reused before the layer ran
        later = [j for j in self.swapped if j > i]
        if later:
            self._fetch(later[0])

    def after(self, i: int) -> None:
        """Layer i has run: back to its CPU copy (the device memory is freed)."""
        if i not in self.home:
            return
        for p, cpu in self.home[i]:
            p.data = cpu
        self.ready.pop(i, None)

    def held(self) -> list[nn.Parameter]:
        return [p for pairs in self.home.values() for p, _ in pairs]

    def resident(self) -> list[int]:
        return sorted(self.ready)
