"""Reasoner speed and memory: ours next to transformers 5.24.0's `generate`, on the same inputs, in one run.

The same random checkpoint (the "small" text tower, 512 wide and 6 layers, with the tiny vision tower; the
image processor at the released pixel bounds, so a 448x448 image is 196 tokens), one image and a question, greedy
decoding of --tokens new tokens (both sides produce the same ids: the parity
tests check that). transformers is given exactly the prompt ids and pixel values our processors make (the
tests check those equal its processors'), so it needs no torchvision here. Each side runs in a fresh
process: prefill is timed as one forward over the prompt, decode as tokens per second after it; peak
memory is resident memory counted from just before the answer (Linux /proc). "ours, compiled" decodes with
reason(compile=True) (the fixed-shape step through inductor), timed after a first answer that compiles it (its
time is shown). Not a test.

    python benchmarks/bench_reason.py [--family omni|edge] [--size 448] [--tokens 64 512 2048] [--threads 2]
    python benchmarks/bench_reason.py --released-sizes   # bytes of load(parts="reasoner") vs the full load

--released-sizes builds the models on the meta device at the released Nano and Edge shapes (what the loaders
allocate, tensor for tensor; the ViT at the reference's defaults) and counts their bf16 bytes.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

from measure import ROOT, run_child

CHILD = r"""
import json, time, numpy as np, torch
torch.set_num_threads({threads})
import cosmos3_runtime
from cosmos3_runtime.reasoner.chat import question_messages

args = json.loads({args!r})
image = np.random.default_rng(0).integers(0, 256, (args["size"], args["size"], 3), dtype=np.uint8)
question = "Describe the scene and say what the robot should do next."
compile_s = None
if {which!r}.startswith("ours"):
    compiled = {which!r} == "ours, compiled"
    pipe = cosmos3_runtime.load({ckpt!r}, device="cpu", dtype=torch.float32, parts="reasoner")
    pipe.reason("Hi", max_new_tokens=2, temperature=0.0)  # warm-up (text only: the image's memory is counted)
    if compiled:  # the first compiled answer pays the compile (the same cache-length bucket as the timed one)
        start = time.perf_counter()
        pipe.reason(question, images=[image], max_new_tokens=args["tokens"], temperature=0.0, compile=True)
        compile_s = time.perf_counter() - start
    peak = PeakMemory()
    answer = pipe.reason(question, images=[image], max_new_tokens=args["tokens"], temperature=0.0, compile=compiled)
    ids, prefill, decode = answer.token_ids, answer.prefill_seconds, answer.decode_seconds
else:
    from transformers import AutoModelForImageTextToText
    ours = cosmos3_runtime.load({ckpt!r}, device="cpu", dtype=torch.float32, parts="reasoner")
    prompt, media = ours.reasoner.prepare(question_messages(question, None, 1, False), [image])
    del ours
    inputs = {{"input_ids": torch.tensor([prompt.ids]), "attention_mask": torch.ones(1, len(prompt.ids), dtype=torch.long),
              "pixel_values": media[0].pixels, "image_grid_thw": torch.tensor([media[0].grid]),
              "mm_token_type_ids": prompt.types[None]}}
    model = AutoModelForImageTextToText.from_pretrained({ckpt!r}, dtype=torch.float32).eval()
    with torch.no_grad():
        model.generate(input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=2, do_sample=False)  # warm-up
        peak = PeakMemory()
        start = time.perf_counter()
        model(**inputs, use_cache=True)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        out = model.generate(**inputs, max_new_tokens=args["tokens"], do_sample=False)
        total = time.perf_counter() - start
    ids = out[0, len(prompt.ids):].tolist()
    decode = total - prefill
print(json.dumps({{"ids": ids, "prefill_s": prefill, "decode_s": decode, "peak_mb": peak.mb(), "compile_s": compile_s}}))
"""


def released_sizes() -> None:
    import torch

    from cosmos3_runtime.reasoner.config import EdgeVisionConfig, QwenVisionConfig
    from cosmos3_runtime.reasoner.language import ReasonerHead
    from cosmos3_runtime.reasoner.vision_edge import EdgeVisionTower
    from cosmos3_runtime.reasoner.vision_qwen import QwenVisionTower
    from cosmos3_runtime.transformer import EDGE_BACKBONE, Cosmos3Transformer, TransformerConfig
    from cosmos3_runtime.vae import VAEConfig, WanVAE

    edge = dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                intermediate_size=9216, vocab_size=131072, hidden_act="relu2", backbone_type=EDGE_BACKBONE,
                qk_norm_for_text=False, use_und_k_norm_for_gen=True, rms_norm_eps=1e-5, rope_theta=1e8)
    families = {"Nano": (TransformerConfig(), QwenVisionTower, QwenVisionConfig()),
                "Edge": (TransformerConfig(**edge), EdgeVisionTower, EdgeVisionConfig())}
    gib = lambda *modules: sum(p.numel() for m in modules for p in m.parameters()) * 2 / 2**30  # bf16
    for name, (config, tower, vision_config) in families.items():
        with torch.device("meta"):
            full, text = Cosmos3Transformer(config), Cosmos3Transformer(config, media=False)
            head, vision = ReasonerHead(config), tower(vision_config)
            vae = WanVAE(VAEConfig())  # the released Wan 2.2 VAE
        reasoner, generator = gib(text, head, vision), gib(full, vae)
        print(f"{name}: parts='reasoner' {reasoner:.2f} GiB (text tower {gib(text):.2f} + head {gib(head):.2f} + "
              f"vision {gib(vision):.2f}); the default load {generator:.2f} GiB (transformer {gib(full):.2f} + VAE "
              f"{gib(vae):.2f}), {generator + gib(head, vision):.2f} GiB once it has answered; "
              f"reasoner / default = {reasoner / generator:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=("omni", "edge"), default="omni")
    parser.add_argument("--size", type=int, default=448, help="image side in pixels [default: 448]")
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 512, 2048], help="new tokens, one run "
                        "each [default: 64 512 2048]")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--released-sizes", action="store_true", help="only count bytes at the released shapes")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.released_sizes:
        return released_sizes()
    from cosmos3_runtime.tiny import make_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_tiny_checkpoint(Path(tmp) / "bench", kind="gated" if args.family == "omni" else "edge",
                                    size="small", dtype="float32")
        config = json.loads((ckpt / "preprocessor_config.json").read_text())  # the released pixel bounds, not the tiny's
        config["size"] = {"shortest_edge": 256 * 256, "longest_edge": 4096 * 4096}
        (ckpt / "preprocessor_config.json").write_text(json.dumps(config))
        print(f"{args.family}, {args.size}x{args.size} image, greedy, {args.threads} threads")
        print("| new tokens | run | prefill | decode | vs transformers | peak | same ids |")
        print("|---|---|---|---|---|---|---|")
        for tokens in args.tokens:
            results = {}
            for which in ("transformers", "ours", "ours, compiled"):
                options = json.dumps({**vars(args), "tokens": tokens})
                code = CHILD.format(threads=args.threads, args=options, which=which, ckpt=str(ckpt))
                results[which] = run_child(code, which)
            ref = results["transformers"]
            ref_rate = (len(ref["ids"]) - 1) / ref["decode_s"]
            for name, r in results.items():
                rate = (len(r["ids"]) - 1) / r["decode_s"]
                compile_note = f" (first answer {r['compile_s']:.0f} s)" if r["compile_s"] else ""
                print(f"| {len(r['ids'])} | {name}{compile_note} | {r['prefill_s'] * 1000:.0f} ms | {rate:.0f} tokens/s "
                      f"| {rate / ref_rate:.2f}x | {r['peak_mb']:.0f} MB | {r['ids'] == ref['ids']} |", flush=True)


if __name__ == "__main__":
    main()
