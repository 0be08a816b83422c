"""Regenerate the UI-format workflows (and their thumbnails) from the API-format prompts.

    python tests/build_workflows.py

workflows/api/<name>.json is the source of truth. This writes workflows/<name>.json (what the
ComfyUI editor loads and shows in its template browser) and workflows/<name>.jpg (the template
thumbnail, also used in the README). tests/test_workflows.py converts the UI files back to API
prompts independently and checks that they match.
"""

import hashlib
import json
import sys
import uuid
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).resolve().parents[1])]

from comfy_harness import CORE_NODES, declared_inputs, is_widget, load_json, ui_extra_values  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COLUMN, ROW = 420, 300
PACK_ID, PACK_VERSION = "cosmos3-nodes", "0.1.0"


def default_value(kind, options):
    if "default" in options:
        return options["default"]
    if isinstance(kind, list):
        return kind[0]
    return {"INT": 0, "FLOAT": 0.0, "STRING": "", "BOOLEAN": False}[kind]


def is_link(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)


def depth(prompt, node_id, memo) -> int:
    if node_id not in memo:
        sources = [v[0] for v in prompt[node_id]["inputs"].values() if is_link(v)]
        memo[node_id] = 1 + max((depth(prompt, s, memo) for s in sources), default=-1)
    return memo[node_id]


def api_to_ui(prompt: dict, registry: dict, display_names: dict) -> dict:
    memo: dict = {}
    order = sorted(prompt, key=lambda n: (depth(prompt, n, memo), int(n)))
    rows: dict[int, int] = {}
    nodes, links = [], []
    outputs_of = {}
    for position, node_id in enumerate(order):
        node = prompt[node_id]
        cls = registry[node["class_type"]]
        column = memo[node_id]
        row = rows.get(column, 0)
        rows[column] = row + 1
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
        names = getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)
        outputs = [{"name": names[i], "type": t, "links": None, "slot_index": i} for i, t in enumerate(cls.RETURN_TYPES)]
        widgets = sum(is_widget(kind) for kind, _, _ in declared_inputs(cls).values())
        core = node["class_type"] in CORE_NODES
        nodes.append({
            "id": int(node_id),
            "type": node["class_type"],
            "pos": [40 + column * COLUMN, 40 + row * ROW],
            "size": [360, 60 + 26 * (widgets + max(len(inputs), len(outputs)))],
            "flags": {},
            "order": position,
            "mode": 0,
            "inputs": inputs,
            "outputs": outputs,
            "title": node.get("_meta", {}).get("title", display_names.get(node["class_type"], node["class_type"])),
            "properties": {"Node name for S&R": node["class_type"], "cnr_id": "comfy-core" if core else PACK_ID,
                           "ver": None if core else PACK_VERSION},
            "widgets_values": values,
        })  # fmt: skip
    for node in nodes:
        for output in node["outputs"]:
            output["links"] = outputs_of.get((str(node["id"]), output["slot_index"]))
    return {
        "id": str(uuid.UUID(hashlib.md5(json.dumps(prompt, sort_keys=True).encode()).hexdigest())),
        "revision": 0,
        "last_node_id": max(n["id"] for n in nodes),
        "last_link_id": len(links),
        "nodes": nodes,
        "links": links,
        "groups": [],
        "config": {},
        "definitions": {"subgraphs": []},
        "extra": {"ds": {"scale": 0.8, "offset": [0, 0]}},
        "version": 0.4,
    }


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
    width = max(n["pos"][0] + n["size"][0] for n in nodes.values()) + 40
    height = max(n["pos"][1] + 200 for n in nodes.values()) + 40
    image = Image.new("RGB", (width, height), (32, 34, 38))
    draw = ImageDraw.Draw(image)
    title_font, body_font = ImageFont.load_default(size=22), ImageFont.load_default(size=16)
    for link in workflow["links"]:
        source, target = nodes[link[1]], nodes[link[3]]
        start = (source["pos"][0] + source["size"][0], source["pos"][1] + 40 + 22 * link[2])
        end = (target["pos"][0], target["pos"][1] + 40 + 22 * link[4])
        draw.line([start, end], fill=(150, 170, 200), width=3)
        draw.ellipse([end[0] - 6, end[1] - 6, end[0] + 6, end[1] + 6], fill=(150, 170, 200))
    for node in nodes.values():
        x, y = node["pos"]
        ours = node["properties"]["cnr_id"] == PACK_ID
        lines = widget_labels(node, registry)[:7]
        box_height = 44 + 22 * len(lines)
        draw.rounded_rectangle([x, y, x + 360, y + box_height], radius=10, fill=(54, 58, 66),
                               outline=(118, 185, 0) if ours else (120, 120, 130), width=3)  # fmt: skip
        draw.text((x + 12, y + 10), node["title"], fill=(240, 240, 240), font=title_font)
        for i, line in enumerate(lines):
            draw.text((x + 12, y + 40 + 22 * i), line, fill=(190, 190, 195), font=body_font)
    image.thumbnail((1200, 600))
    image.save(path, quality=88)


def main() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("cosmos3_pack", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    pack = importlib.util.module_from_spec(spec)
    sys.modules["cosmos3_pack"] = pack
    spec.loader.exec_module(pack)
    from cosmos3_pack import nodes

    registry = {**nodes.NODE_CLASS_MAPPINGS, **CORE_NODES}
    for api_path in sorted((ROOT / "workflows" / "api").glob("*.json")):
        workflow = api_to_ui(load_json(api_path), registry, nodes.NODE_DISPLAY_NAME_MAPPINGS)
        target = ROOT / "workflows" / api_path.name
        target.write_text(json.dumps(workflow, indent=2) + "\n", encoding="utf-8")
        thumbnail(workflow, target.with_suffix(".jpg"), registry)
        print(f"wrote {target.relative_to(ROOT)} and its thumbnail")


if __name__ == "__main__":
    main()
