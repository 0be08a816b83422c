"""The Reasoner against transformers 5.24.0 on the same tiny checkpoints, both families, and its refusals.

The reference (tests/transformers_reference.py) runs once per family in a subprocess: it loads the
folder with `AutoModelForImageTextToText.from_pretrained(root)` and `AutoProcessor.from_pretrained(root)`
and records the processor's ids and pixel values, greedy `generate` ids and per-step logits.
"""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from conftest import IN_CI, ROOT, require
from safetensors.torch import load_file

import cosmos3_runtime
from cosmos3_runtime import InputError
from cosmos3_runtime.reasoner import Clip, split_thinking
from cosmos3_runtime.reasoner.chat import THINKING_INSTRUCTION, question_messages
from cosmos3_runtime.reasoner.processing import resize_normalize
from transformers_reference import torchvision_dir

FAMILIES = {"omni": "gated", "edge": "edge"}
LOGIT_TOLERANCE = 1e-4
rng = np.random.RandomState(0)
IMAGE = (rng.rand(50, 80, 3) * 255).astype(np.uint8)  # resized: 80x50 is no multiple of 32
TALL = (rng.rand(150, 70, 3) * 255).astype(np.uint8)
VIDEO = (rng.rand(13, 40, 64, 3) * 255).astype(np.uint8)  # 13 frames at 6 fps, sampled at 4: 8 frames
CASES = {
    "image": dict(question="What is this?", images=[IMAGE]),
    "two_images": dict(question="Compare them.", images=[IMAGE, TALL], system="You are a helpful assistant."),
    "video": dict(question="What happens?", video=VIDEO, video_fps=6.0, sample_fps=4.0),
    "video_at_the_processors_rate": dict(question="What happens?", video=VIDEO, video_fps=6.0),
    "image_and_video": dict(question="Is the picture in the clip?", images=[TALL], video=VIDEO, video_fps=6.0,
                            sample_fps=2.0),
    "text": dict(question="Hi there, who are you?"),
    "thinking": dict(question="Why does the cube fall?", images=[IMAGE], thinking=True),
}
MAX_NEW = 16


@pytest.fixture(scope="session")
def reference(tiny_factory, tmp_path_factory):
    """{family: (root, {case: tensors})}: transformers' outputs for every case, one subprocess per family."""
    require("transformers", minversion="5.24.0")
    if not (torchvision_dir() / "torchvision").is_dir():
        message = (f"the reference's torchvision is not installed in {torchvision_dir()}: pip install --no-deps "
                   f"--target {torchvision_dir()} torchvision==0.28.0")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    work = tmp_path_factory.mktemp("transformers-reference")
    media = {}
    for name, array in (("image", IMAGE), ("tall", TALL), ("video", VIDEO)):
        media[id(array)] = str(work / f"{name}.npy")
        np.save(media[id(array)], array)
    results = {}
    for family, kind in FAMILIES.items():
        root = tiny_factory(kind=kind, dtype="float32")
        out = work / family
        out.mkdir()
        cases = []
        for name, case in CASES.items():
            cases.append({"name": name, "question": case["question"], "system": case.get("system"),
                          "images": [media[id(a)] for a in case.get("images", [])],
                          "video": media[id(case["video"])] if "video" in case else None,
                          "video_fps": case.get("video_fps"), "sample_fps": case.get("sample_fps"),
                          "thinking": case.get("thinking", False), "thinking_instruction": THINKING_INSTRUCTION,
                          "max_new_tokens": MAX_NEW})
        job = work / f"{family}.json"
        job.write_text(json.dumps({"root": str(root), "out": str(out), "cases": cases}))
        done = subprocess.run([sys.executable, str(ROOT / "tests" / "transformers_reference.py"), str(job)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        results[family] = (root, {name: load_file(str(out / f"{name}.safetensors")) for name in CASES})
    return results


def ask(pipe, case: dict, **options):
    return pipe.reason(case["question"], images=case.get("images"), video=case.get("video"),
                       video_fps=case.get("video_fps"), sample_fps=case.get("sample_fps"),
                       system_prompt=case.get("system"), thinking=case.get("thinking", False),
                       max_new_tokens=MAX_NEW, temperature=0.0, **options)


@pytest.mark.parametrize("family", FAMILIES)  # (the default run's Reasoner parity: the reference's subprocess once)
def test_greedy_answers_equal_transformers(reference, family):
    root, expected = reference[family]
    pipe = cosmos3_runtime.load(root, device="cpu", dtype=torch.float32)
    for name, case in CASES.items():
        ref = expected[name]
        answer = ask(pipe, case, keep_logits=True)
        assert answer.prompt_ids == ref["input_ids"].tolist(), name
        assert answer.token_ids == ref["generated"].tolist(), name
        logits = torch.stack(answer.logits)
        assert logits.shape == ref["logits"].shape, name
        assert (logits - ref["logits"]).abs().max() < LOGIT_TOLERANCE, name


@pytest.mark.slow  # the reference runs in a subprocess (transformers)
@pytest.mark.parametrize("family", FAMILIES)
def test_pixel_values_equal_transformers_processors(reference, family):
    root, expected = reference[family]
    pipe = cosmos3_runtime.load(root, device="cpu", dtype=torch.float32, parts="reasoner")
    for name in ("two_images", "video", "image_and_video"):
        case, ref = CASES[name], expected[name]
        images = case.get("images", [])
        videos = [Clip(case["video"], case["video_fps"], case["sample_fps"])] if "video" in case else []
        messages = question_messages(case["question"], case.get("system"), len(images), bool(videos))
        prompt, media = pipe.reasoner.prepare(messages, images, videos)
        assert prompt.types.tolist() == ref["mm_token_type_ids"][0].tolist(), name
        pictures = [m for m in media if m.kind == "image"]
        clips = [m for m in media if m.kind == "video"]
        if pictures:
            assert torch.equal(torch.cat([m.pixels for m in pictures]), ref["pixel_values"]), name
            assert [list(m.grid) for m in pictures] == ref["image_grid_thw"].tolist()
            as_pil = pipe.reasoner.prepare(messages, [Image.fromarray(i) for i in images], videos)[1]
            assert torch.equal(torch.cat([m.pixels for m in as_pil if m.kind == "image"]), ref["pixel_values"])
        if clips:
            assert torch.equal(clips[0].pixels, ref["pixel_values_videos"]), name
            assert [list(clips[0].grid)] == ref["video_grid_thw"].tolist()


def test_uint8_resize_is_what_the_processors_do():
    """The processors resize the uint8 picture; a float copy resized the same way lands up to a few grey levels off,
    which the pixel-value equality above would catch."""
    from cosmos3_runtime.reasoner.config import ProcessorConfig

    frames = torch.from_numpy(IMAGE).permute(2, 0, 1).unsqueeze(0)
    p = ProcessorConfig(min_pixels=0, max_pixels=1 << 30, mean=(0.0,) * 3, std=(1 / 255,) * 3)
    ours = resize_normalize(frames, 64, 96, p)  # normalised back to the 0..255 grey levels
    float_copy = torch.nn.functional.interpolate(frames.float(), size=(64, 96), mode="bicubic", antialias=True)
    assert torch.equal(ours, ours.round())  # resized as uint8
    assert (float_copy - ours).abs().max() > 0.5


@pytest.mark.slow  # the reference runs in a subprocess (transformers)
@pytest.mark.parametrize("family", FAMILIES)
def test_reasoner_only_load_gives_the_same_answers(reference, family):
    root, expected = reference[family]
    pipe = cosmos3_runtime.load(root, device="cpu", dtype=torch.float32, parts="reasoner")
    assert pipe.vae is None and not pipe.transformer.has_media
    assert not any("moe_gen" in n or "add_" in n for n, _ in pipe.transformer.named_parameters())
    for name in ("image", "video", "text"):
        assert ask(pipe, CASES[name]).token_ids == expected[name]["generated"].tolist(), name
    with pytest.raises(InputError, match="parts='reasoner'"):
        pipe.generate("a cube", num_frames=1, width=64, height=64, steps=1)


@pytest.mark.parametrize("kind", FAMILIES.values())
def test_reasoning_shares_the_text_tower_and_leaves_generation_unchanged(tiny_factory, kind):
    pipe = cosmos3_runtime.load(tiny_factory(kind=kind, dtype="float32"), device="cpu", dtype=torch.float32)
    options = dict(num_frames=1, width=64, height=64, steps=2, seed=3)
    before = pipe.generate("a red cube", **options).latents
    text_tower = {p.data_ptr() for n, p in pipe.transformer.named_parameters() if "moe_gen" not in n}
    ask(pipe, CASES["image"])
    reasoner = pipe.reasoner
    shared = [p for m in (reasoner.language.tower,) for p in m.parameters()]
    assert reasoner.language.tower is pipe.transformer
    own = {p.data_ptr() for part in (reasoner.head, reasoner.vision) for p in part.parameters()}
    assert not own & text_tower  # the Reasoner added only its head and vision tower
    assert {p.data_ptr() for p in shared} >= text_tower
    assert torch.equal(pipe.generate("a red cube", **options).latents, before)


def test_text_only_checkpoint_answers_and_names_why_it_refuses_an_image(tiny_factory):
    pipe = cosmos3_runtime.load(tiny_factory(kind="gated", reasoner=False), device="cpu")
    assert pipe.reason("Hello?", max_new_tokens=3).token_ids
    with pytest.raises(InputError, match="cannot look at images.*root config.json"):
        pipe.reason("What is this?", images=[IMAGE], max_new_tokens=3)


@pytest.fixture(scope="module")
def nano(tiny_factory):
    return cosmos3_runtime.load(tiny_factory(kind="gated"), device="cpu")


@pytest.mark.parametrize("call, message", [
    (lambda p: p.reason("", max_new_tokens=2), "no question"),
    (lambda p: p.reason(None), "no question"),
    (lambda p: p.reason("q", images=["not a picture"]), "image must be"),
    (lambda p: p.reason("q", images=[np.zeros((0, 4, 3), np.uint8)]), "empty"),
    (lambda p: p.reason("q", images=[np.zeros((4, 4000, 3), np.uint8)]), "too narrow"),
    (lambda p: p.reason("q", video=VIDEO, video_fps=30, sample_fps=30, max_prompt_tokens=40), "over max_prompt_tokens"),
    (lambda p: p.reason("q", max_new_tokens=0), "max_new_tokens"),
    (lambda p: p.reason("q", max_new_tokens=10**6), "max_new_tokens"),
    (lambda p: p.reason("q", temperature=-1), "temperature"),
    (lambda p: p.reason("q", top_p=0), "top_p"),
    (lambda p: p.reason("q <|image_pad|>"), "special token"),
    (lambda p: p.chat([{"role": "system", "content": "hi"}]), "no user turn"),
    (lambda p: p.chat([{"role": "user", "content": [{"type": "image"}]}]), "1 image and 0 video parts but 0"),
])
def test_bad_input_is_refused_by_name(nano, call, message):
    with pytest.raises(InputError, match=message):
        call(nano)
    assert nano.reason("Still there?", max_new_tokens=2).token_ids  # nothing broken for the next question


def test_sampling_is_seeded_and_top_k_one_is_greedy(nano):
    first = nano.reason("Tell me a story.", max_new_tokens=10, seed=5).token_ids
    assert nano.reason("Tell me a story.", max_new_tokens=10, seed=5).token_ids == first
    assert nano.reason("Tell me a story.", max_new_tokens=10, seed=6).token_ids != first
    greedy = nano.reason("Tell me a story.", max_new_tokens=10, temperature=0.0).token_ids
    assert nano.reason("Tell me a story.", max_new_tokens=10, top_k=1, presence_penalty=0.0).token_ids == greedy


def test_callback_streams_and_cancels(nano):
    seen = []
    answer = nano.reason("Count.", max_new_tokens=6, temperature=0.0,
                         callback=lambda n, total, text: seen.append((n, total, text)))
    assert [s[0] for s in seen] == list(range(1, len(answer.token_ids) + 1)) and seen[-1][1] == 6
    assert seen[-1][2] == answer.text

    class Stop(Exception):
        pass

    def cancel(n, total, text):
        if n == 2:
            raise Stop

    with pytest.raises(Stop):
        nano.reason("Count.", max_new_tokens=6, callback=cancel)
    assert nano.reason("Count.", max_new_tokens=6, temperature=0.0).token_ids == answer.token_ids


def test_thinking_is_split_from_the_answer():
    assert split_thinking("<think>\nbecause gravity\n</think>\n\nIt falls.") == ("because gravity", "It falls.")
    # Edge: opened by the template
    assert split_thinking("because gravity\n</think>It falls.") == ("because gravity", "It falls.")
    assert split_thinking("still thinking") == ("still thinking", "")


def test_low_vram_seams_apply_to_the_reasoner(tiny_factory):
    root = tiny_factory(kind="gated", dtype="float32")
    plain = ask(cosmos3_runtime.load(root, device="cpu", dtype=torch.float32), CASES["image"]).token_ids
    offloaded = cosmos3_runtime.load(root, device="cpu", dtype=torch.float32, offload_text=True)
    assert ask(offloaded, CASES["image"]).token_ids == plain
    fp8 = cosmos3_runtime.load(root, device="cpu", dtype=torch.float32, quantize="fp8")
    assert len(ask(fp8, CASES["image"]).token_ids) == MAX_NEW
    from cosmos3_runtime.weights.local_fp8 import Fp8Linear

    assert isinstance(fp8.reasoner.head.lm_head, Fp8Linear)


def test_gguf_pipeline_reads_the_head_from_the_shards(tiny_factory, tmp_path):
    from cosmos3_runtime.weights.gguf_convert import convert

    root = tiny_factory(kind="gated", dtype="float32")
    path = tmp_path / "nano.gguf"
    convert(root, path, "q8_0")
    pipe = cosmos3_runtime.load(root, device="cpu", dtype=torch.float32, transformer_file=path)
    assert len(ask(pipe, CASES["text"]).token_ids) == MAX_NEW


@pytest.mark.slow  # fresh CLI processes
def test_cli_answers_on_stdout_and_refuses_in_one_line(tmp_path, tiny_factory):
    import av

    clip = tmp_path / "clip.mp4"
    with av.open(str(clip), "w") as container:
        stream = container.add_stream("libx264", rate=12)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        for i in range(30):
            frame = av.VideoFrame.from_ndarray(np.full((64, 96, 3), 8 * i, np.uint8), format="rgb24")
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    command = [sys.executable, "-m", "cosmos3_runtime", "reason", "--checkpoint", str(tiny_factory(kind="gated")),
               "--prompt", "What happens?", "--video", str(clip), "--max-new-tokens", "5", "--temperature", "0"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "5 new (length)" in done.stderr and done.stdout.strip()
    for bad, message in ((["--top-p", "2"], "--top-p"), (["--video", str(tmp_path / "no.mp4")], "does not exist")):
        done = subprocess.run(command[:6] + ["--prompt", "q"] + bad, capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_edge_reasoner_norms_use_the_reference_form_in_bf16():
    """The Edge generator's Nemotron RMSNorm and the Reasoner's Llama form differ by an ulp in bf16; the Reasoner must
    round as transformers' Cosmos3EdgeTextRMSNorm does, on the same gains."""
    require("transformers", minversion="5.24.0")
    from transformers.models.cosmos3_edge.modeling_cosmos3_edge import Cosmos3EdgeTextRMSNorm

    from cosmos3_runtime.reasoner.language import rms_norm
    from cosmos3_runtime.transformer import NemotronRMSNorm

    generator = torch.Generator().manual_seed(0)
    shared = NemotronRMSNorm(256, 1e-5).to(torch.bfloat16)
    shared.weight.data = (1 + 0.3 * torch.randn(256, generator=generator)).bfloat16()
    reference = Cosmos3EdgeTextRMSNorm(256, 1e-5).to(torch.bfloat16)
    reference.weight.data = shared.weight.data.clone()
    x = (3 * torch.randn(64, 256, generator=generator)).bfloat16()
    assert torch.equal(rms_norm(shared, x), reference(x))
    assert not torch.equal(shared(x), reference(x))  # the generator's own form would not match


def test_stop_strings_cut_the_answer_and_are_never_streamed(nano):
    full = nano.reason("Tell me a story.", max_new_tokens=12, temperature=0.0)
    assert len(full.text) > 6
    stop = full.text[4:6]  # a string the greedy answer writes
    seen = []
    cut = nano.reason("Tell me a story.", max_new_tokens=12, temperature=0.0, stop=[stop, "never written"],
                      callback=lambda n, total, text: seen.append(text))
    assert cut.text == full.text[: full.text.index(stop)] and cut.finish_reason == "stop"
    assert all(stop not in text and cut.text.startswith(text) for text in seen)
    with pytest.raises(InputError, match="stop"):
        nano.reason("q", stop=[""])


def test_upsampling_fills_the_templates_and_reads_the_reply(nano, monkeypatch):
    from cosmos3_runtime.reasoner import upsample

    monkeypatch.delenv("COSMOS3_UPSAMPLER_TEMPLATES", raising=False)
    text = upsample.user_text("t2v", "A cat plays with yarn.", 1280, 720, 121, 24.0)
    assert "A cat plays with yarn." in text and '"0:05"' in text and "fps 24" in text and '"16,9"' in text
    assert '{"W": 1280, "H": 720}' in text and "{description}" not in text and "{duration}" not in text
    assert "{fps}" not in upsample.user_text("t2i", "a corgi", 960, 960, 1, 24.0) and "1,1" in upsample.user_text(
        "t2i", "a corgi", 960, 960, 1, 24.0)
    asked = {}

    def chat(messages, images, **options):
        asked.update(messages=messages, images=images, options=options)
        return type("Answer", (), {"text": '<think>plan</think>```json\n{"scene_imagination": "x", "duration": "0:09"}\n```'})

    monkeypatch.setattr(nano.reasoner, "chat", chat)  # the Reasoner upsamples through its own chat
    clip = np.zeros((5, 32, 48, 3), np.uint8)
    clip[-1] = 200
    result = nano.upsample_prompt("A cat plays with yarn.", video=clip, num_frames=49, fps=16)
    assert result.parsed and json.loads(result.caption) == {"scene_imagination": "x", "duration": "3s"}
    assert result.templates == "the pack's own templates"
    assert asked["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}
    assert asked["messages"][1]["content"][0] == {"type": "image"} and (asked["images"][0] == 200).all()  # the last frame
    assert "image-to-video" in asked["messages"][1]["content"][1]["text"] and asked["options"]["temperature"] == 0.0
    with pytest.raises(InputError, match="not both"):
        nano.upsample_prompt("x", image=clip[0], video=clip)


def authors_prompts():
    """NVIDIA's upsampler prompts module from COSMOS_FRAMEWORK_DIR (a checkout of their framework), or a skip."""
    import importlib.util
    import os
    from pathlib import Path

    folder = os.environ.get("COSMOS_FRAMEWORK_DIR")
    if not folder:
        pytest.skip("set COSMOS_FRAMEWORK_DIR to compare with the authors' upsampler prompts")
    path = Path(folder) / "cosmos_framework" / "model" / "generator" / "upsampler" / "prompts.py"
    spec = importlib.util.spec_from_file_location("authors_prompts", path)
    authors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(authors)
    return Path(folder), authors


def test_the_authors_templates_are_used_verbatim_where_the_user_has_them(monkeypatch):
    """With COSMOS3_UPSAMPLER_TEMPLATES naming their checkout, the text for every task is what their own
    build_user_text writes (skipped without COSMOS_FRAMEWORK_DIR)."""
    from cosmos3_runtime.reasoner import upsample

    folder, authors = authors_prompts()
    monkeypatch.setenv("COSMOS3_UPSAMPLER_TEMPLATES", str(folder))
    for task, frames in (("t2v", 121), ("t2i", 1), ("i2v", 49)):
        video = dict(fps=24, duration_secs=int(frames / 24)) if task != "t2i" else {}
        expected = authors.build_user_text(task, "A cat.", aspect_ratio="16,9", resolution_w=1280, resolution_h=720,
                                           **video)
        assert upsample.user_text(task, "A cat.", 1280, 720, frames, 24.0) == expected, task
    assert upsample.templates().system == authors.SYSTEM_MESSAGE
    assert upsample.templates().source.startswith("the model authors' templates from ")


def test_no_passage_of_the_authors_templates_is_in_the_repository():
    """The pack ships its own templates: no run of 12 words of the authors' appears in any tracked file (skipped
    without COSMOS_FRAMEWORK_DIR), while the pack's ask for the same JSON keys in the same order."""
    import re
    import subprocess

    from conftest import ROOT

    from cosmos3_runtime.reasoner.templates import PACK, string_constants

    folder, _ = authors_prompts()
    _, theirs = string_constants(folder / "cosmos_framework" / "model" / "generator" / "upsampler" / "prompts.py")
    words = lambda text: re.findall(r"[a-z0-9']+", text.lower())  # noqa: E731
    runs = {" ".join(w[i : i + 12]) for text in theirs.values() for w in [words(text)] for i in range(len(w) - 11)}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for name in tracked:
        path = ROOT / name
        if path.suffix in (".py", ".md", ".json", ".txt", ".toml", ".jinja") and path.is_file():
            w = words(path.read_text(encoding="utf-8", errors="replace"))
            assert not runs & {" ".join(w[i : i + 12]) for i in range(len(w) - 11)}, name
    keys = lambda text: re.findall(r'^\s*"(\w+)":', text, re.M)  # noqa: E731  the JSON template's keys, in order
    for task, text in theirs.items():
        assert keys(PACK[task]) == keys(text), task


def test_the_authors_file_is_read_as_text_never_run(tmp_path, monkeypatch):
    """Their prompts.py is parsed for its string constants (a module that would exit if run is read fine); a JSON
    file works too; a name that holds no templates is refused by the variable's name."""
    from cosmos3_runtime.reasoner import upsample
    from cosmos3_runtime.reasoner.templates import TASKS

    module = tmp_path / "prompts.py"
    module.write_text("raise SystemExit('never run')\nSYSTEM_MESSAGE = 'sys'\n" + "".join(
        f"_T_{t.upper()} = r'''{t}: {{description}} at {{resolution_w}}'''\n" for t in TASKS) +
        "CANONICAL_TEMPLATES: dict = {" + ", ".join(f"('v4.2', '{t}'): _T_{t.upper()}" for t in TASKS) + "}\n")
    monkeypatch.setenv("COSMOS3_UPSAMPLER_TEMPLATES", str(module))
    assert upsample.user_text("t2i", "a corgi", 960, 640, 1, 24.0) == "t2i: a corgi at 960"
    assert upsample.templates().system == "sys"
    json_file = tmp_path / "mine.json"
    json_file.write_text('{"system": "s", "t2v": "v {description}", "t2i": "i", "i2v": "x"}')
    monkeypatch.setenv("COSMOS3_UPSAMPLER_TEMPLATES", str(json_file))
    assert upsample.user_text("t2v", "rain", 640, 480, 49, 24.0) == "v rain"
    monkeypatch.setenv("COSMOS3_UPSAMPLER_TEMPLATES", str(tmp_path / "missing"))
    with pytest.raises(InputError, match="COSMOS3_UPSAMPLER_TEMPLATES=.*names no upsampler templates"):
        upsample.templates()
    (tmp_path / "empty.json").write_text('{"t2v": "v"}')
    monkeypatch.setenv("COSMOS3_UPSAMPLER_TEMPLATES", str(tmp_path / "empty.json"))
    with pytest.raises(InputError, match="no v4.2 upsampler template for t2i, i2v"):
        upsample.templates()


@pytest.mark.parametrize("settings", [(0.7, 0.8, 20, 1.5), (0.6, 0.95, 20, 0.0), (1.3, 1.0, 0, 0.5), (0.9, 0.5, 7, -1.0)])
def test_sampling_candidates_are_transformers_distribution(settings):
    """Only the top-k candidates leave the device: their probabilities equal transformers' temperature, top-k and
    top-p warpers over the whole vocabulary (after the presence penalty, which transformers does not have)."""
    require("transformers", minversion="5.24.0")
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from cosmos3_runtime.reasoner.decoding import Sampling, candidates

    temperature, top_p, top_k, penalty = settings
    generator = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(1000, generator=generator)
    seen = torch.rand(1000, generator=generator) < 0.1
    ids, probs = candidates(logits, Sampling(temperature, top_p, top_k, penalty), seen)
    scores = (logits - penalty * seen.float())[None]
    for warper in (TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k) if top_k else None, TopPLogitsWarper(top_p)):
        scores = scores if warper is None else warper(None, scores)
    expected = scores[0].softmax(-1)
    ours = torch.zeros(1000).index_put_((ids,), probs)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-5)
    assert len(ids) == (top_k or 1000)


def test_the_answer_text_grows_by_whole_characters_and_ends_as_one_decode(nano):
    """The incremental detokenizer: each step's text extends the last, holds no partial character, and the final
    text equals decoding every id at once (multi-byte characters split over byte tokens, spaces, newlines)."""
    from cosmos3_runtime.reasoner.decoding import Detokenizer

    reasoner = nano.reasoner
    text = "Hello wörld — ロボットが箱を持ち上げる 🤖!\n  indented\tτέλος"
    ids = reasoner.tokenizer.tokenizer.encode(text).ids
    assert len(ids) > len(text) // 3  # split into many pieces, some inside characters
    for sequence in (ids, list(np.random.RandomState(0).randint(0, 2000, 60))):
        detokenizer, previous = Detokenizer(reasoner.decode), ""
        for token in sequence:
            now = detokenizer.add(int(token))
            assert now.startswith(previous) and not now.endswith("\ufffd")  # random ids may hold lone bytes inside
            assert "\ufffd" not in now or sequence is not ids
            previous = now
        assert detokenizer.final() == reasoner.decode([int(t) for t in sequence])
    assert Detokenizer(reasoner.decode).final() == ""


def test_the_fixed_shape_decode_step_equals_the_growing_cache_and_compiles_whole(nano):
    """decode_step attends over the whole preallocated cache with the unwritten rows masked: the same logits as
    forward over the filled rows, token by token, and torch.compile captures it in one graph (fullgraph)."""
    from cosmos3_runtime.reasoner.language import KVCache

    reasoner = nano.reasoner
    language = reasoner.language
    prompt, _ = reasoner.prepare(question_messages("Tell me a story.", None, 0, False))
    tokens = torch.tensor(prompt.ids)
    compiled = torch.compile(language.decode_step, fullgraph=True, dynamic=False, backend="eager")
    with torch.inference_mode():
        dtype = reasoner.head.norm.weight.dtype
        caches = [KVCache(language.config, len(prompt.ids) + 8, dtype, reasoner.device) for _ in range(2)]
        for cache in caches:
            logits = language.forward(language.embed(tokens, reasoner.device), prompt.positions, cache)
        for _ in range(5):
            token = int(logits.argmax())
            x = language.embed(torch.tensor([token]), reasoner.device)
            position = torch.full((3, 1), caches[0].length + prompt.delta, dtype=torch.long)
            logits = language.forward(x, position, caches[0])
            row = torch.tensor([caches[1].length])
            static = compiled(x, position, row, caches[1].keys, caches[1].values)
            caches[1].length += 1
            torch.testing.assert_close(static, logits, atol=1e-5, rtol=1e-5)


def test_compile_option_gives_the_same_answer(nano, monkeypatch):
    """reason(compile=True): the compiled fixed-shape step (torch.compile's eager backend here: inductor's first
    compile takes minutes on two cores; benchmarks/bench_reason.py times the real one) answers as eager does."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "mode": None, "backend": "eager"}))
    monkeypatch.setattr(nano.reasoner, "compiled_step", None)
    eager = nano.reason("Tell me a story.", max_new_tokens=12, temperature=0.0)
    compiled = nano.reason("Tell me a story.", max_new_tokens=12, temperature=0.0, compile=True)
    assert compiled.token_ids == eager.token_ids and compiled.text == eager.text
    sampled = nano.reason("Tell me a story.", max_new_tokens=12, seed=3, compile=True).token_ids
    assert sampled == nano.reason("Tell me a story.", max_new_tokens=12, seed=3).token_ids


def test_a_gguf_text_tower_is_expanded_once_per_answer(tiny_factory, tmp_path, monkeypatch):
    """Each token would dequantize every quantized text-tower weight again; with memory to spare the Reasoner
    expands them once per answer, and otherwise per token: the same answer either way."""
    from cosmos3_runtime import budget
    from cosmos3_runtime.weights.gguf_convert import convert
    from cosmos3_runtime.weights.gguf import GGUFLinear

    root = tiny_factory(kind="gated", dtype="float32")
    convert(root, tmp_path / "nano.gguf", "q8_0")
    pipe = cosmos3_runtime.load(root, device="cpu", dtype=torch.float32, transformer_file=tmp_path / "nano.gguf")
    calls = []
    real = GGUFLinear.dequantized
    monkeypatch.setattr(GGUFLinear, "dequantized", lambda self, *a: calls.append(self) or real(self, *a))
    once = ask(pipe, CASES["text"]).token_ids
    layers = len(set(calls))
    assert len(calls) == layers > 0  # each layer once, for every token
    calls.clear()
    monkeypatch.setattr(budget, "available_bytes", lambda device: 1)
    assert ask(pipe, CASES["text"], check_memory=False).token_ids == once
    assert len(calls) == layers * len(once)  # no room: every forward dequantizes again (the prefill and each step)
