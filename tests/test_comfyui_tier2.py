"""Against a real ComfyUI checkout (COMFYUI_DIR=/path/to/ComfyUI); skipped when it is not set.

Imports the pack the way ComfyUI does and checks that the stand-ins for core nodes used by
test_workflows.py declare the same inputs as ComfyUI's real nodes, and that every shipped API
workflow uses valid values for them.
"""

import importlib.util
import os
import sys

import pytest

from comfy_harness import CORE_NODES, declared_inputs, load_json
from conftest import ROOT

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason="set COMFYUI_DIR to a ComfyUI checkout to run these")


@pytest.fixture(scope="module")
def comfyui():
    sys.path.insert(0, COMFYUI_DIR)
    from comfy.cli_args import args

    args.cpu = True  # before anything imports comfy.model_management
    spec = importlib.util.spec_from_file_location("cosmos3_tier2", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])  # fmt: skip
    pack = importlib.util.module_from_spec(spec)
    sys.modules["cosmos3_tier2"] = pack
    spec.loader.exec_module(pack)
    return pack


def real_inputs(node_id: str) -> dict:
    """name -> (type or options) of a core node, from its /object_info entry."""
    import nodes as comfy_nodes  # ComfyUI's nodes.py

    cls = comfy_nodes.NODE_CLASS_MAPPINGS.get(node_id)
    if cls is None:
        module = importlib.import_module("comfy_extras.nodes_video")
        cls = getattr(module, node_id)
    if hasattr(cls, "GET_NODE_INFO_V1"):
        info = cls.GET_NODE_INFO_V1()["input"]
    else:
        info = cls.INPUT_TYPES()
    found = {}
    for section in ("required", "optional"):
        for name, spec in info.get(section, {}).items():
            kind = spec[0]
            if kind == "COMBO":
                kind = spec[1].get("options", [])
            elif kind == "COMFY_DYNAMICCOMBO_V3":  # options carry their child inputs: keep the keys
                kind = [option["key"] for option in spec[1]["options"]]
            found[name] = kind
    return found


def test_the_pack_registers_in_comfyui(comfyui):
    import folder_paths

    assert "Cosmos3Sampler" in comfyui.NODE_CLASS_MAPPINGS and comfyui.WEB_DIRECTORY == "./web"
    assert "cosmos3" in folder_paths.folder_names_and_paths


@pytest.mark.parametrize("node_id", sorted(set(CORE_NODES) - {"LoadImage", "LoadVideo"}))
def test_core_stand_ins_declare_the_real_inputs(comfyui, node_id):
    real = real_inputs(node_id)
    ours = declared_inputs(CORE_NODES[node_id])
    # "format.codec" is a DynamicCombo child: /object_info lists only its parent ("format")
    assert {name.split(".")[0] for name in ours} == set(real), (node_id, sorted(real))
    for name, (kind, _, _) in ours.items():
        if "." in name:
            continue
        if isinstance(kind, list):
            used = {n["inputs"][name] for p in (ROOT / "workflows" / "api").glob("*.json")
                    for n in load_json(p).values() if n["class_type"] == node_id and name in n["inputs"]}  # fmt: skip
            assert used <= set(real[name]), (node_id, name, used)
        else:
            assert kind == real[name], (node_id, name)
