"""ComfyUI's folders: where checkpoints, LoRAs and GGUF files are found, and the input and output folders (a name
from a workflow never leaves them)."""

import os

from ...cosmos3_runtime.errors import InputError
from .base import _comfy


MODEL_FOLDERS = ("cosmos3", "diffusers")  # ComfyUI model folder names searched for checkpoint folders


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
    if name not in gguf_names():
        raise InputError(f"transformer_file {name!r} is not a .gguf file in models/diffusion_models or models/unet")
    return next(path for root in gguf_folders() if os.path.isfile(path := os.path.join(root, name)))


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
