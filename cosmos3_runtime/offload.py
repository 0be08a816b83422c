"""Low-VRAM placement of the transformer: the text tower off the GPU between prompts, and block swap.

- Text offload: the text tower (embeddings and every layer's text pathway) lives on the offload device
  and visits the compute device only while a prompt is encoded. Its per-layer K/V stay on the compute
  device, so sampling never needs it: results are bit-identical.
- Block swap: the media pathway of `count` layers lives in (pinned) CPU memory. Each one is copied to
  the compute device just before its layer runs, into one of two device buffers used in turn, the next
  one already on its way on a side stream (CUDA) while the current layer computes: two swapped layers
  are on the compute device at any time. Same weights, same kernels: bit-identical results.

Block swap works through the transformer's layer hook (`Hooks.layer` in `Cosmos3Transformer.hooks`), the seam
where a host (ComfyUI) may plug in its own weight streaming too.

Pinned CPU copies are packed into a few slabs (`_pin_in_slabs`): PyTorch's caching host allocator rounds each
pinned block up to a power of two, so pinning parameter by parameter took Nano's text tower (14.77 GB in bf16)
to 19.19 GB of pinned memory; its 15 slabs take 14.77 GB.
"""

import weakref
from contextlib import contextmanager

import torch
from torch import nn

from .transformer import tower_of

SLAB_BYTES = 1 << 30  # the most a slab holds (more only around a larger tensor): the extra memory while packing
ALIGN = 64  # bytes: each tensor in a slab starts at a multiple of any element size


def _pinned_slab(nbytes: int) -> torch.Tensor:
    """`nbytes` of pinned CPU memory: the one place pinned memory is allocated (tests record it here)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _slab_plan(sizes: list[int]) -> list[list[int]]:
    """Which tensors (indices into `sizes`, in bytes) go into each slab. The caching host allocator rounds each block
    up to a power of two, so each slab is filled, largest tensors first, up to a power of two it then stays within:
    `SLAB_BYTES` (or the power of two above a larger tensor) while that much is left, then the largest power of two
    left. A tail under `SLAB_BYTES / 64` goes whole into one last slab, so small tensors do not make many slabs."""
    left, plan = sorted(range(len(sizes)), key=lambda i: -sizes[i]), []
    while left:
        total = sum(sizes[i] for i in left)
        room = total if total <= SLAB_BYTES >> 6 else max(min(SLAB_BYTES, 1 << (total.bit_length() - 1)),
                                                          1 << (sizes[left[0]] - 1).bit_length())
        slab, rest, used = [], [], 0
        for i in left:
            if used + sizes[i] <= room:
                slab.append(i)
                used += sizes[i]
            else:
                rest.append(i)
        plan.append(slab)
        left = rest
    return plan


def _pin_in_slabs(params: list[nn.Parameter]) -> None:
    """Moves each parameter's data to pinned CPU memory, same values: a view into one of a few slabs (`_slab_plan`).
    Slab by slab, each parameter pointed at its view at once, so the old copies go as it goes (when nothing else holds
    them): one slab at most over the parameters' bytes. A tensor subclass, which a view of bytes would lose, is pinned
    alone."""
    plain = [p for p in params if type(p.data) is torch.Tensor]
    for p in params:
        if type(p.data) is not torch.Tensor:
            p.data = p.data.to("cpu").pin_memory()
    sizes = [-(-p.data.nbytes // ALIGN) * ALIGN for p in plain]
    for indices in _slab_plan(sizes):
        slab, offset = _pinned_slab(sum(sizes[i] for i in indices)), 0
        for i in indices:
            p = plain[i]
            home = slab[offset:offset + p.data.nbytes].view(p.dtype).view(p.shape)
            home.copy_(p.data)
            p.data = home
            offset += sizes[i]


def _parameters(model: nn.Module, tower: str, layer: int | None = None):
    prefix = "" if layer is None else f"layers.{layer}."
    for name, p in model.named_parameters():
        if name.startswith(prefix) and tower_of(name) == tower:
            yield p


class TextOffload:
    """Keeps the text tower on `home` except inside `on(device)`. The home copies are made once (moved into pinned
    slabs on the first visit to a GPU, so the copies over run asynchronously) and never copied back: the weights do not
    change, so leaving a visit only points the parameters at their home copies again."""

    PINNED_FOR = ("cuda",)  # device types whose visits want pinned home copies (tests add a virtual one)

    def __init__(self, model: nn.Module, home: torch.device):
        self.model, self.home = model, torch.device(home)
        self.on_compute = self.pinned = False
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
        if device.type in self.PINNED_FOR and self.home.type == "cpu" and not self.pinned:
            held, self.homes = self.held(), []  # each parameter holds its home: the unpinned copies go slab by slab
            try:
                _pin_in_slabs(held)
                self.pinned = True
            finally:
                self.homes = [(p, p.data) for p in held]
        for p, home in self.homes:
            p.data = home.to(device, non_blocking=True)
        self.on_compute = True
        try:
            yield
        finally:
            self._point_home()
            self.on_compute = False


class BlockSwap:
    """Streams the media-pathway weights of the first `count` layers from CPU memory, one layer ahead.

    On a GPU the swapped layers share two device buffers, filled in turn on a side stream: layer k's weights
    go into buffer k % 2 once the layer that used that buffer before has finished (an event recorded after
    it ran), so the device holds exactly two swapped layers' weights however far the CPU runs ahead (freeing
    per-layer copies instead left them to the allocator's stream bookkeeping, and reserved memory grew toward
    the swapped layers' total). The CPU copies are pinned once, here, into a few slabs (`_pin_in_slabs`), so every
    copy over is asynchronous."""

    def __init__(self, model: nn.Module, count: int, pin: bool | None = None):
        self.model = weakref.ref(model)  # the model's hooks hold this: no reference cycle
        self.swapped = list(range(min(count, len(model.layers))))
        pin = torch.cuda.is_available() if pin is None else pin
        layers = {i: list(_parameters(model, "media tower", i)) for i in self.swapped}
        held = [p for params in layers.values() for p in params]
        if pin:
            _pin_in_slabs(held)
        else:
            for p in held:
                p.data = p.data.to("cpu")
        self.home = {i: [(p, p.data) for p in params] for i, params in layers.items()}
        self.slot = {layer: n % 2 for n, layer in enumerate(self.swapped)}
        self.filled: list[int | None] = [None, None]  # the layer each buffer holds for its coming or current run
        self.buffers: list[list[torch.Tensor] | None] = [None, None]  # per buffer: one tensor per parameter
        self.copied: list = [None, None]  # CUDA events: the copy into each buffer finished
        self.released: list = [None, None]  # CUDA events: the last layer to read each buffer finished
        self.stream: torch.cuda.Stream | None = None  # made on first use on a GPU
        self.most_resident = 0  # the largest number of swapped layers on the device at once (for tests)

    STREAMED = ("cuda",)  # device types with streams and events (tests add a virtual one)

    @property
    def device(self) -> torch.device:
        """Where the rest of the model runs (it follows the model when it moves)."""
        return self.model().device

    def _buffers(self, s: int, i: int, device: torch.device) -> list[torch.Tensor]:
        """Buffer s, made (or remade, should a layer's parameters differ in shape or type) for layer i."""
        homes = [cpu for _, cpu in self.home[i]]
        held = self.buffers[s]
        if held is None or [(b.shape, b.dtype, b.device) for b in held] != [(h.shape, h.dtype, device) for h in homes]:
            held = self.buffers[s] = [torch.empty_like(h, device=device) for h in homes]
        return held

    def _fetch(self, i: int) -> None:
        s = self.slot[i]
        if self.filled[s] == i:
            return
        device = self.device
        if device.type not in self.STREAMED:
            for p, cpu in self.home[i]:
                p.data = cpu.to(device)
        else:
            if self.stream is None or self.stream.device != device:
                self.stream = torch.cuda.Stream(device)
            buffers = self._buffers(s, i, device)
            with torch.cuda.stream(self.stream):
                if self.released[s] is not None:
                    self.stream.wait_event(self.released[s])  # the buffer's last reader has run
                for buffer, (_, cpu) in zip(buffers, self.home[i]):
                    buffer.copy_(cpu, non_blocking=True)
                self.copied[s] = torch.cuda.Event()
                self.copied[s].record(self.stream)
        self.filled[s] = i
        self.most_resident = max(self.most_resident, len(self.resident()))

    def before(self, i: int) -> None:
        """Layer i is about to run: its weights on the device, the next swapped layer's on their way."""
        if i not in self.home:
            return
        self._fetch(i)
        s = self.slot[i]
        if self.buffers[s] is not None and self.device.type in self.STREAMED:
            torch.cuda.current_stream(self.device).wait_event(self.copied[s])
            for (p, _), buffer in zip(self.home[i], self.buffers[s]):
                p.data = buffer
        later = [j for j in self.swapped if j > i]
        if later:
            self._fetch(later[0])

    def after(self, i: int) -> None:
        """Layer i has run: its parameters point at their CPU copies again, and its buffer is free once the
        kernels queued so far have run."""
        if i not in self.home:
            return
        s = self.slot[i]
        if self.device.type in self.STREAMED:
            self.released[s] = torch.cuda.Event()
            self.released[s].record(torch.cuda.current_stream(self.device))
        for p, cpu in self.home[i]:
            p.data = cpu
        self.filled[s] = None

    def held(self) -> list[nn.Parameter]:
        return [p for pairs in self.home.values() for p, _ in pairs]

    def resident(self) -> list[int]:
        return sorted(i for i in self.filled if i is not None)
