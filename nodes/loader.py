"""Loading checkpoints: the model loader node, the checkpoint registry, and the default negative prompt."""

import gc
import json
import os
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..cosmos3_runtime import CheckpointError, InputError, load
from ..cosmos3_runtime.checkpoint import PIPELINE_CLASSES, looks_like_repo_id, resolve_repo
from ..cosmos3_runtime.pipeline import planner
from ..cosmos3_runtime.runner import Runner
from ..cosmos3_runtime.workers import WorkerPool
from . import services

NO_CHECKPOINTS = "(no checkpoint folders in models/cosmos3)"
PARTS = ("all", "reasoner")
OWN_WEIGHTS = "(the checkpoint's own)"  # transformer_file: the folder's safetensors, or the one .gguf in transformer/
DEVICE_MODES = ["default", "cpu", "offload"]


def is_cosmos3_folder(path: str) -> bool:
    """A diffusers folder whose model_index.json names a Cosmos3 pipeline (models/diffusers is shared)."""
    try:
        with open(os.path.join(path, "model_index.json"), encoding="utf-8") as f:
            return json.load(f).get("_class_name") in PIPELINE_CLASSES
    except (OSError, ValueError, AttributeError):
        return False


def checkpoint_names() -> list[str]:
    """Cosmos3 checkpoint folders up to two levels below each model root."""
    names = set()
    for root in services.files.model_roots():
        if not os.path.isdir(root):
            continue
        for first in sorted(os.listdir(root)):
            path = os.path.join(root, first)
            if is_cosmos3_folder(path):
                names.add(first)
            elif os.path.isdir(path) and not os.path.isfile(os.path.join(path, "model_index.json")):
                names.update(f"{first}/{second}" for second in os.listdir(path)
                             if is_cosmos3_folder(os.path.join(path, second)))
    return sorted(names)


def checkpoint_path(name: str) -> str:
    """The folder of a checkpoint name, which must stay inside one of the model roots."""
    parts = name.replace("\\", "/").split("/")
    if os.path.isabs(name) or name.startswith("~") or any(p in ("", ".", "..") for p in parts):
        raise CheckpointError(
            f"model name {name!r} is refused: names are folders under models/cosmos3 (no '..', no absolute paths)"
        )
    roots = services.files.model_roots()
    for root in roots:
        root = os.path.abspath(root)
        candidate = os.path.normpath(os.path.join(root, *parts))
        if os.path.commonpath([root, candidate]) == root and os.path.isdir(candidate):
            return candidate
    raise CheckpointError(
        f"checkpoint {name!r} not found in {', '.join(roots) or 'any model folder'}; put diffusers-layout checkpoint "
        "folders in ComfyUI/models/cosmos3/ (or add a 'cosmos3' entry to extra_model_paths.yaml)"
    )


@dataclass(frozen=True)
class ModelSpec:
    """What to load; the registry turns it into weights."""

    source: str  # a checkpoint folder (repo ids are resolved to their cache folder first)
    dtype: str
    device: str  # "default", "cpu" or "offload"
    local_files_only: bool = True
    gpus: int = 1
    multi_gpu: str = "sequence"
    offload_text: bool = False
    blocks_to_swap: int = 0
    quantize: str | None = None
    transformer_file: str | None = None  # a .gguf replacing the folder's transformer weights
    parts: str = "all"  # or "reasoner": the text tower and the Reasoner's parts alone

    @property
    def runtime_placement(self) -> bool:
        """The runtime places the transformer itself (text offload, block swap): ComfyUI must not move it whole."""
        return self.offload_text or self.blocks_to_swap > 0

    def compute_device(self):
        return services.memory.torch_device() if self.device != "cpu" else services.memory.offload_device()


# What is loaded, held weakly: ComfyUI's cache owns the pipelines (through the handles it caches), so /free
# and cache eviction release them. One checkpoint is kept: loading another releases every handle's hold
# on the previous one first (a handle that is used again reloads).
_loaded: "weakref.WeakValueDictionary[ModelSpec, Runner]" = weakref.WeakValueDictionary()
_holders: "weakref.WeakSet[Holder]" = weakref.WeakSet()


class Holder:
    """A handle's strong references: its loaded pipeline and the ComfyUI patchers it used (the pipeline refers to
    those only weakly, so that dropping the last handle frees everything without waiting for a garbage collection)."""

    __slots__ = ("loaded", "patchers", "planner", "__weakref__")

    def __init__(self):
        self.loaded = None
        self.patchers = []
        self.planner = None  # plans from the config files while nothing is loaded
        _holders.add(self)

    def keep(self, patcher):
        if all(patcher is not kept for kept in self.patchers):
            self.patchers.append(patcher)
        return patcher


def pipeline_for(spec: ModelSpec) -> Runner:
    """The loaded pipeline of a spec, loading it (and releasing any other) when it is not loaded."""
    loaded = _loaded.get(spec)
    if loaded is None:
        release_all()
        loaded = _loaded[spec] = load_pipeline(spec)
        weakref.finalize(loaded, services.memory.return_freed_memory_soon)  # when ComfyUI lets go of it
    return loaded


def load_dtype(spec: ModelSpec, compute) -> str:
    """The dtype a spec loads in: "auto" is bf16 on a GPU, resolved here because offloaded weights load on the CPU."""
    return "bf16" if spec.dtype == "auto" and compute.type != "cpu" else spec.dtype


def load_pipeline(spec: ModelSpec) -> Runner:
    compute = spec.compute_device()
    dtype = load_dtype(spec, compute)
    if spec.gpus > 1:
        return worker_pool(spec, compute, dtype)
    home = services.memory.offload_device() if spec.device == "offload" else compute
    if home.type != "cpu" and os.path.isdir(spec.source):
        extra = os.path.getsize(spec.transformer_file) if spec.transformer_file else 0
        services.memory.free_memory(_folder_bytes(spec.source) + extra, home)
    pipe = load(spec.source, device=home, dtype=dtype, local_files_only=spec.local_files_only,
                offload_text=spec.offload_text, blocks_to_swap=spec.blocks_to_swap, quantize=spec.quantize,
                linear_class=None if spec.quantize or spec.runtime_placement else services.memory.linear_class(),
                transformer_file=spec.transformer_file, parts=spec.parts)
    pipe.transformer.use_media_attention(services.memory.media_attention())  # ComfyUI's backend, inside ComfyUI
    return pipe


def release_all() -> None:
    """Release every loaded pipeline: worker processes stop, ComfyUI unloads our models, handles let go."""
    for loaded in list(_loaded.values()):
        if loaded.local:
            services.memory.forget_managed(loaded)
        else:
            loaded.close()
    _loaded.clear()
    for holder in list(_holders):
        holder.loaded, holder.patchers = None, []
    gc.collect()
    services.memory.empty_cache()


MULTI_GPU_LAYOUTS = {"sequence": (1, False), "cfg": (2, True), "cfg+sequence": (2, True)}


def worker_pool(spec: ModelSpec, compute, dtype: str) -> WorkerPool:
    """Worker processes on `gpus` consecutive GPUs from ComfyUI's device (CPU processes without GPUs)."""
    branches, cfg_parallel = MULTI_GPU_LAYOUTS[spec.multi_gpu]
    sp = spec.gpus // branches
    if sp * branches != spec.gpus or (spec.multi_gpu == "cfg" and spec.gpus != 2):
        raise InputError(f"multi_gpu '{spec.multi_gpu}' cannot use {spec.gpus} GPUs: 'cfg' needs 2, "
                         "'cfg+sequence' an even number")
    if compute.type == "cuda":
        first = compute.index or 0
        if first + spec.gpus > services.memory.cuda_device_count():
            raise InputError(f"{spec.gpus} GPUs from cuda:{first} requested, {services.memory.cuda_device_count()} present")
        devices = [f"cuda:{first + i}" for i in range(spec.gpus)]
    else:
        devices = ["cpu"] * spec.gpus
    return WorkerPool(spec.source, devices, sp=sp, cfg_parallel=cfg_parallel, dtype=dtype,
                      local_files_only=spec.local_files_only, offload_text=spec.offload_text,
                      blocks_to_swap=spec.blocks_to_swap, quantize=spec.quantize,
                      transformer_file=spec.transformer_file)


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


@dataclass(frozen=True)
class ModelHandle:
    """The COSMOS3_MODEL (part "model": transformer and VAE) or COSMOS3_VAE (part "vae") passed between nodes."""

    spec: ModelSpec
    name: str
    part: str = "model"
    holder: Holder = field(default_factory=Holder, compare=False, repr=False)

    @property
    def pipeline(self) -> Runner:
        if self.holder.loaded is None:
            self.holder.loaded = pipeline_for(self.spec)
        return self.holder.loaded

    def plan(self, prompt, request, session: bool = False):
        """The generation planned once (its notes and its memory estimate read before it runs), from the config files
        unless the weights are loaded here; a request whose output cannot fit in host memory (or a Sim-Bimanual run
        without its actions, unless it opens a `session`) is refused now, before any weight is read (the device's own
        check comes once ComfyUI has made room there)."""
        pipe = self.holder.loaded or _loaded.get(self.spec)
        if pipe is not None and pipe.local:
            planning = pipe.planner
        else:
            compute = self.spec.compute_device()
            planning = self.holder.planner = self.holder.planner or planner(
                self.spec.source, compute, load_dtype(self.spec, compute), local_files_only=self.spec.local_files_only)
        plan = planning.plan(prompt, request)
        planning.check(plan, output_only=True, session=session)
        return plan

    def memory_needed(self, plan) -> int:
        """Bytes a planned generation needs beyond the weights on this process's device (none for worker pools)."""
        return plan.estimate.total if self.pipeline.local else 0

    def model_patcher(self):
        """The transformer's ComfyUI patcher: the core MODEL (Cosmos3 Core Model), which the pack's own nodes
        load too, so both paths move the same weights through one patcher."""
        from .core.model import model_patcher

        pipe, spec = self.pipeline, self.spec
        if not pipe.transformer.has_media:
            raise InputError("this checkpoint was loaded with parts 'reasoner' (no generator weights); set the "
                             "loader's parts to 'all' to generate")
        compute, offload = spec.compute_device(), services.memory.offload_device()

        def reload(disable_dynamic=True):  # an independent copy, when ComfyUI asks for one (dynamic VRAM)
            return model_patcher(load_pipeline(spec), compute, offload, disable_dynamic=disable_dynamic)

        return self.holder.keep(services.memory.managed_patcher(pipe, pipe.transformer, compute, offload,
                                                         make=lambda: model_patcher(pipe, compute, offload, reload=reload)))

    @contextmanager
    def use(self, memory_required: int = 0, reasoner: bool = False):
        """The pipeline with this handle's part on its compute device for the duration of a node (with `reasoner`,
        the Reasoner's own parts too: its head and vision tower, a model of ComfyUI's memory manager of their own).

        In ComfyUI the transformer and the VAE (with the sound tokenizer) are models of its memory
        manager: loaded through it (evicting other models as needed), evicted by it and by /free. The
        VAE nodes load only the VAE; `memory_required` (bytes the node will allocate) is made room for as well.
        `device: offload` moves them for the node and back after; with
        text offload or block swap the runtime places the transformer itself.
        """
        pipe = self.pipeline
        if not pipe.local:  # the workers own their devices
            yield pipe
            return
        if self.spec.device == "offload":
            moving = [pipe] if self.part == "model" else [m for m in (pipe.vae, pipe.sound_tokenizer) if m is not None]
            for item in moving:
                item.to(self.spec.compute_device())
            try:
                yield pipe
            finally:
                for item in moving:
                    item.to(services.memory.offload_device())
                services.memory.empty_cache()
            return
        if services.in_comfyui():
            compute, offload = self.spec.compute_device(), services.memory.offload_device()
            patchers = [self.holder.keep(services.memory.managed_patcher(pipe, m, compute, offload))
                        for m in (pipe.vae, pipe.sound_tokenizer) if m is not None]
            if self.part == "model" and not self.spec.runtime_placement:  # (a Reasoner-only load: its text tower)
                patchers.append(self.model_patcher() if pipe.transformer.has_media else
                                self.holder.keep(services.memory.managed_patcher(pipe, pipe.transformer, compute, offload)))
            if reasoner:
                patchers.append(self.holder.keep(services.memory.managed_patcher(pipe, pipe.reasoner.parts, compute, offload)))
            services.memory.load_managed(patchers, memory_required)
            pipe.device = compute  # the run's device; ComfyUI may leave small modules (norms, embeddings) in RAM
            if reasoner:
                pipe.reasoner.device = pipe.device
        yield pipe


class Cosmos3ModelLoader:
    DESCRIPTION = "Loads a Cosmos3 checkpoint (diffusers folder) and detects its variant from its config files."
    CATEGORY = "cosmos3"
    RETURN_TYPES = ("COSMOS3_MODEL", "COSMOS3_VAE", "STRING")
    RETURN_NAMES = ("model", "vae", "info")
    OUTPUT_TOOLTIPS = ("the transformer and tokenizer", "the Wan 2.2 VAE", "the detected variant")
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        names = checkpoint_names() or [NO_CHECKPOINTS]
        return {
            "required": {
                "model_name": (names, {"tooltip": "a checkpoint folder under models/cosmos3 or models/diffusers"}),
                "dtype": (["auto", "bf16", "fp16", "fp32"], {"default": "auto",
                          "tooltip": "auto: bf16 on GPU (the released precision), fp32 on CPU"}),
                "device": (DEVICE_MODES, {"default": "default", "tooltip": "default: keep on ComfyUI's GPU; "
                           "offload: keep in RAM and move to the GPU only while sampling or decoding; cpu: run on CPU"}),
            },
            "optional": {
                "hf_repo_id": ("STRING", {"default": "", "tooltip": "instead of model_name: a Hugging Face repo id "
                               "such as nvidia/Cosmos3-Nano (namespace/name[/subfolder]), read from the local Hugging "
                               "Face cache; not a folder path (put folders in models/cosmos3)"}),
                "allow_download": ("BOOLEAN", {"default": False, "tooltip": "let hf_repo_id download missing files "
                                   "into the Hugging Face cache (tens of GB)"}),
                "gpus": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "GPUs to sample on, starting at "
                         "ComfyUI's device; more than 1 starts one worker process per GPU"}),
                "multi_gpu": (list(MULTI_GPU_LAYOUTS), {"default": "sequence", "tooltip": "with several GPUs: split "
                              "the video tokens (sequence), run the two guidance branches side by side (cfg, "
                              "2 GPUs), or both (cfg+sequence)"}),
                "offload_text": ("BOOLEAN", {"default": False, "tooltip": "keep the text tower in RAM except while "
                                 "a prompt is encoded (same results, less VRAM)"}),
                "blocks_to_swap": ("INT", {"default": 0, "min": 0, "max": 128, "tooltip": "stream this many "
                                   "transformer layers from RAM during sampling (same results, less VRAM, slower)"}),
                "quantize": (["none", "fp8", "fp8_scaled"], {"default": "none", "tooltip": "fp8: transformer weights "
                             "in fp8 with per-channel scales (about half the VRAM; small differences); fp8_scaled: "
                             "also the media blocks' matmuls in fp8 (H100 and newer; about twice fp8's error)"}),
                "transformer_file": ([OWN_WEIGHTS, *services.files.gguf_names()], {"default": OWN_WEIGHTS, "tooltip": "a "
                                     "GGUF transformer (Q8_0 ... Q4) from models/diffusion_models or models/unet, kept "
                                     "quantized in memory; a single .gguf in the checkpoint's transformer/ folder is "
                                     "used without this"}),
                "parts": (list(PARTS), {"default": "all", "tooltip": "reasoner: only what Cosmos3 Reason and Upsample "
                          "Prompt need (no generator weights, no VAE): about 58% of the full load for Nano"}),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, hf_repo_id=""):
        repo = (hf_repo_id or "").strip()
        if repo and not looks_like_repo_id(repo):
            return (f"hf_repo_id {repo!r} is not a Hugging Face repo id: the form is namespace/name (e.g. "
                    "nvidia/Cosmos3-Nano); for a folder, put it in models/cosmos3 and pick it in model_name")
        return True

    def load(self, model_name, dtype, device, hf_repo_id="", allow_download=False, gpus=1, multi_gpu="sequence",
             offload_text=False, blocks_to_swap=0, quantize="none", transformer_file=OWN_WEIGHTS, parts="all"):
        repo = hf_repo_id.strip()
        if repo:  # a repo id only: never a path, so a workflow cannot point outside the model folders
            source, name, local_only = str(resolve_repo(repo, local_files_only=not allow_download)), repo, True
        elif model_name == NO_CHECKPOINTS:
            raise CheckpointError("no checkpoint selected: put diffusers-layout Cosmos3 folders in ComfyUI/models/cosmos3/")
        else:
            source, name, local_only = checkpoint_path(model_name), model_name, True
        gguf = None if transformer_file == OWN_WEIGHTS else services.files.gguf_path(transformer_file)
        if parts == "reasoner" and gpus > 1:
            raise InputError("parts 'reasoner' runs on one GPU; set gpus to 1")
        spec = ModelSpec(source, dtype, device, local_only, gpus, multi_gpu, offload_text, blocks_to_swap,
                         None if quantize == "none" else quantize, gguf, parts)
        handle = ModelHandle(spec, name)
        pipe = handle.pipeline
        where = f"{gpus} GPUs ({multi_gpu})" if gpus > 1 else spec.device
        weights = getattr(pipe, "transformer_file", None) or gguf  # the runtime also finds a .gguf in transformer/
        low_vram = [f for f, on in (("text offloaded", offload_text), (f"{blocks_to_swap} blocks swapped", blocks_to_swap),
                                    (quantize, quantize != "none"), (f"GGUF {os.path.basename(str(weights))}", weights),
                                    ("the Reasoner alone", parts == "reasoner"))
                    if on]
        where += "".join(f", {item}" for item in low_vram)
        info = f"{name}: {pipe.variant.describe()} ({pipe.dtype}, {where})"
        services.log.info("Cosmos3 loaded %s", info)
        return {"ui": {"text": [info]}, "result": (handle, ModelHandle(spec, name, part="vae"), info)}


class Cosmos3DefaultNegativePrompt:
    DESCRIPTION = "The checkpoint's own negative prompt (assets/negative_prompt.json), or an empty string."
    CATEGORY = "cosmos3/prompt"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("negative_prompt",)
    FUNCTION = "read"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("COSMOS3_MODEL",)}}

    def read(self, model):
        path = model.pipeline.checkpoint.path("assets", "negative_prompt.json")
        if not path.is_file():
            services.log.warning("Cosmos3: %s ships no assets/negative_prompt.json; using an empty negative", model.name)
            return ("",)
        text = path.read_text(encoding="utf-8")
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path} is not valid JSON ({exc})") from exc
        return (text.strip(),)
