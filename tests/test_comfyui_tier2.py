"""Against a real ComfyUI checkout (COMFYUI_DIR=/path/to/ComfyUI); skipped when it is not set.

Imports the pack the way ComfyUI does and checks that the stand-ins for core nodes used by
test_workflows.py declare the same inputs as ComfyUI's real nodes, that every shipped API
workflow uses valid values for them, and that ComfyUI's validation takes a prompt saved before
a widget was appended.
"""

import importlib

import pytest

from comfy_harness import CORE_NODES, declared_inputs, is_widget, load_json
from conftest import COMFYUI_DIR, ROOT

pytestmark = pytest.mark.skipif(not COMFYUI_DIR, reason="set COMFYUI_DIR to a ComfyUI checkout to run these")


def real_inputs(node_id: str) -> dict:
    """name -> (type or options) of a core node, from its /object_info entry."""
    import nodes as comfy_nodes  # ComfyUI's nodes.py

    cls = comfy_nodes.NODE_CLASS_MAPPINGS.get(node_id)
    for module in ("comfy_extras.nodes_video", "comfy_extras.nodes_custom_sampler", "comfy_extras.nodes_wan",
                   "comfy_extras.nodes_easycache", "comfy_extras.nodes_torch_compile", "comfy_extras.nodes_preview_any",
                   "comfy_extras.nodes_ar_video"):
        found = importlib.import_module(module)
        cls = cls or getattr(found, node_id, None) or getattr(found, node_id + "Node", None)
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


@pytest.mark.parametrize("node_id", sorted(set(CORE_NODES) - {"LoadImage", "LoadVideo", "LoadAudio"}))
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
                    for n in load_json(p).values() if n["class_type"] == node_id and name in n["inputs"]}
            assert used <= set(real[name]), (node_id, name, used)
        else:
            assert kind == real[name], (node_id, name)


def test_a_prompt_saved_before_the_samplers_last_widget_passes_comfyuis_validation(comfyui, monkeypatch):
    """ComfyUI's own queue-time validation takes a prompt without an optional widget (made before it was appended)
    and hands the node only the inputs given, so it runs at its own default; a missing required one is refused."""
    import asyncio

    import execution
    import nodes as comfy_nodes

    for node_id, cls in comfyui.nodes.NODE_CLASS_MAPPINGS.items():
        monkeypatch.setitem(comfy_nodes.NODE_CLASS_MAPPINGS, node_id, cls)
    sampler = comfyui.nodes.Cosmos3Sampler
    prompt = load_json(ROOT / "workflows" / "api" / "cosmos3_edge_t2v.json")
    prompt = {n: node for n, node in prompt.items() if node["class_type"].startswith("Cosmos3")}  # (core nodes: not loaded here)
    (loader,) = [node for node in prompt.values() if node["class_type"] == "Cosmos3ModelLoader"]
    loader["inputs"]["model_name"] = comfyui.nodes.Cosmos3ModelLoader.INPUT_TYPES()["required"]["model_name"][0][0]
    (node_id,) = [n for n, node in prompt.items() if node["class_type"] == "Cosmos3Sampler"]
    inputs = prompt[node_id]["inputs"]
    last = [name for name, (kind, _, _) in declared_inputs(sampler).items() if name in inputs and is_widget(kind)][-1]
    assert not declared_inputs(sampler)[last][2]
    del inputs[last]
    valid, errors, _ = asyncio.run(execution.validate_inputs("older", prompt, node_id, {}))
    assert valid and errors == []
    given, _, _ = execution.get_input_data(inputs, sampler, node_id)
    assert last not in given  # the node's keyword default runs
    del inputs["seed"]
    valid, errors, _ = asyncio.run(execution.validate_inputs("older", prompt, node_id, {}))
    assert not valid and [e["type"] for e in errors] == ["required_input_missing"]


def test_comfyui_memory_manager_loads_evicts_and_reloads_our_models(comfyui, tiny_factory, tmp_path):
    """The transformer and the VAE are models of ComfyUI's memory manager: loaded through it, unloaded by
    unload_all_models (what /free with unload_models calls), and loaded again for the next run, same output."""
    import shutil

    import comfy.model_management as mm
    import folder_paths
    import torch

    shutil.copytree(tiny_factory(kind="edge"), tmp_path / "Cosmos3-Edge")
    folder_paths.add_model_folder_path("cosmos3", str(tmp_path))
    nodes = comfyui.nodes
    model, vae, _ = nodes.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default")["result"]
    text = nodes.Cosmos3TextEncode().encode("a cat", "", "auto", True, True, True)["result"][0]

    def ours():
        return [m for m in mm.current_loaded_models if type(m.model.model).__name__ in ("ManagedPart", "Cosmos3Model")]

    first = nodes.Cosmos3Sampler().sample(model, text, 64, 48, 5, 0.0, 0.0, "auto", 1)["result"][0]
    assert len(ours()) == 2  # the VAE (with the sound tokenizer) and the transformer (the core MODEL's patcher)
    mm.unload_all_models()
    assert ours() == []
    (frames, _) = nodes.Cosmos3VAEDecode().decode(vae, first, False, 32, 8)
    assert len(ours()) == 1  # a VAE node loads only the VAE
    again = nodes.Cosmos3Sampler().sample(model, text, 64, 48, 5, 0.0, 0.0, "auto", 1)["result"][0]
    assert torch.equal(first["samples"], again["samples"]) and len(ours()) == 2
    nodes.loader.release_all()
    assert ours() == []


def test_linear_layers_are_comfyui_cast_weight_layers_and_stream_per_layer(comfyui, tiny_factory, tmp_path):
    """With ComfyUI's cast-weight layers its memory manager can load our transformer partially (lowvram)
    and stream the rest per layer; the result stays the same."""
    import comfy.model_management as mm
    import comfy.ops
    import torch

    import cosmos3_runtime

    root = tiny_factory(kind="gated")
    ours = cosmos3_runtime.load(root, dtype="fp32", linear_class=comfyui.nodes.services.memory.linear_class())
    plain = cosmos3_runtime.load(root, dtype="fp32")
    linears = [m for m in ours.transformer.modules() if isinstance(m, torch.nn.Linear)]
    assert sum(isinstance(m, comfy.ops.disable_weight_init.Linear) for m in linears) == len(linears) - 2  # time embedder
    request = dict(width=64, height=48, num_frames=5, steps=2, seed=3, output="latents")
    expected = plain.generate("a cat", **request).latents
    part = comfyui.nodes.services.memory.ManagedPart([ours.transformer], torch.device("cpu"))
    patcher = comfy.model_patcher.CoreModelPatcher(part, load_device=mm.get_torch_device(),
                                                   offload_device=torch.device("cpu"))
    patcher.load(mm.get_torch_device(), lowvram_model_memory=1)  # as good as nothing fits: stream every layer
    streamed = [m for m in linears if getattr(m, "comfy_cast_weights", False)]
    assert streamed, "ComfyUI streams nothing"
    assert torch.equal(ours.generate("a cat", **request).latents, expected)


@pytest.mark.parametrize("path", ["pack sampler", "core MODEL", "block swap", "worker pool", "Reason node"])
def test_a_dropped_checkpoint_is_freed_without_a_garbage_collection(comfyui, tiny_factory, tmp_path, path):
    """Once ComfyUI lets go of a loaded checkpoint's outputs (its cache evicts them under RAM pressure, or /free
    resets it), the weights go at once: nothing the pack builds holds them in a reference cycle, so the release
    never waits for Python's cyclic collector (ComfyUI runs it at most every 10 s)."""
    import gc
    import shutil
    import weakref

    import folder_paths

    shutil.copytree(tiny_factory(kind="edge"), tmp_path / "Cosmos3-Edge")
    folder_paths.add_model_folder_path("cosmos3", str(tmp_path))
    nodes = comfyui.nodes
    nodes.loader.release_all()
    options = {"block swap": {"blocks_to_swap": 1}, "worker pool": {"gpus": 2, "multi_gpu": "cfg"}}.get(path, {})
    gc.collect()
    gc.disable()
    try:
        model, vae, _ = nodes.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default", **options)["result"]
        text = nodes.Cosmos3TextEncode().encode("a cat", "", "auto", True, True, True)["result"][0]
        latent = nodes.Cosmos3Sampler().sample(model, text, 64, 48, 5, 0.0, 0.0, "auto", 1)["result"][0]
        nodes.Cosmos3VAEDecode().decode(vae, latent, False, 32, 8)
        outputs = [model, vae, latent]
        if path == "Reason node":  # the Reasoner's head and vision tower, a managed part of their own
            import torch

            nodes.Cosmos3Reason().reason(model, "What is this?", "", 4, False, 0, image=torch.rand(1, 32, 32, 3))
        if path == "core MODEL":
            core_model, core_vae = nodes.Cosmos3CoreModel().build(model)
            outputs += [core_model, core_model.clone(), core_vae]  # a clone, as LoRA and sampling nodes make
        held = [weakref.ref(model.pipeline)]
        if path != "worker pool":  # (the pool's workers hold its weights; the pool stops when it is collected)
            held += [weakref.ref(model.pipeline.transformer), weakref.ref(next(model.pipeline.transformer.parameters()))]
        if path == "Reason node":
            held += [weakref.ref(model.pipeline.reasoner), weakref.ref(model.pipeline.reasoner.head.lm_head.weight)]
        del model, vae, latent, outputs, text
        if path == "core MODEL":
            del core_model, core_vae
        assert [ref() for ref in held] == [None] * len(held)
    finally:
        gc.enable()


def test_free_reaches_the_prompt_worker_even_while_it_collects_garbage(comfyui):
    """ComfyUI's worker reads the queue's flags after each wake-up; a flag set while it is busy between reading them
    and waiting again (its garbage collection after a run) lost its wake-up. With the pack's nudge it is read."""
    import threading
    import time
    from types import SimpleNamespace

    import execution

    def worker_takes(queue) -> list:
        taken, busy = [], threading.Event()

        def worker():  # the loop of ComfyUI's prompt_worker, with its post-run collection as a pause
            queue.get_flags()
            busy.set()
            time.sleep(0.3)  # gc.collect() after a run: not waiting on the queue
            start = time.monotonic()
            queue.get(timeout=3)  # ComfyUI waits up to 1000 s
            taken.append((queue.get_flags(), time.monotonic() - start < 1))

        thread = threading.Thread(target=worker)
        thread.start()
        busy.wait()
        queue.set_flag("free_memory", True)  # POST /free, while the worker is busy
        thread.join()
        return taken

    plain = execution.PromptQueue(SimpleNamespace(queue_updated=lambda: None))
    assert worker_takes(plain) == [({"free_memory": True}, False)]  # ComfyUI's own queue: read only at the timeout
    nudged = execution.PromptQueue(SimpleNamespace(queue_updated=lambda: None))
    assert comfyui.nodes.services.server.wake_for_flags(nudged)
    assert worker_takes(nudged) == [({"free_memory": True}, True)]
