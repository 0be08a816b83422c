"""ComfyUI nodes of the pack (classic V1 API, so the node layer is testable without ComfyUI).

Nodes translate ComfyUI types and call `cosmos3_runtime`; ComfyUI services are reached through
`services`, which imports them lazily and falls back when they are absent.
"""

from . import serving, services, transfer
from .core.lora import Cosmos3LoraLoader
from .guardrails import Cosmos3GuardrailLoader
from .core.nodes import (Cosmos3ConditionFrames, Cosmos3CoreModel, Cosmos3CoreSimActions, Cosmos3CoreSimControl,
                         Cosmos3CoreTextEncode)
from .actions import Cosmos3Action, Cosmos3ActionPlot, Cosmos3LoadActions, Cosmos3RobotState, Cosmos3SaveActions
from .loader import Cosmos3DefaultNegativePrompt, Cosmos3ModelLoader
from .prompting import Cosmos3JSONCaption
from .reasoning import Cosmos3Reason, Cosmos3ReasonSampling, Cosmos3UpsamplePrompt
from .sampling import (Cosmos3ImageToVideo, Cosmos3Keyframes, Cosmos3LatentToVideo, Cosmos3Sampler, Cosmos3Scheduler,
                       Cosmos3TextEncode, Cosmos3VideoToVideo)
from .transfer import (Cosmos3BlurControl, Cosmos3DepthControl, Cosmos3EdgeControl, Cosmos3SegmentationControl,
                       Cosmos3SimTransferSampler, Cosmos3TransferSampler, Cosmos3WorldScenarioMapControl)
from .vae import Cosmos3SoundDecode, Cosmos3VAEDecode, Cosmos3VAEEncode

services.files.register_model_folder()
if services.prompt_server() is not None:  # inside a running ComfyUI
    serving.register_routes()
    services.server.wake_for_flags(services.prompt_server().prompt_queue)
    services.prompt_server().add_on_prompt_handler(transfer.examples_for)  # nothing is written at import

# Every node once: its class and display name. Its id in saved workflows and API prompts is the class name (keep it).
NODES = (
    (Cosmos3ModelLoader, "Cosmos3 Model Loader"),
    (Cosmos3TextEncode, "Cosmos3 Text Encode"),
    (Cosmos3Scheduler, "Cosmos3 Scheduler"),
    (Cosmos3Sampler, "Cosmos3 Sampler"),
    (Cosmos3VAEDecode, "Cosmos3 VAE Decode"),
    (Cosmos3VAEEncode, "Cosmos3 VAE Encode"),
    (Cosmos3ImageToVideo, "Cosmos3 Image to Video"),
    (Cosmos3VideoToVideo, "Cosmos3 Video to Video"),
    (Cosmos3Keyframes, "Cosmos3 Keyframes (first-last frame)"),
    (Cosmos3JSONCaption, "Cosmos3 JSON Caption"),
    (Cosmos3DefaultNegativePrompt, "Cosmos3 Default Negative Prompt"),
    (Cosmos3SoundDecode, "Cosmos3 Sound Decode"),
    (Cosmos3LatentToVideo, "Cosmos3 Latent to Video"),
    (Cosmos3Action, "Cosmos3 Action"),
    (Cosmos3RobotState, "Cosmos3 Robot State"),
    (Cosmos3LoadActions, "Cosmos3 Load Actions"),
    (Cosmos3SaveActions, "Cosmos3 Save Actions"),
    (Cosmos3ActionPlot, "Cosmos3 Action Plot"),
    (serving.Cosmos3APIObservation, "Cosmos3 API Observation"),
    (serving.Cosmos3APIResult, "Cosmos3 API Result"),
    (serving.Cosmos3APIChat, "Cosmos3 API Chat"),
    (serving.Cosmos3APISessionTick, "Cosmos3 API Session Tick"),
    (Cosmos3CoreModel, "Cosmos3 Core Model"),
    (Cosmos3CoreTextEncode, "Cosmos3 Text Encode (core)"),
    (Cosmos3ConditionFrames, "Cosmos3 Condition Frames (core)"),
    (Cosmos3LoraLoader, "Cosmos3 LoRA Loader (core)"),
    (Cosmos3CoreSimControl, "Cosmos3 Sim Control (core)"),
    (Cosmos3CoreSimActions, "Cosmos3 Sim Actions (core)"),
    (Cosmos3EdgeControl, "Cosmos3 Edge Control"),
    (Cosmos3BlurControl, "Cosmos3 Blur Control"),
    (Cosmos3DepthControl, "Cosmos3 Depth Control"),
    (Cosmos3SegmentationControl, "Cosmos3 Segmentation Control"),
    (Cosmos3WorldScenarioMapControl, "Cosmos3 World Scenario Map Control"),
    (Cosmos3TransferSampler, "Cosmos3 Transfer Sampler"),
    (Cosmos3SimTransferSampler, "Cosmos3 Sim-Transfer Sampler"),
    (Cosmos3Reason, "Cosmos3 Reason"),
    (Cosmos3ReasonSampling, "Cosmos3 Reason Sampling"),
    (Cosmos3UpsamplePrompt, "Cosmos3 Upsample Prompt"),
    (Cosmos3GuardrailLoader, "Cosmos3 Guardrail Loader"),
)
NODE_CLASS_MAPPINGS = {cls.__name__: cls for cls, _ in NODES}
NODE_DISPLAY_NAME_MAPPINGS = {cls.__name__: name for cls, name in NODES}
