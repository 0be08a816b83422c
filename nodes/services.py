"""ComfyUI services the nodes use, each with a fallback for running without ComfyUI (tests, scripts).

ComfyUI modules are imported inside the functions: importing this file never imports ComfyUI.
"""

import ctypes
import ctypes.util
import logging
import os
import threading
import weakref
from contextlib import contextmanager

import torch

from ..cosmos3_runtime.errors import reworded
from ..cosmos3_runtime.transformer import attention_inputs

log = logging.getLogger("cosmos3")

MODEL_FOLDERS = ("cosmos3", "diffusers")  # ComfyUI model folder names searched for checkpoint folders


def _comfy(module: str):
    """Import a ComfyUI module, or None outside ComfyUI."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        return None


def register_model_folder() -> None:
    """Make models/cosmos3 a ComfyUI model folder (extra_model_paths.yaml can add more), and list .gguf files in
    diffusion_models (and unet, the same folder name in ComfyUI)."""
    folder_paths = _comfy("folder_paths")
    if folder_paths is None:
        return
    default = os.path.join(folder_paths.models_dir, "cosmos3")
    if "cosmos3" not in folder_paths.folder_names_and_paths:
        folder_paths.folder_names_and_paths["cosmos3"] = ([default], set())
    elif default not in folder_paths.folder_names_and_paths["cosmos3"][0]:
        folder_paths.add_model_folder_path("cosmos3", default)
    paths, extensions = folder_paths.folder_names_and_paths.get("diffusion_models", ([], {".gguf"}))
    if ".gguf" not in extensions:  # a new set: the default one is shared by every model folder
        folder_paths.folder_names_and_paths["diffusion_models"] = (paths, set(extensions) | {".gguf"})


def model_roots() -> list[str]:
    """Folders whose sub-folders are offered as checkpoints."""
    folder_paths = _comfy("folder_paths")
    if folder_paths is None:
        return [p for p in os.environ.get("COSMOS3_MODEL_DIRS", "").split(os.pathsep) if p]
    roots = []
    for name in MODEL_FOLDERS:
        if name in folder_paths.folder_names_and_paths:
            roots.extend(folder_paths.get_folder_paths(name))
    return roots


def lora_names() -> list[str]:
    """The .safetensors files in ComfyUI's loras folders ([] outside ComfyUI)."""
    folder_paths = _comfy("folder_paths")
    names = folder_paths.get_filename_list("loras") if folder_paths is not None else []
    return [n for n in names if n.endswith(".safetensors")]


def read_lora(name: str) -> dict:
    """A LoRA's tensors, read from the loras folder (safetensors only: nothing is unpickled; the name cannot
    leave the folder)."""
    from safetensors.torch import load_file

    from ..cosmos3_runtime import InputError

    path = _comfy("folder_paths").get_full_path("loras", name) if name.endswith(".safetensors") else None
    if path is None:
        raise InputError(f"LoRA {name!r} is not a .safetensors file in models/loras")
    return load_file(path)


def gguf_folders() -> list[str]:
    """ComfyUI's diffusion_models (and unet) folders; outside ComfyUI, COSMOS3_GGUF_DIRS."""
    folder_paths = _comfy("folder_paths")
    if folder_paths is None:
        return [p for p in os.environ.get("COSMOS3_GGUF_DIRS", "").split(os.pathsep) if p]
    return folder_paths.get_folder_paths("diffusion_models")


def gguf_names() -> list[str]:
    """The .gguf files in those folders (and their sub-folders), as names relative to their folder."""
    folder_paths = _comfy("folder_paths")
    if folder_paths is not None:
        names = folder_paths.get_filename_list("diffusion_models")
    else:
        names = [os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/") for root in gguf_folders()
                 for d, _, files in os.walk(root) for f in files]
    return sorted(n for n in names if n.lower().endswith(".gguf"))


def gguf_path(name: str) -> str:
    """The path of a .gguf file listed by `gguf_names` (a name cannot leave those folders)."""
    from ..cosmos3_runtime import InputError

    if name not in gguf_names():
        raise InputError(f"transformer_file {name!r} is not a .gguf file in models/diffusion_models or models/unet")
    return next(path for root in gguf_folders() if os.path.isfile(path := os.path.join(root, name)))


def validation(check, value, names: dict[str, str] | None = None) -> bool | str:
    """A VALIDATE_INPUTS result: True, or the error text that the front end shows on the node (`names`: the API
    names in it -> the node's widget names)."""
    from ..cosmos3_runtime import InputError

    try:
        check()
    except InputError as exc:
        return f"{reworded(str(exc), names or {})} (got {value!r})"
    return True


@contextmanager
def widget_words(names: dict[str, str]):
    """Errors raised inside come out in the node's words: the API names in `names` -> its widget names."""
    from ..cosmos3_runtime import InputError

    try:
        yield
    except InputError as exc:
        raise type(exc)(reworded(str(exc), names)) from exc


def input_directory() -> str:
    folder_paths = _comfy("folder_paths")
    return folder_paths.get_input_directory() if folder_paths is not None else os.environ.get("COSMOS3_INPUT_DIR", "input")


def output_path(prefix: str) -> tuple[str, str]:
    """(folder, file name without extension) for a new output under ComfyUI's output folder; the prefix may name
    subfolders but not leave the output folder."""
    folder_paths = _comfy("folder_paths")
    root = folder_paths.get_output_directory() if folder_paths is not None else os.environ.get("COSMOS3_OUTPUT_DIR",
                                                                                               "output")
    target = os.path.abspath(os.path.join(root, prefix))
    if os.path.isabs(prefix) or os.path.commonpath([os.path.abspath(root), target]) != os.path.abspath(root):
        raise ValueError(f"filename_prefix {prefix!r} leaves the output folder")
    folder, stem = os.path.split(target)
    os.makedirs(folder, exist_ok=True)
    counter = 1 + sum(1 for f in os.listdir(folder) if f.startswith(f"{stem}_") and f.endswith(".json"))
    return folder, f"{stem}_{counter:05d}_"


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
        torch.accelerator.empty_host_cache()


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
    media-attention shapes, or None outside ComfyUI (the runtime then uses SDPA)."""
    attention = _comfy("comfy.ldm.modules.attention")
    if attention is None:
        return None

    def attend(q, k, v):  # q [Nq, A, D], k/v [Nk, K, D] -> [Nq, A*D]
        q, k, v, grouped = attention_inputs(q, k, v)  # [1, heads, N, D]; expanded where SDPA needs it
        return attention.optimized_attention(q, k, v, q.shape[1], skip_reshape=True, enable_gqa=grouped)[0]

    return attend


def in_comfyui() -> bool:
    return _comfy("comfy.model_patcher") is not None and _comfy("comfy.model_management") is not None


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


NUDGES, NUDGE_S = 20, 0.25  # how long flags set by /free are pressed on ComfyUI's prompt worker: 5 s


def wake_for_flags(queue) -> bool:
    """Make flags set on ComfyUI's prompt queue (what POST /free sets) reach its worker.

    The worker reads the flags only after its queue wait returns, and a flag's wake-up is lost when it comes while
    the worker is not waiting: right after a run it collects garbage between reading the flags and waiting again,
    and a /free arriving then sat unread until the next prompt (measured: about one /free in five under load). So
    after a flag is set, the queue is woken again every quarter second while flags are pending, for 5 s at most
    (a running prompt reads them itself when it ends). False when the queue is not ComfyUI's kind."""
    if not all(hasattr(queue, name) for name in ("set_flag", "flags", "mutex", "not_empty")):
        return False
    set_flag = queue.set_flag

    def nudge(left: int) -> None:
        with queue.mutex:
            if not queue.flags:
                return
            queue.not_empty.notify()
        if left > 1:
            timer = threading.Timer(NUDGE_S, nudge, (left - 1,))
            timer.daemon = True
            timer.start()

    def set_flag_and_wake(name, data):
        set_flag(name, data)
        timer = threading.Timer(NUDGE_S, nudge, (NUDGES,))
        timer.daemon = True
        timer.start()

    queue.set_flag = set_flag_and_wake
    return True


def progress_text(text: str, node_id: str | None) -> None:
    """Text shown on a running node (ComfyUI's progress text); nothing outside ComfyUI."""
    server = prompt_server()
    if server is not None and node_id is not None:
        server.send_progress_text(text, node_id)


def prompt_server():
    """ComfyUI's running server, or None outside it."""
    server = _comfy("server")
    return getattr(getattr(server, "PromptServer", None), "instance", None)
