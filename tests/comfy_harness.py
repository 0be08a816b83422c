"""Running workflows without ComfyUI: core-node stand-ins and an API-prompt executor.

The executor follows ComfyUI's rules: every node type must exist; required inputs must be present;
widget values must have the declared type, lie within min/max and, for combos, be listed; links must
point at an existing output whose type matches the input; nodes run in dependency order.
The stand-ins declare the inputs of ComfyUI's own nodes (SaveImage, LoadImage, CreateVideo, SaveVideo,
LoadVideo, GetVideoComponents) and check what they receive instead of writing files.
"""

import json
from pathlib import Path

import numpy as np
import torch

WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN")
UPLOAD_OPTIONS = ("image_upload", "video_upload", "audio_upload")  # these add one UI-only widget value ("image")


def check_image_batch(images, what):
    assert isinstance(images, torch.Tensor) and images.ndim == 4 and images.shape[-1] == 3, (what, images.shape)
    assert images.dtype == torch.float32 and 0 <= images.min() and images.max() <= 1, what
    assert images.device.type == "cpu", what


class SaveImage:
    saved: list = []
    OUTPUT_NODE = True
    RETURN_TYPES = ()
    FUNCTION = "save_images"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",), "filename_prefix": ("STRING", {"default": "ComfyUI"})}}

    def save_images(self, images, filename_prefix):
        check_image_batch(images, "SaveImage.images")
        SaveImage.saved.append((filename_prefix, images))
        return {"ui": {"images": [{"filename": f"{filename_prefix}_00001_.png"}]}}


class LoadImage:
    input_dir: Path | None = None
    RETURN_TYPES = ("IMAGE", "MASK")
    FUNCTION = "load_image"

    @classmethod
    def INPUT_TYPES(cls):
        files = sorted(p.name for p in cls.input_dir.glob("*.png")) if cls.input_dir else []
        return {"required": {"image": (files, {"image_upload": True})}}

    def load_image(self, image):
        from PIL import Image

        pixels = np.asarray(Image.open(self.input_dir / image).convert("RGB"), dtype=np.float32) / 255
        tensor = torch.from_numpy(pixels)[None]
        return (tensor, torch.zeros(tensor.shape[:3]))


class LoadAudio:
    input_dir: Path | None = None
    RETURN_TYPES = ("AUDIO",)
    FUNCTION = "execute"

    @classmethod
    def INPUT_TYPES(cls):
        files = sorted(p.name for p in cls.input_dir.glob("*.wav")) if cls.input_dir else []
        return {"required": {"audio": (files, {"audio_upload": True})}}

    def execute(self, audio):
        import wave

        with wave.open(str(self.input_dir / audio)) as f:
            pcm = np.frombuffer(f.readframes(f.getnframes()), dtype=np.int16).reshape(-1, f.getnchannels())
            rate = f.getframerate()
        return ({"waveform": torch.from_numpy(pcm.T / 32768.0).float()[None], "sample_rate": rate},)


class Video:
    """Stand-in for comfy_api's VideoFromComponents."""

    def __init__(self, images, fps, audio=None):
        self.images, self.fps, self.audio = images, fps, audio


class CreateVideo:
    RETURN_TYPES = ("VIDEO",)
    FUNCTION = "execute"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE",), "fps": ("FLOAT", {"default": 30.0, "min": 1.0, "max": 120.0,
                                                                     "step": 1.0})},
                "optional": {"audio": ("AUDIO",), "bit_depth": ("INT", {"default": 8, "min": 8, "max": 10, "step": 2})}}

    def execute(self, images, fps, audio=None, bit_depth=8):
        check_image_batch(images, "CreateVideo.images")
        assert isinstance(fps, float), fps
        if audio is not None:  # ComfyUI's AUDIO: {"waveform": [B, C, N] float, "sample_rate": int}
            waveform = audio["waveform"]
            assert waveform.ndim == 3 and waveform.dtype == torch.float32 and isinstance(audio["sample_rate"], int)
            assert waveform.abs().max() <= 1 and waveform.device.type == "cpu"
        return (Video(images, fps, audio),)


class SaveVideo:
    saved: list = []
    OUTPUT_NODE = True
    RETURN_TYPES = ()
    FUNCTION = "execute"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"video": ("VIDEO",), "filename_prefix": ("STRING", {"default": "video/ComfyUI"}),
                             "format": (["auto", "mp4", "mkv", "webm"], {"default": "auto"}),
                             "format.codec": (["auto"], {"default": "auto"}),
                             "codec": (["auto", "h264", "av1"], {"default": "auto"}),
                             "codec.encoding": (["auto"], {"default": "auto"})}}

    def execute(self, video, filename_prefix, **options):
        assert isinstance(video, Video)
        SaveVideo.saved.append((filename_prefix, video))
        return {"ui": {"images": [{"filename": f"{filename_prefix}_00001_.mp4"}], "animated": [True]}}


class LoadVideo:
    clips: dict = {}
    RETURN_TYPES = ("VIDEO",)
    FUNCTION = "execute"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"file": (sorted(cls.clips), {"video_upload": True})}}

    def execute(self, file):
        return (self.clips[file],)


class GetVideoComponents:
    RETURN_TYPES = ("IMAGE", "AUDIO", "FLOAT")
    FUNCTION = "execute"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"video": ("VIDEO",)}}

    def execute(self, video):
        return (video.images, None, video.fps)


class PreviewAny:
    """Stand-in for ComfyUI's Preview Any (comfy_extras/nodes_preview_any.py): shows a value as text."""

    RETURN_TYPES = ("STRING",)
    FUNCTION = "main"
    OUTPUT_NODE = True
    shown: list = []

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"source": ("*", {})}}

    def main(self, source=None):
        text = source if isinstance(source, str) else json.dumps(source)
        PreviewAny.shown.append(text)
        return {"ui": {"text": (text,)}, "result": (text,)}


class CoreSampling:
    """Stand-ins for the core nodes of the core-MODEL workflows: they declare ComfyUI's inputs (checked against
    the real nodes by test_comfyui_tier2.py) but cannot run without ComfyUI (test_comfyui_server.py runs them)."""

    FUNCTION = "execute"

    def execute(self, **inputs):
        raise WorkflowError(f"{type(self).__name__} is ComfyUI's own node: run core-MODEL workflows in ComfyUI")


SEED = ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True})
SAMPLERS = ["euler", "uni_pc_bh2", "lcm"]  # the ones the shipped workflows use (a subset of ComfyUI's list)


class KSampler(CoreSampling):
    RETURN_TYPES = ("LATENT",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "seed": SEED,
                             "steps": ("INT", {"default": 20, "min": 1, "max": 10000}),
                             "cfg": ("FLOAT", {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01}),
                             "sampler_name": (SAMPLERS,), "scheduler": (["simple", "beta", "normal"],),
                             "positive": ("CONDITIONING",), "negative": ("CONDITIONING",), "latent_image": ("LATENT",),
                             "denoise": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01})}}


class SamplerCustomAdvanced(CoreSampling):
    RETURN_TYPES = ("LATENT", "LATENT")
    RETURN_NAMES = ("output", "denoised_output")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"noise": ("NOISE",), "guider": ("GUIDER",), "sampler": ("SAMPLER",), "sigmas": ("SIGMAS",),
                             "latent_image": ("LATENT",)}}


class CFGGuider(CoreSampling):
    RETURN_TYPES = ("GUIDER",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "positive": ("CONDITIONING",), "negative": ("CONDITIONING",),
                             "cfg": ("FLOAT", {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01})}}


class BasicGuider(CoreSampling):
    RETURN_TYPES = ("GUIDER",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "conditioning": ("CONDITIONING",)}}


class SamplerARVideo(CoreSampling):
    RETURN_TYPES = ("SAMPLER",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"num_frame_per_block": ("INT", {"default": 1, "min": 1, "max": 64})}}


class KSamplerSelect(CoreSampling):
    RETURN_TYPES = ("SAMPLER",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"sampler_name": (SAMPLERS,)}}


class RandomNoise(CoreSampling):
    RETURN_TYPES = ("NOISE",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"noise_seed": SEED}}


class Wan22ImageToVideoLatent(CoreSampling):
    RETURN_TYPES = ("LATENT",)

    @classmethod
    def INPUT_TYPES(cls):
        size = {"min": 32, "max": 16384, "step": 32}
        return {"required": {"vae": ("VAE",), "width": ("INT", {"default": 1280, **size}),
                             "height": ("INT", {"default": 704, **size}),
                             "length": ("INT", {"default": 49, "min": 1, "max": 16384, "step": 4}),
                             "batch_size": ("INT", {"default": 1, "min": 1, "max": 4096})},
                "optional": {"start_image": ("IMAGE",)}}


class VAEDecode(CoreSampling):
    RETURN_TYPES = ("IMAGE",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",), "vae": ("VAE",)}}


class EasyCache(CoreSampling):
    RETURN_TYPES = ("MODEL",)

    @classmethod
    def INPUT_TYPES(cls):
        fraction = {"min": 0.0, "max": 1.0, "step": 0.01}
        return {"required": {"model": ("MODEL",),
                             "reuse_threshold": ("FLOAT", {"default": 0.2, "min": 0.0, "max": 3.0, "step": 0.01}),
                             "start_percent": ("FLOAT", {"default": 0.15, **fraction}),
                             "end_percent": ("FLOAT", {"default": 0.95, **fraction}),
                             "verbose": ("BOOLEAN", {"default": False})}}


class TorchCompileModel(CoreSampling):
    RETURN_TYPES = ("MODEL",)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "backend": (["inductor", "cudagraphs"], {"default": "inductor"})}}


CORE_SAMPLING = (EasyCache, TorchCompileModel, KSampler, SamplerCustomAdvanced, CFGGuider, BasicGuider, KSamplerSelect,
                 SamplerARVideo, RandomNoise, Wan22ImageToVideoLatent, VAEDecode)
CORE_NODES = {cls.__name__: cls for cls in (SaveImage, LoadImage, LoadAudio, CreateVideo, SaveVideo, LoadVideo, GetVideoComponents,
                                            PreviewAny, *CORE_SAMPLING)}


# --- node definitions --------------------------------------------------------------------------


def declared_inputs(cls) -> dict:
    """name -> (type or combo list, options, required?) in definition order (required first)."""
    types = cls.INPUT_TYPES()
    inputs = {}
    for section in ("required", "optional"):
        for name, spec in types.get(section, {}).items():
            inputs[name] = (spec[0], spec[1] if len(spec) > 1 else {}, section == "required")
    return inputs


def is_widget(kind) -> bool:
    return isinstance(kind, list) or kind in WIDGET_TYPES


def widget_names(cls) -> list[str]:
    return [name for name, (kind, _, _) in declared_inputs(cls).items() if is_widget(kind)]


def ui_extra_values(options: dict) -> int:
    """How many UI-only values follow a widget in widgets_values (seed control, upload button)."""
    return int(bool(options.get("control_after_generate"))) + int(any(options.get(k) for k in UPLOAD_OPTIONS))


# --- API prompts ---------------------------------------------------------------------------------


class WorkflowError(AssertionError):
    pass


def validate(prompt: dict, registry: dict) -> None:
    """Raise WorkflowError listing every problem, like ComfyUI's prompt validation."""
    errors = []
    for node_id, node in prompt.items():
        cls = registry.get(node["class_type"])
        if cls is None:
            errors.append(f"{node_id}: missing_node_type {node['class_type']}")
            continue
        declared = declared_inputs(cls)
        for name, (kind, options, required) in declared.items():
            if name not in node["inputs"]:
                if required:
                    errors.append(f"{node_id}.{name}: required_input_missing")
                continue
            errors.extend(_check_value(prompt, registry, node_id, name, kind, options, node["inputs"][name]))
        for name in node["inputs"]:
            if name not in declared:
                errors.append(f"{node_id}.{name}: not an input of {node['class_type']}")
    if errors:
        raise WorkflowError("\n".join(errors))


def _check_value(prompt, registry, node_id, name, kind, options, value) -> list[str]:
    where = f"{node_id}.{name}"
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):  # a link
        source = prompt.get(value[0])
        if source is None:
            return [f"{where}: link to missing node {value[0]}"]
        outputs = registry[source["class_type"]].RETURN_TYPES
        if not 0 <= value[1] < len(outputs):
            return [f"{where}: link to missing output {value}"]
        expected = "COMBO" if isinstance(kind, list) else kind
        if outputs[value[1]] != expected and "*" not in (outputs[value[1]], expected):
            return [f"{where}: return_type_mismatch {outputs[value[1]]} -> {expected}"]
        return []
    if isinstance(kind, list):
        return [] if value in kind else [f"{where}: value_not_in_list {value!r}"]
    if kind not in WIDGET_TYPES:
        return [f"{where}: {kind} input needs a link"]
    python_type = {"INT": int, "FLOAT": (int, float), "STRING": str, "BOOLEAN": bool}[kind]
    if not isinstance(value, python_type) or (kind in ("INT", "FLOAT") and isinstance(value, bool)):
        return [f"{where}: {value!r} is not {kind}"]
    if "min" in options and value < options["min"]:
        return [f"{where}: value_smaller_than_min {value}"]
    if "max" in options and value > options["max"]:
        return [f"{where}: value_bigger_than_max {value}"]
    return []


def execute(prompt: dict, registry: dict) -> dict:
    """Validate, then run every node in dependency order; returns {node id: (outputs, ui)}."""
    validate(prompt, registry)
    results: dict = {}

    def run(node_id, visiting=()):
        if node_id in results:
            return results[node_id][0]
        if node_id in visiting:
            raise WorkflowError(f"cycle through {node_id}")
        node = prompt[node_id]
        kwargs = {}
        for name, value in node["inputs"].items():
            is_link = isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            kwargs[name] = run(value[0], (*visiting, node_id))[value[1]] if is_link else value
        cls = registry[node["class_type"]]
        output = getattr(cls(), cls.FUNCTION)(**kwargs)
        ui = None
        if isinstance(output, dict):
            ui, output = output.get("ui"), output.get("result", ())
        results[node_id] = (tuple(output), ui)
        return results[node_id][0]

    for node_id in prompt:
        run(node_id)
    return results


# --- UI workflows ----------------------------------------------------------------------------------


def load_json(path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))
