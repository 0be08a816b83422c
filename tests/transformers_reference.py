"""The Reasoner's numerical reference: transformers 5.24.0 on the same checkpoint folder, in its own process.

transformers' image and video processors resize through torchvision, and the package index's
torchvision builds expect CUDA libraries beside a CPU torch. So the reference runs in a subprocess
that puts torchvision 0.28.0 (installed with --no-deps into a folder of its own, see .ci/run) on its
path, with its two custom-operator registration modules stubbed: those register nms and roi_align
kernels for the CUDA build; the resize path used here is plain torch. The test process itself never
imports torchvision.

    python tests/transformers_reference.py JOB.json

JOB: {"root", "out", "cases": [{"name", "question", "images": [.npy], "video": .npy | null,
"video_fps", "sample_fps", "system", "thinking", "max_new_tokens"}]}. Writes OUT/NAME.safetensors.
"""

import json
import os
import sys
import types
from pathlib import Path

TORCHVISION_DIR_ENV = "COSMOS3_REFERENCE_TORCHVISION"
DEFAULT_TORCHVISION_DIR = Path(__file__).resolve().parents[1] / ".venv" / "reference-torchvision"


def torchvision_dir() -> Path:
    return Path(os.environ.get(TORCHVISION_DIR_ENV, DEFAULT_TORCHVISION_DIR))


def _use_torchvision() -> None:
    sys.path.insert(0, str(torchvision_dir()))
    for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules[name] = types.ModuleType(name)


def run(job: dict) -> None:
    import numpy as np
    import torch
    from PIL import Image
    from safetensors.torch import save_file
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.video_utils import VideoMetadata

    root, out = job["root"], Path(job["out"])
    processor = AutoProcessor.from_pretrained(root)
    model, info = AutoModelForImageTextToText.from_pretrained(root, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    model.eval()
    edge = model.config.model_type == "cosmos3_edge"
    for case in job["cases"]:
        images = [Image.fromarray(np.load(p)) for p in case.get("images", [])]
        video = np.load(case["video"]) if case.get("video") else None
        content = [{"type": "image"} for _ in images] + ([{"type": "video"}] if video is not None else [])
        question = case["question"]
        if case.get("thinking") and not edge:
            question = question.rstrip() + "\n\n" + case["thinking_instruction"]
        messages = ([{"role": "system", "content": case["system"]}] if case.get("system") else []) + [
            {"role": "user", "content": content + [{"type": "text", "text": question}]}]
        template_kwargs = {"enable_thinking": bool(case.get("thinking"))} if edge else {}
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **template_kwargs)
        kwargs = dict(text=[text], return_tensors="pt", return_mm_token_type_ids=True)
        if images:
            kwargs["images"] = images
        if video is not None:
            metadata = VideoMetadata(total_num_frames=len(video), fps=case["video_fps"],
                                     width=video.shape[2], height=video.shape[1])
            kwargs.update(videos=[video], video_metadata=[metadata], do_sample_frames=True, return_metadata=True)
            if case.get("sample_fps"):  # else the processor's own rate
                kwargs["fps"] = case["sample_fps"]
        inputs = processor(**kwargs)
        inputs.pop("video_metadata", None)
        with torch.no_grad():
            result = model.generate(**inputs, max_new_tokens=case["max_new_tokens"], do_sample=False,
                                    output_logits=True, return_dict_in_generate=True)
        prompt = inputs["input_ids"][0]
        tensors = {"input_ids": prompt, "generated": result.sequences[0, prompt.numel():],
                   "logits": torch.stack([step[0].float() for step in result.logits])}
        for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "mm_token_type_ids"):
            if key in inputs:
                tensors[key] = inputs[key].contiguous()
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / f"{case['name']}.safetensors"))
        (out / f"{case['name']}.txt").write_text(text)


if __name__ == "__main__":
    _use_torchvision()
    run(json.loads(Path(sys.argv[1]).read_text()))
