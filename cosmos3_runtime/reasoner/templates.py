"""Prompt-upsampling templates: the pack's own, and the model authors' read from the user's copy of their framework.

The pack's templates are its own words. They ask for the JSON caption Cosmos3 was trained on, with the same keys,
order and placeholders as the authors' V4.2 templates (text-to-video, text-to-image, image-to-video), so a reply
fits the same reader. The authors' templates are NVIDIA's text (OpenMDW-1.1) and are not shipped: when the user has
their framework (`COSMOS3_UPSAMPLER_TEMPLATES` naming a checkout, its `prompts.py`, or a JSON file {system, t2v,
t2i, i2v}; or an installed `cosmos_framework` package), its templates are read from that file at run time, as text:
the module's string constants are parsed, never executed.
"""

import ast
import importlib.util
import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ..errors import InputError

ENV = "COSMOS3_UPSAMPLER_TEMPLATES"
AUTHORS_MODULE = Path("cosmos_framework", "model", "generator", "upsampler", "prompts.py")
AUTHORS_VERSION = "v4.2"
TASKS = ("t2v", "t2i", "i2v")
SYSTEM = "You are a helpful assistant."


@dataclass(frozen=True)
class Templates:
    system: str
    tasks: dict[str, str]  # task -> template with {description}, {aspect_ratio}, {resolution_w}, {resolution_h}
    source: str  # where they come from, for reports

    def __getitem__(self, task: str) -> str:
        return self.system if task == "system" else self.tasks[task]


# --- the pack's own -------------------------------------------------------------------------------------------

SUBJECT = {
    "description": "what the subject looks like: build, colours, materials, what sets it apart",
    "appearance_details": "smaller visual details: accessories, textures, wear",
    "relationship": "its relation to the other subjects or to the place",
    "location": "where it sits in the frame, e.g. 'left foreground'",
    "relative_size": "'Small within frame', 'Medium within frame' or 'Large within frame'",
    "orientation": "which way it faces, relative to the camera",
    "pose": "its posture",
}
PERSON = {
    "clothing": "what a person wears; '' for anything not human",
    "expression": "a person's facial expression; '' if not human or not visible",
    "gender": "'Male', 'Female' or 'Unknown'; '' if not human",
    "age": "an age group such as 'Child', 'Young adult', 'Adult', 'Middle-aged', 'Elderly'",
    "skin_tone_and_texture": "a person's skin; '' if not human",
    "facial_features": "a person's hair, eyes, facial hair, glasses, marks; '' if not human or not visible",
    "number_of_subjects": "int: how many subjects this entry stands for",
    "number_of_arms": "int: 2 for a person, 0 otherwise",
    "number_of_legs": "int: 2 for a person, 0 otherwise",
}
MOTION = {"action": "what it does, briefly", "state_changes": "how its pose or action changes; 'No significant change.'"}
LOOK = {
    "background_setting": "the place behind and around the subjects",
    "lighting": {"conditions": "the kind of light, e.g. 'overcast daylight'", "direction": "where it comes from",
                 "shadows": "what the shadows are like", "illumination_effect": "a notable effect such as rim light"},
    "aesthetics": {"composition": "how the frame is arranged", "color_scheme": "the palette",
                   "mood_atmosphere": "the feeling", "patterns": "repeating patterns; '' if none"},
}
CAMERA = {"framing": "wide, medium or close-up", "camera_angle": "e.g. eye level, high angle",
          "depth_of_field": "shallow or deep", "focus": "what is sharp",
          "lens_focal_length": "e.g. 'wide-angle 24mm'"}
STYLE = {"style_medium": "the medium, e.g. 'photoreal live action', 'oil painting', '3-D animation'",
         "artistic_style": "a broader style if any, e.g. 'noir'", "context": "the situation or story around it"}
TEXT = {"text": "the exact words", "category": "e.g. 'scene_sign', 'ui_text', 'caption', 'logo'",
        "appearance": "font, colour, size"}

VIDEO_JSON = {
    "scene_imagination": "planning notes, one string (see rule 3)",
    "temporal_caption": "the timeline (see rule 4)",
    "audio_description": "the soundtrack (see rule 4)",
    "subjects": [{**SUBJECT, **MOTION, **PERSON}],
    **LOOK,
    "cinematography": {"camera_motion": "e.g. 'Static', 'Slow pan right', 'Tracking shot'", **CAMERA},
    **STYLE,
    "actions": [{"time": "M:SS-M:SS", "description": "what happens then"}],
    "text_and_signage_elements": [{**TEXT, "spatial_temporal": "where and when it shows",
                                   "context": "why it is there"}],
    "segments": [{"segment_index": "int from 0", "time_range": "M:SS-M:SS", "description": "what this part shows",
                  "key_changes": "what changes in it", "camera": "what the camera does"}],
    "transitions": ["how one segment passes to the next; [] for one continuous shot"],
    "resolution": "rule 5",
    "aspect_ratio": "rule 5",
    "duration": "rule 5",
    "fps": "rule 5",
}
IMAGE_JSON = {
    "scene_imagination": "planning notes, one string (see rule 3)",
    "comprehensive_t2i_caption": "the caption paragraph (see rule 4)",
    "subjects": [{**SUBJECT, **PERSON, "number_of_hands": "int: 2 for a person, 0 otherwise",
                  "number_of_fingers": "int: 10 for a person, 0 otherwise"}],
    "subject_details": {"<attribute>": "2 to 5 further attributes of this image, under names of your own"},
    **LOOK,
    "cinematography": CAMERA,
    **STYLE,
    "text_and_signage_elements": [{**TEXT, "spatial": "where it is", "context": "why it is there"}],
    "quadrant_scan": {"top_left": "what is there", "top_right": "what is there", "bottom_left": "what is there",
                      "bottom_right": "what is there", "absolute_center": "what is there"},
    "resolution": "rule 5",
    "aspect_ratio": "rule 5",
}

RULES_VIDEO = """4. Then `temporal_caption`: the clip as a timeline from 0:00 to the duration, one timestamped beat for each
   thing that happens (an action, a camera move, a change of light); as many beats as there are events. Then
   `audio_description`: what is heard, timestamped where sounds start and stop; if the clip is silent, say so.
5. Copy these values into their keys unchanged: duration "{duration}" (the clip's length), fps {fps} (its frame
   rate), aspect_ratio "{aspect_ratio}", resolution {"W": {resolution_w}, "H": {resolution_h}}.
6. Write times as M:SS, and ranges as M:SS-M:SS. No beat, action or segment ends after the duration; `actions`
   and `segments` agree with the timeline."""
RULES_IMAGE = """4. Then `comprehensive_t2i_caption`: one dense paragraph of 80 to 200 words that gathers every concrete
   detail of the fields below and opens on the subject in its setting (never "this image shows").
5. Copy these values into their keys unchanged: aspect_ratio "{aspect_ratio}", resolution {"W": {resolution_w}, "H":
   {resolution_h}}.
6. People have number_of_hands 2 and number_of_fingers 10; anything else 0. `subject_details` is never empty when a
   person is shown."""
FIRST_FRAME = """
8. The attached image is the clip's first frame: subjects, place, light, colours and style are as it shows them;
   the request says what happens from there."""

LAYOUT = """You turn a short request for {thing} into the structured JSON caption the {model} model was trained on.

The request:
<{tag}>
{{description}}
</{tag}>

Rules:
1. Answer with one JSON object inside a ```json fence, and nothing outside it.
2. Give every key of the template below once, in its order, and no other key. Only a field that cannot apply may be
   "", 0, [] or {{}}; never null.
3. Write `scene_imagination` first: one string of short planning notes (subject, details, style, camera{timing}),
   under 250 words. Every later field follows these notes.
{rules}
7. Keep it consistent (light, place, clothing, camera) and faithful: every element of the request appears; added
   detail fits the scene and its genre.{first_frame}

The template:
{template}"""


def pack_template(task: str) -> str:
    video = task != "t2i"
    thing = {"t2v": "a video", "t2i": "an image", "i2v": "a video that starts from the attached image"}[task]
    model = {"t2v": "text-to-video", "t2i": "text-to-image", "i2v": "image-to-video"}[task]
    return LAYOUT.format(thing=thing, model=model, tag="video_description" if video else "image_description",
                         timing=", timing" if video else "", rules=RULES_VIDEO if video else RULES_IMAGE,
                         first_frame=FIRST_FRAME if task == "i2v" else "",
                         template=json.dumps(VIDEO_JSON if video else IMAGE_JSON, indent=2))


PACK = Templates(SYSTEM, {task: pack_template(task) for task in TASKS}, "the pack's own templates")


# --- the authors', from the user's copy -------------------------------------------------------------------------


def authors_file() -> Path | None:
    """The authors' templates the user has: $COSMOS3_UPSAMPLER_TEMPLATES (a framework checkout, its prompts.py, or a
    JSON file), else an installed cosmos_framework package (found without importing it); None without either."""
    named = os.environ.get(ENV, "").strip()
    if named:
        path = Path(named).expanduser()
        path = path / AUTHORS_MODULE if path.is_dir() else path
        if not path.is_file():
            raise InputError(f"{ENV}={named} names no upsampler templates: give a checkout of NVIDIA's "
                             f"cosmos-framework, its {AUTHORS_MODULE.as_posix()}, or a JSON file "
                             "{system, t2v, t2i, i2v}; or unset it for the pack's own templates")
        return path
    spec = importlib.util.find_spec("cosmos_framework")  # a top-level lookup runs none of the package's code
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))).parent / AUTHORS_MODULE
        return path if path.is_file() else None
    return None


def templates() -> Templates:
    """The authors' templates where the user has them, else the pack's own."""
    path = authors_file()
    return PACK if path is None else read_authors(path.resolve(), path.stat().st_mtime_ns)


@cache
def read_authors(path: Path, _modified: int) -> Templates:
    if path.suffix == ".json":
        raw = json.loads(path.read_text(encoding="utf-8"))
        system, tasks = raw.get("system", SYSTEM), {task: raw.get(task) for task in TASKS}
    else:
        system, tasks = string_constants(path)
    missing = [task for task in TASKS if not isinstance(tasks.get(task), str)]
    if missing or not isinstance(system, str):
        raise InputError(f"{path} holds no {AUTHORS_VERSION} upsampler template for {', '.join(missing) or 'system'}; "
                         f"point {ENV} at a checkout of NVIDIA's cosmos-framework that has them")
    return Templates(system, tasks, f"the model authors' templates from {path}")


def string_constants(path: Path) -> tuple[str | None, dict[str, str]]:
    """SYSTEM_MESSAGE and the v4.2 entries of CANONICAL_TEMPLATES in the authors' prompts.py, read from its syntax
    tree: module-level string assignments, and the dict's (version, task) -> name entries."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    strings, table = {}, None
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if not isinstance(target, ast.Name) or node.value is None:
            continue
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            strings[target.id] = node.value.value
        elif target.id == "CANONICAL_TEMPLATES" and isinstance(node.value, ast.Dict):
            table = node.value
    tasks = {}
    for key, value in zip(table.keys if table is not None else (), table.values if table is not None else ()):
        if isinstance(key, ast.Tuple) and isinstance(value, ast.Name) and len(key.elts) == 2:
            version, task = (getattr(e, "value", None) for e in key.elts)
            if version == AUTHORS_VERSION and task in TASKS and value.id in strings:
                tasks[task] = strings[value.id]
    return strings.get("SYSTEM_MESSAGE"), tasks
