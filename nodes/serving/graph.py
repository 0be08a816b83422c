"""The graph an action request runs as, its two endpoint nodes, and `run`, which every transport calls.

Each request becomes one API prompt of the pack's own nodes, queued like any workflow: it waits its turn for the
GPU, reuses a loaded checkpoint, and shows in ComfyUI's queue and history. Cosmos3 API Observation hands over an
observation, which stays in this process's memory (uploads are never written to disk and client file names are
never used), and Cosmos3 API Result hands the actions back. A batch or several candidates are parallel chains
in the same prompt (one model, one schedule). As in SGLang, the video the model co-generates is not decoded.
"""

from .fields import FieldError
from .jobs import JOBS, Job, Refused
from .requests import MAX_BATCH, MAX_CANDIDATES, ActionCall


def _widget_defaults(node_class) -> dict:
    """The required widgets of a node at their defaults (a combo without one: its first choice)."""
    values = {}
    for name, (kind, *rest) in node_class.INPUT_TYPES()["required"].items():
        options = rest[0] if rest else {}
        if isinstance(kind, list):
            values[name] = options.get("default", kind[0])
        elif "default" in options:
            values[name] = options["default"]
    return values


def prompt_graph(call: ActionCall, key: str) -> dict:
    """The API prompt that runs `call`: the pack's nodes at their defaults, with the request's values; one chain
    (observation, action, text, sampler, result) per input and candidate."""
    from ..actions import Cosmos3Action, Cosmos3RobotState
    from ..loader import Cosmos3ModelLoader
    from ..sampling import Cosmos3Sampler, Cosmos3Scheduler, Cosmos3TextEncode

    graph = {
        "model": (Cosmos3ModelLoader, {"model_name": call.model}),
        "schedule": (Cosmos3Scheduler, {"steps": call.steps or 0, "flow_shift": call.flow_shift or 0.0}),
    }
    for i, (prompt, a) in enumerate(call.inputs):
        graph[f"observation_{i}"] = (Cosmos3APIObservation, {"key": key, "index": i})
        graph[f"action_{i}"] = (Cosmos3Action, {
            "mode": a.mode, "domain": a.domain, "chunk_size": a.chunk_size, "resolution_tier": str(a.resolution_tier),
            "view_point": a.view_point, "preset": a.preset,
            "video" if a.mode == "inverse_dynamics" else "image": [f"observation_{i}", 0]})
        if a.state is not None:
            graph[f"state_{i}"] = (Cosmos3RobotState, {"values": ", ".join(map(str, a.state.numpy()))})  # float32
            graph[f"action_{i}"][1]["state"] = [f"state_{i}", 0]
        graph[f"text_{i}"] = (Cosmos3TextEncode, {"prompt": prompt, "negative_prompt": call.negative_prompt})
        for c in range(call.candidates):
            graph[f"sampler_{i}_{c}"] = (Cosmos3Sampler, {
                "model": ["model", 0], "text": [f"text_{i}", 0], "schedule": ["schedule", 0],
                "action": [f"action_{i}", 0], "seed": call.seed + c, "fps": call.fps or 0.0,
                "guidance": call.guidance or 0.0, "cache": call.cache})
            graph[f"result_{i}_{c}"] = (Cosmos3APIResult, {"actions": [f"sampler_{i}_{c}", 1], "key": key, "index": i,
                                                           "candidate": c})
    return {node: {"class_type": cls.__name__, "inputs": {**_widget_defaults(cls), **inputs},
                   "_meta": {"title": f"action endpoint: {node}"}}
            for node, (cls, inputs) in graph.items()}


async def run(call: ActionCall) -> tuple[str, dict]:
    """Queue `call`'s graph and wait for it: (prompt id, {(input, candidate): COSMOS3_ACTIONS}). A request ComfyUI
    refuses raises FieldError; a run that fails, RunError. Cancelled (the client went away) before its turn, the
    prompt leaves the queue; the observation is dropped either way."""
    with Job({"frames": [a.clip() for _, a in call.inputs]}, len(call.inputs) * call.candidates) as job:
        try:
            await job.start(prompt_graph(call, job.key), [prompt for prompt, _ in call.inputs])
        except Refused as exc:  # the loader's node id is "model"
            raise FieldError("model" if "model" in exc.refusal.get("node_errors", {}) else "body", str(exc)) from None
        return job.prompt_id, await job.wait()


class Cosmos3APIObservation:
    DESCRIPTION = "Used by the action endpoints: an observation their request carried (held in memory)."
    CATEGORY = "cosmos3/api"
    DEV_ONLY = True  # internal to the endpoints: ComfyUI lists it only in developer mode
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("frames",)
    FUNCTION = "frames"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"key": ("STRING", {"default": ""}), "index": ("INT", {"default": 0, "min": 0, "max": MAX_BATCH})}}

    def frames(self, key, index):
        return (Job.of(key, "action").payload["frames"][index],)


class Cosmos3APIResult:
    DESCRIPTION = "Used by the action endpoints: hands the actions back to their waiting request."
    CATEGORY = "cosmos3/api"
    DEV_ONLY = True
    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "hand_back"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"actions": ("COSMOS3_ACTIONS",), "key": ("STRING", {"default": ""}),
                             "index": ("INT", {"default": 0, "min": 0, "max": MAX_BATCH}),
                             "candidate": ("INT", {"default": 0, "min": 0, "max": MAX_CANDIDATES})}}

    def hand_back(self, actions, key, index, candidate):
        if key in JOBS:
            JOBS[key].results[index, candidate] = actions
        table = actions["actions"]
        return {"ui": {"text": [f"{table.shape[0]} x {table.shape[1]} actions for request {key[:8]} "
                                f"(input {index}, candidate {candidate})"]}}
