"""Devices and ComfyUI's memory manager: where models load, how the pack's parts are managed as ComfyUI models,
freeing memory, and the linear layers and attention backend ComfyUI selected."""

import ctypes
import ctypes.util
import threading
import weakref

import torch

from ...cosmos3_runtime.devices import empty_host_cache
from ...cosmos3_runtime.transformer import attention_inputs
from .base import _comfy


def torch_device() -> torch.device:
    mm = _comfy("comfy.model_management")
    if mm is not None:
        return mm.get_torch_device()
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cuda_device_count() -> int:
    return torch.cuda.device_count()


def offload_device() -> torch.device:
    mm = _comfy("comfy.model_management")
    return mm.unet_offload_device() if mm is not None else torch.device("cpu")


def free_memory(num_bytes: int, device: torch.device) -> None:
    """Ask ComfyUI to unload its own models until `num_bytes` fit on `device`."""
    mm = _comfy("comfy.model_management")
    if mm is not None and device.type != "cpu":
        mm.free_memory(num_bytes, device)


def return_freed_memory_soon(delay_s: float = 1.0) -> None:
    """Give freed host memory back to the system once the collection that freed it is over. glibc keeps the freed
    blocks of a second load in its heap (its mmap threshold rises after the first large free), so a released
    checkpoint would otherwise stay in the process's RSS."""

    def trim():
        try:
            ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc: nothing to do
            pass

    timer = threading.Timer(delay_s, trim)
    timer.daemon = True
    timer.start()


def empty_cache() -> None:
    """Device memory back to the driver, and the pinned CPU memory a released model's block swap or text offload
    held back to the system (PyTorch keeps freed pinned blocks cached; ComfyUI's own emptying leaves them)."""
    mm = _comfy("comfy.model_management")
    if mm is not None:
        mm.soft_empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.empty_cache()
    if torch.cuda.is_available():
        empty_host_cache()


class ManagedPart(torch.nn.Module):
    """One part of a Cosmos3 pipeline as a model of ComfyUI's memory manager (it moves and evicts it)."""

    def __init__(self, modules: list, device: torch.device):
        super().__init__()
        self.modules_ = torch.nn.ModuleList(modules)
        self.device = device  # the patcher keeps this up to date


def linear_class():
    """ComfyUI's cast-weight Linear (its memory manager can then load a model partially and stream the rest
    per layer in lowvram modes), or None outside ComfyUI."""
    ops = _comfy("comfy.ops")
    return ops.disable_weight_init.Linear if ops is not None else None


def media_attention():
    """ComfyUI's attention backend (what --use-sage-attention / --use-flash-attention select) in the runtime's
    media-attention shapes, or None outside ComfyUI (the runtime then uses SDPA). Only ComfyUI's PyTorch backend gets
    grouped K/V (fewer key/value heads than query heads), where SDPA runs them in a fused kernel; every other backend
    gets K/V expanded to the query heads: xformers, split and sub-quadratic attention assume equal head counts in
    ComfyUI releases before their grouped-query support, and sage or flash builds differ in what they take."""
    attention = _comfy("comfy.ldm.modules.attention")
    if attention is None:
        return None

    def attend(q, k, v):  # q [Nq, A, D], k/v [Nk, K, D] -> [Nq, A*D]
        dtype = q.dtype
        q, k, v, grouped = attention_inputs(q, k, v)  # [1, heads, N, D]; expanded where SDPA needs it
        backend = attention.optimized_attention
        if grouped and backend is not attention.attention_pytorch:
            groups = q.shape[1] // k.shape[1]
            k, v, grouped = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), False
        extra = {"enable_gqa": True} if grouped else {}
        return backend(q, k, v, q.shape[1], skip_reshape=True, **extra)[0].to(dtype)

    return attend


def managed_patcher(pipeline, module, load_device: torch.device, offload_device: torch.device, make=None):
    """The ComfyUI patcher of one part of a pipeline, made once per pipeline. `make()` builds it (the transformer's
    is the core MODEL's); default: a plain part. The pipeline refers to its patchers weakly: the core MODEL refers
    to the pipeline, so a strong reference back would make a cycle that only a garbage collection frees; whoever
    uses a patcher keeps it (the handles, ComfyUI's cache)."""
    patchers = pipeline.host.setdefault("comfy_patchers", weakref.WeakValueDictionary())
    patcher = patchers.get(id(module))
    if patcher is None:
        if make is None:
            part = ManagedPart([module], next(module.parameters()).device)
            patcher = _comfy("comfy.model_patcher").CoreModelPatcher(part, load_device=load_device,
                                                                     offload_device=offload_device)
        else:
            patcher = make()
        patchers[id(module)] = patcher
    return patcher


def load_managed(patchers: list, memory_required: int = 0) -> None:
    """Have ComfyUI load `patchers` onto their device, unloading other models as needed to fit them and
    `memory_required` more bytes (the work about to run)."""
    _comfy("comfy.model_management").load_models_gpu(patchers, memory_required=memory_required)


def forget_managed(pipeline) -> None:
    """The pipeline was released: unload its patchers from ComfyUI and drop them."""
    patchers = list(pipeline.host.pop("comfy_patchers", {}).values())
    mm = _comfy("comfy.model_management")
    if mm is not None and patchers:
        ids = set(map(id, patchers))
        for loaded in [m for m in mm.current_loaded_models if id(m.model) in ids]:
            loaded.model_unload()
            mm.current_loaded_models.remove(loaded)
