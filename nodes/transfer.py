"""Transfer nodes: one control node per hint, chained into COSMOS3_CONTROLS, and the sampler that makes a clip
following them, chunk by chunk.

COSMOS3_CONTROLS values are dicts {hint: IMAGE batch [F, H, W, 3] in 0..1}. A control node takes frames from any
node (a depth or segmentation preprocessor, a simulator's render, Load Video) or, for edge and blur, derives the
control from a source clip with the model authors' presets.
"""

import os
from pathlib import Path

import numpy as np
import torch

from ..cosmos3_runtime import InputError, Request
from ..cosmos3_runtime.controls import BLUR_PRESETS, DEFAULT_PRESET, EDGE_PRESETS, derive as derive_control, opencv
from ..cosmos3_runtime.errors import reworded
from ..cosmos3_runtime.media import save_video
from ..cosmos3_runtime.request import CAUSAL_CACHES, CAUSAL_HISTORY, help_of
from ..cosmos3_runtime.transfer import HINT_NAMES, summary
from . import services
from .core.prompt_marker import CONTROLS
from .guardrails import GUARDRAIL_INPUT, check_prompt, filter_frames
from .sampling import auto_help, cache_widgets, compile_option, seed_widget, size_widgets, speed_widgets, words_of

GIVEN = "off: the images are the control"  # the derive widget's "don't derive" choice


class ControlNode:
    """A control clip for Cosmos3 Transfer Sampler; HINT names it, PRESETS (edge, blur) let it derive from a clip."""

    CATEGORY = "cosmos3/transfer"
    RETURN_TYPES = (CONTROLS, "IMAGE")
    RETURN_NAMES = ("controls", "control")
    OUTPUT_TOOLTIPS = ("the controls so far, this one added: connect to Cosmos3 Transfer Sampler or another control "
                       "node", "this control's frames (to preview a derived control)")
    FUNCTION = "add"
    HINT: str
    PRESETS: dict = {}

    @classmethod
    def INPUT_TYPES(cls):
        required = {"images": ("IMAGE", {"tooltip": f"the {HINT_NAMES[cls.HINT]} clip as frames (an IMAGE batch)"
                                         + (", or the source clip to derive it from" if cls.PRESETS else "")})}
        if cls.PRESETS:
            required["derive"] = ([GIVEN, *cls.PRESETS], {"default": DEFAULT_PRESET, "tooltip": (
                f"derive the {cls.HINT} control from the images, with the model authors' preset (OpenCV, as NVIDIA's "
                "stacks do; derive at the output size for their result), or use the images as the control")})
        return {"required": required, "optional": {"controls": (CONTROLS, {"tooltip": "controls to add this one to"})}}

    @classmethod
    def VALIDATE_INPUTS(cls, derive=GIVEN):
        """Deriving needs OpenCV (optional): without it the node turns red when queued, saying how to get it."""
        return True if derive == GIVEN else services.words.validation(opencv, derive)

    def add(self, images, derive=GIVEN, controls=None):
        controls = dict(controls or {})
        if self.HINT in controls:
            raise InputError(f"the {self.HINT} control is given twice in this chain; keep one {self.HINT} node")
        derived = derive != GIVEN
        frames = derive_control(self.HINT, images, derive) if derived else images
        controls[self.HINT] = frames
        how = f"derived with preset {derive}" if derived else "as given"
        report = f"{self.HINT}: {frames.shape[0]} frames of {frames.shape[2]}x{frames.shape[1]}, {how}"
        return {"ui": {"text": [report]}, "result": (controls, frames)}


class Cosmos3EdgeControl(ControlNode):
    DESCRIPTION = "An edge control for transfer: a Canny edge clip, or edges derived from a source clip (OpenCV Canny)."
    HINT, PRESETS = "edge", EDGE_PRESETS


class Cosmos3BlurControl(ControlNode):
    DESCRIPTION = ("A blur control for transfer: the output keeps the clip's colours and layout; a blurred clip, or "
                   "one derived from a source clip (OpenCV bilateral filter and resampling).")
    HINT, PRESETS = "blur", BLUR_PRESETS


class Cosmos3DepthControl(ControlNode):
    DESCRIPTION = "A depth control for transfer: a depth clip (from a depth preprocessor or a renderer), near = bright."
    HINT = "depth"


class Cosmos3SegmentationControl(ControlNode):
    DESCRIPTION = "A segmentation control for transfer: a clip of segment colours (from a segmentation preprocessor)."
    HINT = "seg"


class Cosmos3WorldScenarioMapControl(ControlNode):
    DESCRIPTION = ("A world-scenario map control for transfer: a driving simulator's map render (lanes, boxes); "
                   "alone it samples at 10 fps in 101-frame chunks, text guidance off, as the model authors recommend.")
    HINT = "wsm"


# Transfer sampler widget -> Request field; 0 means automatic (None) for these.
TRANSFER_FIELDS = {"width": "width", "height": "height", "frames": "num_frames", "fps": "fps",
                   "guidance": "guidance_scale", "control_guidance": "control_guidance", "chunk_frames": "chunk_frames"}
TRANSFER_WORDS = words_of(TRANSFER_FIELDS, control_videos="controls", vae_tile="tiled decoding")


class ClipSampler:
    """What the transfer samplers share: they make a clip (frames and its rate) from controls."""

    CATEGORY = "cosmos3/transfer"
    RETURN_TYPES = ("IMAGE", "FLOAT")
    RETURN_NAMES = ("images", "fps")
    OUTPUT_TOOLTIPS = ("the clip", "its frame rate: connect it to Create Video")
    FUNCTION = "sample"


class Cosmos3TransferSampler(ClipSampler):
    DESCRIPTION = ("Transfer: a new clip that follows the controls (edge, blur, depth, segmentation, world-scenario "
                   "map) frame for frame and the prompt, made in chunks, each starting from the end of the last. "
                   "Nano and Super; decodes every chunk, so it outputs frames.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("COSMOS3_MODEL",),
                "text": ("COSMOS3_TEXT", {"tooltip": "read verbatim under the transfer system prompt (templates and "
                         "caption metadata do not apply)"}),
                "controls": (CONTROLS, {"tooltip": "from the Cosmos3 control nodes"}),
                **size_widgets(),
                "frames": ("INT", {"default": 0, "min": 0, "max": 100000, "tooltip": "frames to make, at most the "
                           "controls' (the first control in hint order sets the length); 0 = all of them"}),
                "fps": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 240.0, "step": 0.5,
                        "tooltip": "the clip's frame rate, which the model reads (connect the source's); 0 = the "
                                   "authors' 30 (10 for a world-scenario map alone)"}),
                "guidance": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 30.0, "step": 0.1, "round": 0.01,
                             "tooltip": "text guidance (only above 1 does it run); 0 = the authors' 3 (1 for a "
                                        "world-scenario map alone)"}),
                "control_guidance": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 10.0, "step": 0.05, "round": 0.01,
                                     "tooltip": auto_help("control_guidance")}),
                "chunk_frames": ("INT", {"default": 0, "min": 0, "max": 4097, "tooltip": auto_help("chunk_frames")}),
                "chunk_overlap_frames": ("INT", {"default": 1, "min": 0, "max": 64,
                                         "tooltip": help_of("chunk_overlap_frames")}),
                "seed": seed_widget(),
            },
            "optional": {
                "schedule": ("COSMOS3_SCHEDULE", {"tooltip": "steps and flow shift (default: the authors' 50 steps, "
                             "shift 10)"}),
                "control_guidance_interval": ("STRING", {"default": "auto", "tooltip": help_of("control_guidance_interval")}),
                **speed_widgets(),
                **GUARDRAIL_INPUT,
                **cache_widgets(),
            },
            "hidden": {"node_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, control_guidance_interval="auto"):
        return services.words.validation(lambda: Request.build(control_guidance_interval=control_guidance_interval),
                                   control_guidance_interval)

    def sample(self, model, text, controls, width, height, frames, fps, guidance, control_guidance, chunk_frames,
               chunk_overlap_frames, seed, schedule=None, control_guidance_interval="auto", cache="seacache",
               compile=True, guardrail=None, cache_threshold=0.25, cache_max_consecutive=2, node_id=None):
        widgets = dict(width=width, height=height, frames=frames, fps=fps, guidance=guidance,
                       control_guidance=control_guidance, chunk_frames=chunk_frames)
        options = {field: widgets[name] or None for name, field in TRANSFER_FIELDS.items()}
        text_options = {k: v for k, v in text.items() if k in ("negative_prompt", "use_system_prompt")}
        progress = services.progress.RunProgress(node_id)
        check_prompt(guardrail, text["prompt"])  # before anything loads

        with services.words.widget_words(TRANSFER_WORDS):
            request = Request.build(**text_options, **options, **(schedule or {}), control_videos=controls,
                                    chunk_overlap_frames=chunk_overlap_frames, seed=seed, cache=cache,
                                    compile=compile_option(compile), cache_threshold=cache_threshold,
                                    cache_max_consecutive=cache_max_consecutive,
                                    control_guidance_interval=control_guidance_interval)
            plan = model.plan(text["prompt"], request)
            with model.use(memory_required=model.memory_needed(plan)) as pipe:
                result = pipe.generate(plan, callback=progress.step, progress=progress.stage,
                                       interrupt=services.progress.check_interrupt)
        s = result.settings
        report = [f"transfer: {s.width}x{s.height}, {s.num_frames} frames at {s.fps:g} fps, {s.steps} steps "
                  f"({s.schedule}), guidance {s.guidance_scale:g}{summary(s.kind.controls)}",
                  *([result.cache] if result.cache else []), *(reworded(note, TRANSFER_WORDS) for note in s.notes)]
        return {"ui": {"text": report}, "result": (filter_frames(guardrail, result.frames), float(s.fps))}


# Sim-Transfer sampler widget -> Request field; 0 means automatic (None) for these.
SIM_FIELDS = {"width": "width", "height": "height", "frames": "num_frames", "fps": "fps", "window": "causal_window"}
SIM_WORDS = words_of(SIM_FIELDS, control_videos="controls", causal_cache="history", causal_history="history_memory")
TRI_STATE = {"auto": None, "on": True, "off": False}


class Cosmos3SimTransferSampler(ClipSampler):
    DESCRIPTION = ("Sim-Transfer (Cosmos3-Nano-Sim-Transfer, a causal checkpoint): a 480p clip that follows one control "
                   "clip (edge, blur, depth or segmentation) and the prompt, rolled out chunk by chunk in 4 steps "
                   "each, every chunk attending to what came before it (no re-encoding between chunks).")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("COSMOS3_MODEL",),
                "text": ("COSMOS3_TEXT", {"tooltip": "the caption; the control, duration and resolution sentences are "
                         "added as the checkpoint was trained (its templates do not apply)"}),
                "controls": (CONTROLS, {"tooltip": "one control from a Cosmos3 control node (edge, blur, depth or "
                             "segmentation)"}),
                **size_widgets(),
                "frames": ("INT", {"default": 0, "min": 0, "max": 100000, "tooltip": "frames to make, at most the "
                           "control's, trimmed to whole chunks; 0 = all of them"}),
                "fps": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 240.0, "step": 0.5,
                        "tooltip": "the clip's frame rate, which the model reads (connect the source's); 0 = 30"}),
                "seed": seed_widget(),
            },
            "optional": {
                "history": (list(CAUSAL_CACHES), {"default": "kv", "tooltip": help_of("causal_cache")}),
                "window": ("INT", {"default": 0, "min": 0, "max": 100000, "tooltip": auto_help("causal_window")}),
                "emphasize_control": (list(TRI_STATE), {"default": "auto", "tooltip": help_of("emphasize_control")}),
                "history_memory": (list(CAUSAL_HISTORY), {"default": "device", "tooltip": help_of("causal_history")}),
                **GUARDRAIL_INPUT,
            },
            "hidden": {"node_id": "UNIQUE_ID"},
        }

    def sample(self, model, text, controls, width, height, frames, fps, seed, history="kv", window=0,
               emphasize_control="auto", history_memory="device", guardrail=None, node_id=None):
        widgets = dict(width=width, height=height, frames=frames, fps=fps, window=window)
        options = {field: widgets[name] or None for name, field in SIM_FIELDS.items()}
        progress = services.progress.RunProgress(node_id)
        check_prompt(guardrail, text["prompt"])  # before anything loads
        with services.words.widget_words(SIM_WORDS):
            request = Request.build(**options, control_videos=controls, seed=seed, causal_cache=history,
                                    causal_history=history_memory,
                                    emphasize_control=TRI_STATE[emphasize_control],
                                    use_system_prompt=text.get("use_system_prompt"),
                                    negative_prompt=text.get("negative_prompt") or None)
            plan = model.plan(text["prompt"], request)
            with model.use(memory_required=model.memory_needed(plan)) as pipe:
                result = pipe.generate(plan, callback=progress.step, progress=progress.stage,
                                       interrupt=services.progress.check_interrupt)
        s = result.settings
        report = [f"Sim-Transfer: {s.width}x{s.height}, {s.num_frames} frames at {s.fps:g} fps, "
                  f"{len(s.kind.rollout.chunks)} chunks of {s.steps} steps, {s.kind.rollout.hint} control, "
                  f"{'K/V history' if s.kind.rollout.mode == 'kv' else 'recomputed history'}",
                  *(reworded(note, SIM_WORDS) for note in s.notes)]
        return {"ui": {"text": report}, "result": (filter_frames(guardrail, result.frames), float(s.fps))}


EXAMPLE_CLIPS = ("cosmos3_transfer_scene.mp4", "cosmos3_transfer_scene_depth.mp4")


def example_scene(frames: int = 33, height: int = 216, width: int = 384) -> tuple[torch.Tensor, torch.Tensor]:
    """A small synthetic scene and its depth, as IMAGE batches: a ball rolling past a box on a checkered floor. The
    depth (near = bright) is exact, since the scene is drawn from it."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    horizon = height * 0.35
    floor_depth = np.where(y > horizon, 1.5 + 18.0 * horizon / np.maximum(y - horizon, 1.0) / height, 60.0)
    rgb, depth = [], []
    for t in range(frames):
        z = floor_depth.copy()
        checker = ((x / 40 + 3.0 / z * 8).astype(int) + (z * 2).astype(int)) % 2
        image = np.where((y > horizon)[..., None], np.where(checker[..., None] == 1, [190, 180, 160], [90, 80, 70]),
                         [150, 190, 235]).astype(np.float32)
        box = (x > width * 0.58) & (x < width * 0.78) & (y > height * 0.38) & (y < height * 0.72)
        z[box], image[box] = 5.0, [60, 90, 200]
        cx, cy, radius = width * (0.15 + 0.6 * t / max(frames - 1, 1)), height * 0.72, height * 0.14
        ball = (x - cx) ** 2 + (y - cy) ** 2 < radius**2
        shade = 1.0 - 0.5 * np.clip(((x - cx + radius / 3) ** 2 + (y - cy + radius / 3) ** 2) / radius**2, 0, 1)
        z[ball], image[ball] = 2.5, (np.array([220.0, 50.0, 40.0]) * shade[ball][:, None])
        rgb.append(image / 255.0)
        near = np.clip(2.0 / z, 0.0, 1.0)
        depth.append(np.repeat(near[..., None], 3, axis=-1))
    return torch.from_numpy(np.stack(rgb)).float(), torch.from_numpy(np.stack(depth)).float()


def examples_for(json_data: dict) -> dict:
    """ComfyUI's on-prompt hook (it sees every queued prompt before validation): a prompt that names the transfer
    workflows' example clips gets them written into the input folder first, where they are missing."""
    prompt = json_data.get("prompt") if isinstance(json_data, dict) else None
    nodes = prompt.values() if isinstance(prompt, dict) else ()
    if any(value in EXAMPLE_CLIPS for node in nodes if isinstance(node, dict)
           for value in (node.get("inputs") or {}).values() if isinstance(value, str)):
        write_example_clips(services.files.input_directory())
    return json_data


def write_example_clips(folder: str) -> None:
    """The transfer workflows' example clips in ComfyUI's input folder, when they are not there yet (never replaced)."""
    missing = [name for name in EXAMPLE_CLIPS if not os.path.exists(os.path.join(folder, name))]
    if not missing:
        return
    try:
        os.makedirs(folder, exist_ok=True)
        for name, clip in zip(EXAMPLE_CLIPS, example_scene()):
            if name in missing:
                save_video(clip, Path(folder) / name, fps=16.0)
    except (OSError, InputError) as exc:  # a read-only input folder: the workflows then need a clip picked by hand
        services.log.warning("Cosmos3: could not write the transfer example clips to %s (%s)", folder, exc)
