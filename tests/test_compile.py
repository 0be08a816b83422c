"""Compiled code on every device's branch: nothing torch.compile cannot trace.

A CUDA GPU takes branches a CPU never reaches (grouped or expanded K/V, fp16 attention on cards without bf16 in the
memory-efficient kernel, fp8 GEMMs). Those branches read the device's record (`cosmos3_runtime.devices`); here a CPU
answers like each kind of GPU (`devices._FACTS`), and the three compiled regions are traced whole (fullgraph=True,
torch.compile's eager backend: the same trace, no code generation): the media block, the Reasoner's fixed-shape
decode step, and the transformer's forward (what the core MODEL runs under ComfyUI's TorchCompileModel). Before the
record, the attention asked `torch.backends.cuda.flash_sdp_enabled()` on every CUDA call: a graph break at every
layer, and an error under fullgraph.
"""

import ast
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime import devices
from cosmos3_runtime.devices import DeviceFacts
from cosmos3_runtime.reasoner.chat import question_messages
from cosmos3_runtime.reasoner.language import KVCache
from cosmos3_runtime.tiny import transformer_config
from cosmos3_runtime.transformer import Cosmos3Transformer, DecoderLayer, MediaKV, TransformerConfig

CPU_FP8 = devices.facts(torch.device("cpu")).fp8_rowwise  # this torch's CPU has torch._scaled_mm
LIKE = {
    "H100": DeviceFacts("cuda", (9, 0), fp8_tensorwise=CPU_FP8, fp8_rowwise=CPU_FP8, triton=True),
    "RTX 5090": DeviceFacts("cuda", (12, 0), fp8_tensorwise=CPU_FP8, triton=True),  # no row-wise fp8
    "T4": DeviceFacts("cuda", (7, 5)),  # K/V expanded, attention in fp16
    "ROCm": DeviceFacts("cuda", (9, 4), rocm=True),
}
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(params=list(LIKE))
def like(request, monkeypatch):
    """The CPU answers like this GPU."""
    monkeypatch.setitem(devices._FACTS, ("cpu", None), LIKE[request.param])
    return LIKE[request.param]


@pytest.fixture(scope="module")
def edge(tiny_factory):
    return cosmos3_runtime.load(tiny_factory(kind="edge"), device="cpu", dtype="bf16")


def traced_whole(fn):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend="eager")


@pytest.mark.parametrize("cached", [False, True], ids=["plain", "media K/V cache"])
def test_the_media_block_compiles_whole(edge, like, cached):
    """With a media K/V cache too: the block writes this forward's keys and values into it and reads them back after
    the held ones."""
    model = edge.transformer
    cache = MediaKV(model.config, 24, model.dtype, torch.device("cpu")) if cached else None
    hooks = replace(model.hooks, block=traced_whole(DecoderLayer.media), cache=cache)
    latents = torch.randn(1, 48, 2, 4, 6)  # 12 tokens
    with torch.inference_mode():
        text = model.encode_text(torch.arange(20) % 500)
        out = model(latents, torch.tensor(700), text, hooks=hooks)
        if cached:  # again, after the first forward's keys and values
            cache.append()
            out = model(latents, torch.tensor(700), text, hooks=hooks)
    assert torch.isfinite(out.vision).all()


def test_a_compiled_block_writes_each_layers_keys_and_values_into_its_own_history():
    """Through AOTAutograd (inductor's front end; aot_eager here, no code generation), the block every layer shares
    wrote every layer's keys and values into the first layer's history, the others' left zero: it was handed the
    layer's history and its slab, two views of one buffer, and reused the graph of the first layer's offsets
    (pytorch#139789). It writes through the slab alone now: the history and the output equal the eager block's."""
    config = TransformerConfig.from_dict(transformer_config("gated"))
    model = Cosmos3Transformer(config)
    for p in model.parameters():
        p.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    latents = torch.randn(1, 48, 2, 4, 6, generator=torch.Generator().manual_seed(1))

    def two_forwards(block):
        cache = MediaKV(config, 24, torch.float32, torch.device("cpu"))
        hooks = replace(model.hooks, block=block, cache=cache)
        with torch.inference_mode():
            text = model.encode_text(torch.arange(20) % 500)
            model(latents, torch.tensor(700.0), text, hooks=hooks)
            cache.append()
            out = model(latents, torch.tensor(600.0), text, hooks=replace(hooks, start_frame=2))
        return out.vision, cache.keys, cache.values

    eager = two_forwards(DecoderLayer.media)
    torch._dynamo.reset()
    compiled = two_forwards(torch.compile(DecoderLayer.media, backend="aot_eager", fullgraph=True))
    torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(compiled, eager))


def test_the_transformer_forward_compiles_whole(edge, like):
    """The core MODEL's network calls this forward per batch item; TorchCompileModel compiles it all."""
    forward = traced_whole(edge.transformer.forward)
    with torch.inference_mode():
        text = edge.transformer.encode_text(torch.arange(20) % 500)
        out = forward(torch.randn(1, 48, 2, 4, 6), torch.tensor(700), text, [1], 24.0)
    assert torch.isfinite(out.vision).all()


def test_the_reasoner_step_compiles_whole(edge, like):
    reasoner = edge.reasoner
    language = reasoner.language
    prompt, _ = reasoner.prepare(question_messages("Tell me a story.", None, 0, False))
    step = traced_whole(language.decode_step)
    with torch.inference_mode():
        cache = KVCache(language.config, len(prompt.ids) + 4, edge.dtype, reasoner.device)
        language.forward(language.embed(torch.tensor(prompt.ids), reasoner.device), prompt.positions, cache)
        x = language.embed(torch.tensor([7]), reasoner.device)
        position = torch.full((3, 1), cache.length + prompt.delta, dtype=torch.long)
        logits = step(x, position, torch.tensor([cache.length]), cache.keys, cache.values)
    assert torch.isfinite(logits).all()


@pytest.mark.skipif(not CPU_FP8, reason="this torch has no CPU kernel for scaled fp8 matmuls")
def test_the_scaled_fp8_block_compiles_whole(tiny_factory, monkeypatch):
    monkeypatch.setitem(devices._FACTS, ("cpu", None), LIKE["H100"])
    pipe = cosmos3_runtime.load(tiny_factory(kind="edge", overrides={"num_hidden_layers": 3}), device="cpu",
                                dtype="bf16", quantize="fp8_scaled")
    hooks = replace(pipe.transformer.hooks, block=traced_whole(DecoderLayer.media))
    with torch.inference_mode():
        text = pipe.transformer.encode_text(torch.arange(20) % 500)
        out = pipe.transformer(torch.randn(1, 48, 2, 4, 6), torch.tensor(700), text, hooks=hooks)
    assert torch.isfinite(out.vision).all()


# Modules whose code runs inside compiled regions. Device questions there go through `devices.facts`.
COMPILED = ["transformer.py", "rope.py", "weights/format.py", "weights/fp8.py", "weights/precision.py",
            "weights/local_fp8.py", "weights/modelopt_fp8.py", "weights/nvfp4.py", "weights/gguf.py",
            "weights/gguf_dequant.py", "reasoner/language.py"]


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_modules_ask_no_untraceable_device_questions(name):
    """No `torch.backends.*` wrappers and no `torch.cuda.*` queries where code compiles: on a CPU their branches never
    run, so only reading finds them."""
    tree = ast.parse((ROOT / "cosmos3_runtime" / name).read_text(encoding="utf-8"))
    found = [f"line {node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree) if isinstance(node, ast.Attribute)
             and ast.unparse(node).startswith(("torch.backends.", "torch.cuda."))]
    assert not found, found
