"""Action nodes: the action request for the sampler, robot state, loading, saving and plotting actions.

COSMOS3_ACTIONS values are dicts: {"actions": float32 tensor [T, width], "domain", "mode", "preset", "fps",
"units" ("normalized" or "dataset")}, the same fields the CLI writes next to a video.
"""

import json
import os

import numpy as np
import torch

from ..cosmos3_runtime import InputError
from ..cosmos3_runtime.action import JOINT_WIDTH, MODES, PRESETS, TIERS, VIEW_POINTS, WIDTHS, ActionRequest
from ..cosmos3_runtime.media import TABLE_TYPES, read_array
from . import services

AUTO = "auto"


class Cosmos3Action:
    DESCRIPTION = ("An action run for the sampler (checkpoints with an action head): policy (observation + "
                   "instruction -> actions and video), forward dynamics (observation + actions -> video) or inverse "
                   "dynamics (clip -> actions). Auto values come from the preset.")
    CATEGORY = "cosmos3/action"
    RETURN_TYPES = ("COSMOS3_ACTION",)
    RETURN_NAMES = ("action",)
    FUNCTION = "build"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "mode": (list(MODES), {"default": "policy"}),
                "domain": (sorted(WIDTHS), {"default": "droid_lerobot", "tooltip": "the robot (embodiment)"}),
                "chunk_size": ("INT", {"default": 0, "min": 0, "max": 256, "tooltip": "actions per chunk (the video "
                               "has one more frame); 0 = the preset's"}),
                "resolution_tier": ([AUTO, *map(str, TIERS)], {"default": AUTO}),
                "view_point": ([AUTO, *VIEW_POINTS], {"default": AUTO, "tooltip": "camera of the observation"}),
                "preset": ([AUTO, *PRESETS], {"default": AUTO, "tooltip": "auto: droid-server for Policy-DROID "
                           "checkpoints, else framework"}),
            },
            "optional": {
                "image": ("IMAGE", {"tooltip": "the observation (policy, forward dynamics)"}),
                "video": ("IMAGE", {"tooltip": "the clip (inverse dynamics; otherwise its first frame)"}),
                "actions": ("COSMOS3_ACTIONS", {"tooltip": "forward dynamics: the actions to roll out"}),
                "state": ("COSMOS3_ROBOT_STATE", {"tooltip": "droid-server: the robot's current joints and gripper"}),
            },
        }

    def build(self, mode, domain, chunk_size, resolution_tier, view_point, preset, image=None, video=None,
              actions=None, state=None):
        request = ActionRequest(
            mode=mode, chunk_size=chunk_size or None, domain=domain,
            resolution_tier=None if resolution_tier == AUTO else int(resolution_tier),
            actions=None if actions is None else actions["actions"], image=None if image is None else image[:1],
            video=video, view_point=None if view_point == AUTO else view_point,
            preset=None if preset == AUTO else preset, state=state,
        )
        return (request,)


class Cosmos3RobotState:
    DESCRIPTION = "The robot's current state for the droid-server preset: 7 joint positions and the gripper."
    CATEGORY = "cosmos3/action"
    RETURN_TYPES = ("COSMOS3_ROBOT_STATE",)
    RETURN_NAMES = ("state",)
    FUNCTION = "build"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"values": ("STRING", {"default": "0, 0, 0, 0, 0, 0, 0, 0", "tooltip": "8 numbers: "
                                         "joints 1-7 (radians) and the gripper (0 open, 1 closed)"})}}

    @classmethod
    def VALIDATE_INPUTS(cls, values):
        return services.words.validation(lambda: parse_state(values), values)

    def build(self, values):
        return (parse_state(values),)


def parse_state(values: str) -> torch.Tensor:
    try:
        state = torch.tensor([float(v) for v in values.replace(";", ",").split(",") if v.strip()])
    except ValueError:
        raise InputError(f"robot state {values!r} must be {JOINT_WIDTH} comma-separated numbers") from None
    if state.numel() != JOINT_WIDTH:
        raise InputError(f"robot state needs {JOINT_WIDTH} numbers (7 joints and the gripper), got {state.numel()}")
    return state


def input_file(name: str) -> str:
    """A file of ComfyUI's input folder by its name; names that leave the folder are refused."""
    folder = os.path.abspath(services.files.input_directory())
    path = os.path.abspath(os.path.join(folder, name))
    if os.path.isabs(name) or os.path.commonpath([folder, path]) != folder:
        raise InputError(f"action file {name!r} is refused: names are files in ComfyUI's input folder")
    if not os.path.isfile(path):
        raise InputError(f"action file {name!r} is not in ComfyUI's input folder ({folder})")
    return path


class Cosmos3LoadActions:
    DESCRIPTION = "Actions from a .json, .npy or .csv file in ComfyUI's input folder ([T, width], one row per step)."
    CATEGORY = "cosmos3/action"
    RETURN_TYPES = ("COSMOS3_ACTIONS",)
    RETURN_NAMES = ("actions",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        folder = services.files.input_directory()
        files = sorted(f for f in os.listdir(folder) if f.lower().endswith(TABLE_TYPES)) if os.path.isdir(folder) else []
        return {"required": {"file": (files or ["(no action files in input/)"],),
                             "domain": (sorted(WIDTHS), {"default": "droid_lerobot"})}}

    def load(self, file, domain):
        actions = read_array(input_file(file), "actions")  # the CLI's --actions reads the same tables
        if actions.ndim != 2:
            raise InputError(f"{file}: actions must be a table [T, width], got shape {list(actions.shape)}")
        return ({"actions": actions, "domain": domain, "mode": "loaded", "preset": None, "fps": None,
                 "units": "file"},)


class Cosmos3SaveActions:
    DESCRIPTION = "Writes actions to ComfyUI's output folder as JSON (with what they are) and .npy."
    CATEGORY = "cosmos3/action"
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "save"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"actions": ("COSMOS3_ACTIONS",),
                             "filename_prefix": ("STRING", {"default": "actions/cosmos3"})}}

    def save(self, actions, filename_prefix):
        folder, name = services.files.output_path(filename_prefix)
        table = actions["actions"]
        meta = {k: v for k, v in actions.items() if k != "actions"}
        with open(os.path.join(folder, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump({**meta, "actions": table.tolist()}, f, indent=1)
        np.save(os.path.join(folder, f"{name}.npy"), table.numpy())
        return {"ui": {"text": [f"saved {name}.json and {name}.npy ({table.shape[0]} x {table.shape[1]})"]}}


class Cosmos3ActionPlot:
    DESCRIPTION = "Plots each action dimension over time as an IMAGE."
    CATEGORY = "cosmos3/action"
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("plot",)
    FUNCTION = "plot"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"actions": ("COSMOS3_ACTIONS",)}}

    def plot(self, actions):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        table = actions["actions"].numpy()
        figure, axis = plt.subplots(figsize=(8, 4.5), dpi=100)
        for dim in range(table.shape[1]):
            axis.plot(table[:, dim], label=f"{dim}")
        axis.set_xlabel("step")
        axis.set_ylabel(f"action ({actions.get('units', 'normalized')})")
        axis.set_title(f"{actions.get('domain')} {actions.get('mode')}")
        if table.shape[1] <= 12:
            axis.legend(loc="upper right", fontsize=7, ncol=2)
        figure.tight_layout()
        figure.canvas.draw()
        pixels = np.asarray(figure.canvas.buffer_rgba())[..., :3].astype(np.float32) / 255
        plt.close(figure)
        return (torch.from_numpy(pixels.copy())[None],)
