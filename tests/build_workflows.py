"""Write the UI-format workflows (and their thumbnails) of the named API-format prompts.

    python tests/build_workflows.py cosmos3_edge_t2v [...]     (or --all)

workflows/api/<name>.json is the source of truth. This writes workflows/<name>.json (what the
ComfyUI editor loads and shows in its template browser) and workflows/<name>.jpg (the template
thumbnail, also used in the README) for the workflows named: a new one, or one whose API prompt
changed. A widget appended to a node needs no rebuild (tests/test_workflows.py checks that each
workflow is valid, not that it is what this would write today).
"""

import hashlib
import json
import sys
import uuid
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]

from comfy_harness import CORE_NODES, declared_inputs, is_widget, load_json, ui_extra_values  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PACK_ID, PACK_VERSION = "cosmos3-nodes", "0.1.0"


def default_value(kind, options):
    if "default" in options:
        return options["default"]
    if isinstance(kind, list):
        return kind[0]
    return {"INT": 0, "FLOAT": 0.0, "STRING": "", "BOOLEAN": False}[kind]


def is_link(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)


# Layout: two rows of stages, read left to right then top to bottom; each stage is a titled group.
TOP_ROW = ("Model", "Input media", "Prompt")
BOTTOM_ROW = ("Sample", "Output")
MODEL_NODES = ("Cosmos3ModelLoader", "Cosmos3GuardrailLoader", "Cosmos3DefaultNegativePrompt", "Cosmos3CoreModel", "EasyCache",
               "TorchCompileModel",
               "Cosmos3LoraLoader")
CONTROL_NODES = ("Cosmos3EdgeControl", "Cosmos3BlurControl", "Cosmos3DepthControl", "Cosmos3SegmentationControl",
                 "Cosmos3WorldScenarioMapControl")
MEDIA_NODES = ("Cosmos3ImageToVideo", "Cosmos3VideoToVideo", "Cosmos3LatentToVideo", "Cosmos3Action",
               "Wan22ImageToVideoLatent", "Cosmos3ConditionFrames", *CONTROL_NODES)
SAMPLE_NODES = ("Cosmos3Sampler", "KSampler", "SamplerCustomAdvanced", "CFGGuider", "BasicGuider", "KSamplerSelect",
                "SamplerARVideo", "RandomNoise", "Cosmos3CoreSimActions",
                "Cosmos3Scheduler", "Cosmos3TransferSampler", "Cosmos3SimTransferSampler", "Cosmos3Reason")
OUTPUT_NODES = ("Cosmos3VAEDecode", "Cosmos3SoundDecode", "CreateVideo", "SaveVideo", "SaveImage", "Cosmos3SaveActions",
                "Cosmos3ActionPlot", "VAEDecode", "PreviewAny")
NODE_WIDTH, GAP, MARGIN, GROUP_TITLE = 340, 40, 40, 46
ROW_GAP = 16  # between the two rows of groups (the transfer workflows' tall samplers need the height)
MEDIA_NODES_ON_TOP = 4  # more input-media nodes than this: the prompt moves to the bottom row
TITLE_BAR = 30  # drawn above a node's pos
COLUMN_HEIGHT = 560
TALL_COLUMN_HEIGHT = 640  # where no arrangement of COLUMN_HEIGHT columns is zoomed in enough to draw text
TEMPLATE_WIDTH = 2016  # the widest graph the template browser's fit (narrower than the saved view) draws text for
REPORT_SPACE = 90  # room left under nodes whose report (web/cosmos3.js) appears after a run
REPORTING = ("Cosmos3ModelLoader", "Cosmos3TextEncode", "Cosmos3Sampler", "Cosmos3TransferSampler",
             "Cosmos3SimTransferSampler", "Cosmos3Reason",
             "Cosmos3UpsamplePrompt", *CONTROL_NODES)
GROUP_COLORS = {"Model": "#3f789e", "Input media": "#8A8", "Prompt": "#b58b2a", "Sample": "#a1309b", "Output": "#444"}
CHECKPOINT_REPOS = "https://huggingface.co/nvidia/"  # where the released checkpoints are published


def ancestors(prompt: dict, node_id: str) -> set[str]:
    found, todo = set(), [node_id]
    while todo:
        for value in prompt[todo.pop()]["inputs"].values():
            if is_link(value) and value[0] not in found:
                found.add(value[0])
                todo.append(value[0])
    return found


def stages(prompt: dict) -> dict[str, str]:
    """The stage (group) of every node: media nodes take everything only they use (a generated source clip)."""
    media = {n for n, node in prompt.items() if node["class_type"] in MEDIA_NODES}
    media_side = set(media).union(*(ancestors(prompt, n) for n in media))
    result = {}
    for node_id, node in prompt.items():
        kind = node["class_type"]
        generated = any(prompt[a]["class_type"] in SAMPLE_NODES for a in ancestors(prompt, node_id))
        if kind in MODEL_NODES:
            result[node_id] = "Model"
        elif kind == "Cosmos3Reason" and generated:  # a question about the generated clip comes after it
            result[node_id] = "Output"
        elif kind in SAMPLE_NODES:  # (a sampler that makes a source clip too: the bottom row has room)
            result[node_id] = "Sample"
        elif node_id in media_side or kind in ("LoadImage", "LoadVideo", "LoadAudio", "GetVideoComponents",
                                                         "Cosmos3RobotState"):
            result[node_id] = "Input media"
        elif kind in OUTPUT_NODES:
            result[node_id] = "Output"
        else:
            result[node_id] = "Prompt"
    return result


def node_height(cls, inputs: int) -> int:
    kinds = [kind for kind, _, _ in declared_inputs(cls).values()]
    multiline = sum(options.get("multiline", False) for _, options, _ in declared_inputs(cls).values())
    widgets = sum(is_widget(kind) for kind in kinds)
    slots = max(inputs, len(cls.RETURN_TYPES))
    previews = {"image_upload": 260, "video_upload": 260, "audio_upload": 40}  # Load Image / Video / Audio show one
    preview = max([previews[k] for _, options, _ in declared_inputs(cls).values() for k in previews if options.get(k)],
                  default=0)
    return 40 + 24 * slots + 28 * widgets + 70 * multiline + preview


def layout(prompt: dict, registry: dict, input_counts: dict) -> tuple[dict, list]:
    """Node positions and sizes, and the groups around each stage: the stages in two rows, the first arrangement whose
    saved view and template view draw text (a zoom of at least TEXT_SCALE)."""
    stage_of = stages(prompt)
    rows = (TOP_ROW, BOTTOM_ROW)
    if sum(stage == "Input media" for stage in stage_of.values()) > MEDIA_NODES_ON_TOP:  # keep the rows balanced
        rows = (TOP_ROW[:-1], ("Prompt", *BOTTOM_ROW))
    # a tall sampler: beside the inputs; many short stages: taller columns
    for arrangement, height in ((rows, COLUMN_HEIGHT), (((*TOP_ROW, "Sample"), ("Output",)), COLUMN_HEIGHT),
                                (rows, TALL_COLUMN_HEIGHT)):
        placed, groups = place(arrangement, prompt, stage_of, registry, input_counts, height)
        width = max(g["bounding"][0] + g["bounding"][2] for g in groups)
        if saved_view(groups)["scale"] >= TEXT_SCALE and width <= TEMPLATE_WIDTH:
            break
    return placed, groups


def place(rows: tuple, prompt: dict, stage_of: dict, registry: dict, input_counts: dict,
          column_height: int) -> tuple[dict, list]:
    placed, groups = {}, []
    y = MARGIN + GROUP_TITLE
    for row in rows:
        x, row_bottom = MARGIN, y
        for stage in row:
            members = [n for n in prompt if stage_of[n] == stage]
            if not members:
                continue
            # Nodes fill columns of at most column_height; a short output chain reads left to right.
            one_per_column = stage == "Output" and len(members) <= 3
            left, columns = x, []  # the height filled in each column of this stage
            for node_id in members:
                cls = registry[prompt[node_id]["class_type"]]
                height = node_height(cls, input_counts[node_id])
                height_with_report = TITLE_BAR + height + (REPORT_SPACE if prompt[node_id]["class_type"] in REPORTING else 0)
                fits = [c for c, used in enumerate(columns) if used + height_with_report <= column_height]
                if one_per_column or not fits:  # a new column
                    columns.append(0)
                column = len(columns) - 1 if one_per_column or not fits else fits[0]
                top = y + columns[column]
                placed[node_id] = ([left + column * (NODE_WIDTH + GAP), top + TITLE_BAR], [NODE_WIDTH, height])
                columns[column] += height_with_report + GAP
                row_bottom = max(row_bottom, top + height_with_report)
            x = left + len(columns) * (NODE_WIDTH + GAP)
            groups.append({"title": stage, "bounding": [left - 16, y - GROUP_TITLE, x - GAP - left + 32,
                                                        row_bottom - y + GROUP_TITLE + 16],
                           "color": GROUP_COLORS[stage], "font_size": 22, "flags": {}})
            x += 2 * 16
        y = row_bottom + ROW_GAP + GROUP_TITLE + 16
    return placed, groups


def api_to_ui(prompt: dict, registry: dict, display_names: dict) -> dict:
    nodes, links = [], []
    outputs_of = {}
    input_counts = {}
    for position, node_id in enumerate(prompt):
        node = prompt[node_id]
        cls = registry[node["class_type"]]
        inputs, values = [], []
        for name, (kind, options, _) in declared_inputs(cls).items():
            value = node["inputs"].get(name)
            if is_widget(kind):
                values.append(default_value(kind, options) if is_link(value) or value is None else value)
                values.extend(["fixed"] if options.get("control_after_generate") else [])
                values.extend(["image"] * (ui_extra_values(options) - bool(options.get("control_after_generate"))))
            if not is_widget(kind) or is_link(value):
                entry = {"name": name, "type": "COMBO" if isinstance(kind, list) else kind, "link": None}
                if is_widget(kind):
                    entry["widget"] = {"name": name}
                if is_link(value):
                    link_id = len(links) + 1
                    source_type = registry[prompt[value[0]]["class_type"]].RETURN_TYPES[value[1]]
                    links.append([link_id, int(value[0]), value[1], int(node_id), len(inputs), source_type])
                    entry["link"] = link_id
                    outputs_of.setdefault((value[0], value[1]), []).append(link_id)
                inputs.append(entry)
        input_counts[node_id] = len(inputs)
        names = getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)
        outputs = [{"name": names[i], "type": t, "links": None, "slot_index": i} for i, t in enumerate(cls.RETURN_TYPES)]
        core = node["class_type"] in CORE_NODES
        properties = {"Node name for S&R": node["class_type"], "cnr_id": "comfy-core" if core else PACK_ID,
                      "ver": None if core else PACK_VERSION}
        if node["class_type"] == "Cosmos3ModelLoader":  # the checkpoint this workflow needs, and where it is
            name = node["inputs"]["model_name"]
            properties["models"] = [{"name": name, "url": CHECKPOINT_REPOS + name.split("/")[-1],
                                     "directory": "cosmos3"}]
        nodes.append({
            "id": int(node_id),
            "type": node["class_type"],
            "pos": None,
            "size": None,
            "flags": {},
            "order": position,
            "mode": 0,
            "inputs": inputs,
            "outputs": outputs,
            "title": node.get("_meta", {}).get("title", display_names.get(node["class_type"], node["class_type"])),
            "properties": properties,
            "widgets_values": values,
        })
    placed, groups = layout(prompt, registry, input_counts)
    for node in nodes:
        node["pos"], node["size"] = placed[str(node["id"])]
        for output in node["outputs"]:
            output["links"] = outputs_of.get((str(node["id"]), output["slot_index"]))
    return {
        "id": str(uuid.UUID(hashlib.md5(json.dumps(prompt, sort_keys=True).encode()).hexdigest())),
        "revision": 0,
        "last_node_id": max(n["id"] for n in nodes),
        "last_link_id": len(links),
        "nodes": nodes,
        "links": links,
        "groups": groups,
        "config": {},
        "definitions": {"subgraphs": []},
        "extra": {"ds": saved_view(groups)},
        "version": 0.4,
    }


# A 1600x1000 window: the front end's side bar takes about 60 px on the left, the menu and tab bars
# about 100 px at the top, the minimap and zoom controls a strip at the bottom.
SCREEN, CANVAS_ORIGIN, CANVAS_END = (1600, 1000), (70, 110), (20, 70)
TEXT_SCALE = 0.6  # below this zoom the front end stops drawing text


def saved_view(groups: list) -> dict:
    """The zoom and offset that show the whole graph inside the free canvas (never zoomed in past 1:1)."""
    right = max(g["bounding"][0] + g["bounding"][2] for g in groups)
    bottom = max(g["bounding"][1] + g["bounding"][3] for g in groups)
    free_w = SCREEN[0] - CANVAS_ORIGIN[0] - CANVAS_END[0]
    free_h = SCREEN[1] - CANVAS_ORIGIN[1] - CANVAS_END[1]
    scale = round(min(1.0, free_w / right, free_h / bottom), 2)
    return {"scale": scale, "offset": [round(CANVAS_ORIGIN[0] / scale), round(CANVAS_ORIGIN[1] / scale)]}


def widget_labels(node: dict, registry: dict) -> list[str]:
    """'name: value' for each widget of a UI node (UI-only values skipped)."""
    values = list(node["widgets_values"])
    labels = []
    for name, (kind, options, _) in declared_inputs(registry[node["type"]]).items():
        if is_widget(kind):
            labels.append(f"{name}: {values.pop(0)}"[:40])
            del values[: ui_extra_values(options)]
    return labels


def thumbnail(workflow: dict, path: Path, registry: dict) -> None:
    """A picture of the graph: one box per node (title and widget values), arrows along the links."""
    from PIL import Image, ImageDraw, ImageFont

    nodes = {n["id"]: n for n in workflow["nodes"]}
    width = max(g["bounding"][0] + g["bounding"][2] for g in workflow["groups"]) + MARGIN
    height = max(g["bounding"][1] + g["bounding"][3] for g in workflow["groups"]) + MARGIN
    image = Image.new("RGB", (width, height), (32, 34, 38))
    draw = ImageDraw.Draw(image)
    title_font, body_font = ImageFont.load_default(size=22), ImageFont.load_default(size=16)
    for group in workflow["groups"]:
        x, y, w, h = group["bounding"]
        draw.rounded_rectangle([x, y, x + w, y + h], radius=8, fill=(44, 46, 52), outline=group["color"], width=3)
        draw.text((x + 12, y + 10), group["title"], fill=group["color"], font=title_font)
    for link in workflow["links"]:
        source, target = nodes[link[1]], nodes[link[3]]
        start = (source["pos"][0] + source["size"][0], source["pos"][1] + 40 + 22 * link[2])
        end = (target["pos"][0], target["pos"][1] + 40 + 22 * link[4])
        draw.line([start, end], fill=(150, 170, 200), width=3)
        draw.ellipse([end[0] - 6, end[1] - 6, end[0] + 6, end[1] + 6], fill=(150, 170, 200))
    for node in nodes.values():
        x, y = node["pos"]
        w = node["size"][0]
        ours = node["properties"]["cnr_id"] == PACK_ID
        lines = widget_labels(node, registry)[:7]
        box_height = 44 + 22 * len(lines)
        draw.rounded_rectangle([x, y, x + w, y + box_height], radius=10, fill=(54, 58, 66),
                               outline=(118, 185, 0) if ours else (120, 120, 130), width=3)
        draw.text((x + 12, y + 10), node["title"][:30], fill=(240, 240, 240), font=title_font)
        for i, line in enumerate(lines):
            draw.text((x + 12, y + 40 + 22 * i), line[:36], fill=(190, 190, 195), font=body_font)
    image.thumbnail((1200, 600))
    image.save(path, quality=88)


def main(names: list[str]) -> None:
    import importlib.util

    if not names:
        sys.exit(__doc__)
    api = ROOT / "workflows" / "api"
    api_paths = sorted(api.glob("*.json")) if names == ["--all"] else [api / f"{name}.json" for name in names]
    spec = importlib.util.spec_from_file_location("cosmos3_pack", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    pack = importlib.util.module_from_spec(spec)
    sys.modules["cosmos3_pack"] = pack
    spec.loader.exec_module(pack)
    from cosmos3_pack import nodes

    registry = {**nodes.NODE_CLASS_MAPPINGS, **CORE_NODES}
    for api_path in api_paths:
        workflow = api_to_ui(load_json(api_path), registry, nodes.NODE_DISPLAY_NAME_MAPPINGS)
        target = ROOT / "workflows" / api_path.name
        target.write_text(json.dumps(workflow, indent=2) + "\n", encoding="utf-8")
        thumbnail(workflow, target.with_suffix(".jpg"), registry)
        print(f"wrote {target.relative_to(ROOT)} and its thumbnail")


if __name__ == "__main__":
    main(sys.argv[1:])
