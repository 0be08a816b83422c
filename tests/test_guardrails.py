"""Guardrails: the prompt checked before anything runs, the frames checked and their faces pixelated, failing closed.

The wiring runs with checks of the tests' own; NVIDIA's package (cosmos-guardrail, optional for users, required here
under CI=true) runs its own classes on stand-ins for its two models and its files (tests/guardrail_stand_ins.py).
"""

import json
import logging
import os
import subprocess
import sys
import threading

import pytest
import torch
from conftest import ROOT

import cosmos3_runtime
from cosmos3_runtime import runs
from cosmos3_runtime.guardrails import Check, GuardrailBlocked, Guardrails
from cosmos3_runtime.pipeline import counting

SIZE = dict(width=64, height=48, num_frames=5, steps=2, cache="off")
BLOCKED = "zorblat"  # the tests' blocked word


def word_check(prompt: str) -> bool:
    return BLOCKED not in prompt.lower()


def grey_box(frames):
    """A face filter stand-in: the box [8:24, 16:40] of every frame turned grey (uint8 [F, H, W, 3] in and out)."""
    frames[:, 8:24, 16:40] = 128
    return frames


@pytest.fixture(scope="module")
def pipe(tiny_edge):
    return cosmos3_runtime.load(tiny_edge, dtype=torch.float32)


def test_a_blocked_prompt_names_the_check_and_never_the_words():
    guard = Guardrails([Check("keyword blocklist", word_check)])
    guard.check_prompts(["a cat on a mat"])
    with pytest.raises(GuardrailBlocked, match="^the prompt was blocked by the guardrail's keyword blocklist") as exc:
        guard.check_prompts(["a cat", f"a {BLOCKED.upper()} in the garden"])  # every prompt (a chunk's too)
    assert BLOCKED not in str(exc.value).lower() and exc.value.by == "keyword blocklist"
    assert isinstance(exc.value, cosmos3_runtime.InputError)  # a user error: the CLI exits 2, a node shows it


def test_a_check_that_fails_blocks_unless_the_guardrail_fails_open(caplog):
    def broken(prompt):
        raise RuntimeError("CUDA error: out of memory")

    with pytest.raises(GuardrailBlocked, match=r"the guardrail's classifier failed \(RuntimeError: CUDA error: out of "
                                               r"memory\), and the guardrail fails closed; .* turn fail_closed off"):
        Guardrails([Check("classifier", broken)]).check_prompts(["a cat"])
    with caplog.at_level(logging.WARNING):
        Guardrails([Check("classifier", broken)], fail_closed=False).check_prompts(["a cat"])
    assert "the guardrail's classifier failed (RuntimeError" in caplog.text and "fail_closed is off" in caplog.text
    broken_filter = Guardrails([], face_filter=lambda frames: 1 / 0)
    with pytest.raises(GuardrailBlocked, match="the video was blocked: the guardrail's face filter failed"):
        broken_filter.filter_frames(torch.rand(3, 16, 16, 3))


def test_safe_prompts_are_remembered_and_blocked_ones_asked_again():
    calls = []
    guard = Guardrails([Check("classifier", lambda prompt: calls.append(prompt) or word_check(prompt))])
    for _ in range(3):
        guard.check_prompts(["a cat"])
        with pytest.raises(GuardrailBlocked):
            guard.check_prompts([BLOCKED])
    assert calls == ["a cat", BLOCKED, BLOCKED, BLOCKED]


def test_generate_checks_every_prompt_before_anything_runs(pipe, monkeypatch):
    guard = Guardrails([Check("keyword blocklist", word_check)])
    monkeypatch.setattr(runs, "execute", lambda *a, **k: pytest.fail("the run started before the prompt was checked"))
    with pytest.raises(GuardrailBlocked, match="keyword blocklist"):
        pipe.generate(BLOCKED, guardrails=guard, **SIZE)
    chunked = json.dumps(["a cat walks", "it sits", f"the cat meets a {BLOCKED}"])  # a long video's prompt per chunk
    with pytest.raises(GuardrailBlocked, match="keyword blocklist"):
        pipe.generate(chunked, guardrails=guard, **{**SIZE, "num_frames": 13}, chunk_frames=5)


def test_generate_returns_the_filtered_frames_and_only_the_filter_changes_them(pipe):
    plain = pipe.generate("a cat", seed=3, **SIZE)
    stages = []
    guarded = pipe.generate("a cat", seed=3, guardrails=Guardrails([Check("keyword blocklist", word_check)],
                                                                   face_filter=grey_box),
                            progress=lambda stage, done, total: stages.append((stage, done, total)), **SIZE)
    box = torch.zeros_like(plain.frames, dtype=torch.bool)
    box[:, 8:24, 16:40] = True
    assert torch.equal(guarded.latents, plain.latents)
    assert torch.equal(guarded.frames[~box], plain.frames[~box])  # not rounded to 8 bits outside the face
    # grey in the box (a pixel the filter did not change, being 128 already once rounded, keeps its exact value)
    torch.testing.assert_close(guarded.frames[box], torch.full_like(guarded.frames[box], 128 / 255), atol=0.5 / 255,
                               rtol=0)
    assert (plain.frames[box] - 128 / 255).abs().max() > 0.1
    assert stages[-1] == ("guardrail", 5, 5)
    latents = pipe.generate("a cat", seed=3, output="latents", guardrails=Guardrails([], face_filter=grey_box), **SIZE)
    assert latents.frames is None and torch.equal(latents.latents, plain.latents)


def test_a_blocked_video_stops_the_run_and_the_cli_writes_nothing(pipe, tiny_edge, tmp_path, monkeypatch, capsys):
    from cosmos3_runtime import __main__ as cli

    video_check = Guardrails([], video_checks=[Check("video classifier", lambda frames: frames.mean() < 0)])
    with pytest.raises(GuardrailBlocked, match="^the video was blocked by the guardrail's video classifier"):
        pipe.generate("a cat", guardrails=video_check, **SIZE)
    monkeypatch.setattr(cli, "load_guardrails", lambda *a, **k: video_check)
    out = tmp_path / "cat.mp4"
    code = cli.main(["generate", "--checkpoint", str(tiny_edge), "--prompt", "a cat", "--frames", "5", "--width", "64",
                     "--height", "48", "--steps", "2", "--guardrails", "--output", str(out)])
    assert code == 2 and "blocked by the guardrail's video classifier" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(cli, "load_guardrails", lambda *a, **k: Guardrails([Check("keyword blocklist", word_check)]))
    monkeypatch.setattr(cli, "load", lambda *a, **k: pytest.fail("the model loaded before the prompt was checked"))
    assert cli.main(["generate", "--checkpoint", str(tiny_edge), "--prompt", BLOCKED, "--guardrails", "--output",
                     str(out)]) == 2


def test_a_guardrail_kept_on_the_device_is_counted_in_the_plan(pipe):
    guard = Guardrails([], modules=[torch.nn.Linear(100, 100)], device="meta", offload=False)  # (meta: no memory)
    assert guard.bytes == 100 * 101 * 4
    assert guard.resident_bytes(torch.device("meta")) == guard.bytes and guard.resident_bytes(torch.device("cpu")) == 0
    assert Guardrails([], modules=[torch.nn.Linear(4, 4)], device="meta").resident_bytes(torch.device("meta")) == 0
    plan = pipe.plan("a cat", **SIZE)
    counted = counting(plan, "guardrails", guard.bytes)
    assert counted.estimate.total == plan.estimate.total + guard.bytes
    assert counting(plan, "guardrails", 0) is plan


def test_the_pack_imports_and_runs_without_the_package():
    """Without cosmos-guardrail the pack imports, generates, and the guardrail says how to install it."""
    script = f"""
import sys, importlib, importlib.util
sys.modules["cosmos_guardrail"] = None  # as if not installed
sys.path.insert(0, {str(ROOT)!r})
import cosmos3_runtime
try:
    cosmos3_runtime.load_guardrails()
except cosmos3_runtime.InputError as exc:
    print("runtime:", exc)
spec = importlib.util.spec_from_file_location("pack", {str(ROOT / "__init__.py")!r}, submodule_search_locations=[{str(ROOT)!r}])
pack = importlib.util.module_from_spec(spec); sys.modules["pack"] = pack; spec.loader.exec_module(pack)
nodes = importlib.import_module("pack.nodes")
try:
    nodes.Cosmos3GuardrailLoader().load("cpu", True, False)
except Exception as exc:
    print("node:", exc)
print("nodes:", len(nodes.NODE_CLASS_MAPPINGS))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COSMOS3_GUARDRAILS": ""})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("runtime: the guardrails need the cosmos-guardrail package, which is not installed")
    assert "pip install" in lines[0]
    assert lines[1].startswith("node: the guardrails need the cosmos-guardrail package")
    assert int(lines[2].split()[1]) > 30


# --- NVIDIA's package, its own classes on stand-ins for its models and files ----------------------------------------


@pytest.fixture
def package(guardrail_package):
    return guardrail_package


def test_the_package_blocks_by_blocklist_and_classifier_naming_neither_word(package):
    checker, classifier, stand_ins = package
    guard = cosmos3_runtime.load_guardrails()
    guard.check_prompts(["a cat sleeps on a warm windowsill"])
    for prompt, by, word in ((f"a {stand_ins.WORDS['custom'][0]} in the garden", "keyword blocklist", "zorblat"),
                             (f"two {stand_ins.WORDS['custom'][0]}s at dusk", "keyword blocklist", "zorblat"),
                             (f"a {stand_ins.WORDS['exact_match'][0]} on the table", "keyword blocklist", "quuxhammer"),
                             (f"a barn, then {stand_ins.UNSAFE}", "classifier (Qwen3Guard)", stand_ins.UNSAFE)):
        with pytest.raises(GuardrailBlocked) as exc:
            guard.check_prompts([prompt])
        assert exc.value.by == by and word not in str(exc.value)
    calls = classifier.generated
    guard.check_prompts(["a cat sleeps on a warm windowsill"])
    assert classifier.generated == calls  # remembered


def test_the_package_classifier_fails_open_alone_and_closed_here(package):
    checker, _, stand_ins = package
    prompt = f"a {stand_ins.GARBLED} answer"  # the classifier's answer has no "Safety:" line
    classifier = checker.Qwen3Guard(model_id="local")
    assert classifier.is_safe(prompt)[0] is True  # the package alone: an exception is "safe"
    with pytest.raises(GuardrailBlocked, match=r"classifier \(Qwen3Guard\) failed \(AttributeError"):
        cosmos3_runtime.load_guardrails().check_prompts([prompt])
    cosmos3_runtime.load_guardrails(fail_closed=False).check_prompts([prompt])


def test_the_package_pixelates_the_face_and_nothing_else(package):
    _, _, stand_ins = package
    frames = torch.rand(3, 96, 128, 3, generator=torch.Generator().manual_seed(0))
    done = []
    filtered = cosmos3_runtime.load_guardrails().filter_frames(frames, lambda d, t: done.append((d, t)))
    changed = (filtered != frames).any(dim=-1)
    x1, y1, x2, y2 = stand_ins.FACE
    assert changed.any(dim=(1, 2)).all()  # a face in every frame
    rows, cols = changed.nonzero()[:, 1], changed.nonzero()[:, 2]
    assert rows.min() >= y1 - 8 and rows.max() < y2 + 8 and cols.min() >= x1 - 8 and cols.max() < x2 + 8
    assert changed.float().mean() > 0.05 and done[-1] == (3, 3)


def test_the_package_files_come_from_the_cache_only_unless_downloads_are_allowed(package, tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(cosmos3_runtime.InputError, match="nvidia/Cosmos-1.0-Guardrail are not in the Hugging Face "
                                                         "cache: turn on allow_download once"):
        cosmos3_runtime.load_guardrails()


def test_the_cli_writes_a_guarded_video_with_the_package(package, tiny_edge, tmp_path, capsys):
    """--guardrails through the CLI on a prompt it lets through (it crashed after the whole run, writing nothing)."""
    from cosmos3_runtime import __main__ as cli

    out = tmp_path / "cat.mp4"
    assert cli.main(["generate", "--checkpoint", str(tiny_edge), "--prompt", "a cat sleeps", "--frames", "5",
                     "--width", "128", "--height", "96", "--steps", "1", "--guardrails", "--output", str(out)]) == 0
    assert out.stat().st_size > 0 and "guardrail, frames checked 5/5" in capsys.readouterr().out
    blocked = f"a {package[2].WORDS['custom'][0]} in the garden"
    assert cli.main(["generate", "--checkpoint", str(tiny_edge), "--prompt", blocked, "--guardrails", "--output",
                     str(tmp_path / "blocked.mp4")]) == 2
    assert "blocked by the guardrail's keyword blocklist" in capsys.readouterr().err


def test_guardrails_true_loads_nvidias_once_per_pipeline(package, tiny_edge, monkeypatch):
    checker, _, stand_ins = package
    built = []

    class Blocklist(checker.Blocklist):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(checker, "Blocklist", Blocklist)
    pipe = cosmos3_runtime.load(tiny_edge, dtype=torch.float32)
    with pytest.raises(cosmos3_runtime.InputError, match="needs at least"):  # refused before the load (a download)
        pipe.generate("a cat", guardrails=True, **{**SIZE, "num_frames": 4097, "width": 8192, "height": 8192})
    assert built == []
    with pytest.raises(GuardrailBlocked, match="keyword blocklist"):  # (was AttributeError: 'bool' object ...)
        pipe.generate(f"a {stand_ins.WORDS['custom'][0]}", guardrails=True, **SIZE)
    guarded = pipe.generate("a cat", guardrails=True, **{**SIZE, "width": 128, "height": 96})
    assert (guarded.frames != pipe.generate("a cat", **{**SIZE, "width": 128, "height": 96}).frames).any()  # a face
    assert built == [1]
    with pytest.raises(cosmos3_runtime.InputError, match="guardrails must be True .*, a Guardrails .* got 'on'"):
        pipe.generate("a cat", guardrails="on", **SIZE)


def test_an_installed_package_that_fails_to_import_is_named_as_such(tmp_path, monkeypatch):
    package = tmp_path / "cosmos_guardrail"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "cosmos_guardrail.py").write_text("import torchvision_that_does_not_load\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("cosmos_guardrail")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(cosmos3_runtime.InputError, match=r"cosmos-guardrail is installed but does not import "
                                                         r"\(ModuleNotFoundError: No module named "
                                                         r"'torchvision_that_does_not_load'\)"):
        cosmos3_runtime.load_guardrails()


def test_transformers_older_than_5_is_refused_by_name(monkeypatch):
    import transformers

    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    with pytest.raises(cosmos3_runtime.InputError, match="need transformers>=5, and 4.57.1 is installed"):
        cosmos3_runtime.load_guardrails()


# --- in graphs: the node input, and the server-wide setting the HTTP routes use -------------------------------------


@pytest.fixture
def nodes(pack, models_dir, monkeypatch):
    pack.loader._loaded.clear()
    monkeypatch.delenv("COSMOS3_GUARDRAILS", raising=False)
    pack.services.guardrails.release()
    return pack


def pack_guardrails(pack, face_filter=None):
    """A guardrail of the pack's own classes (the pack is imported under its folder's name, a module of its own)."""
    module = sys.modules[pack.__name__.rsplit(".", 1)[0] + ".cosmos3_runtime.guardrails"]
    return module.Guardrails([module.Check("keyword blocklist", word_check)], face_filter=face_filter)


@pytest.mark.slow  # four sampler and decode runs in graphs (the runtime's checks run by default)
def test_nodes_check_the_prompt_before_the_model_loads_and_filter_the_decoded_frames(nodes, monkeypatch):
    model, vae, _ = nodes.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default")["result"]
    text = nodes.Cosmos3TextEncode().encode(f"a {BLOCKED} at night", "", "auto", True, True, True)["result"][0]
    guard = pack_guardrails(nodes, face_filter=grey_box)
    assert "guardrail" in nodes.Cosmos3Sampler.INPUT_TYPES()["optional"]
    monkeypatch.setattr(type(model), "use", lambda *a, **k: pytest.fail("the model loaded before the prompt check"))
    with pytest.raises(Exception, match="the prompt was blocked by the guardrail's keyword blocklist"):
        nodes.Cosmos3Sampler().sample(model, text, 64, 48, 5, 0.0, 0.0, "auto", 1, guardrail=guard)
    for sampler in (nodes.Cosmos3TransferSampler, nodes.Cosmos3SimTransferSampler):
        assert "guardrail" in sampler.INPUT_TYPES()["optional"]
    monkeypatch.undo()
    text = nodes.Cosmos3TextEncode().encode("a cat", "", "auto", True, True, True)["result"][0]
    latent = nodes.Cosmos3Sampler().sample(model, text, 64, 48, 5, 0.0, 0.0, "auto", 1, guardrail=guard)["result"][0]
    plain, _ = nodes.Cosmos3VAEDecode().decode(vae, latent, False, 32, 8)
    guarded, _ = nodes.Cosmos3VAEDecode().decode(vae, latent, False, 32, 8, guardrail=guard)
    outside = torch.ones_like(plain, dtype=torch.bool)
    outside[:, 8:24, 16:40] = False
    assert torch.equal(guarded[outside], plain[outside]) and not torch.equal(guarded, plain)


def test_the_server_wide_setting_guards_every_node_and_goes_with_free(nodes, monkeypatch):
    loads = []

    def load(device, fail_closed=True, allow_download=False):
        loads.append((str(device), fail_closed, allow_download))
        return pack_guardrails(nodes)

    monkeypatch.setattr(nodes.services.guardrails, "load", load)
    model, _, _ = nodes.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default")["result"]
    text = nodes.Cosmos3TextEncode().encode(f"a {BLOCKED}", "", "auto", True, True, True)["result"][0]
    nodes.Cosmos3Sampler().sample(model, text, 64, 48, 5, 0.0, 0.0, "auto", 1)  # the setting is off: not checked
    monkeypatch.setenv("COSMOS3_GUARDRAILS", "on")
    monkeypatch.setenv("COSMOS3_GUARDRAILS_FAIL_OPEN", "1")
    for _ in range(2):
        with pytest.raises(Exception, match="blocked by the guardrail's keyword blocklist"):
            nodes.Cosmos3Sampler().sample(model, text, 64, 48, 5, 0.0, 0.0, "auto", 1)
    assert loads == [("cpu", False, False)]  # loaded once, from the cache only
    mutex = threading.Lock()
    queue = type("Queue", (), {"flags": {}, "mutex": mutex, "not_empty": threading.Condition(mutex),
                               "set_flag": lambda self, name, data: self.flags.update({name: data})})()
    nodes.services.server.wake_for_flags(queue)
    queue.set_flag("unload_models", True)  # what POST /free sets
    queue.flags.clear()  # (as ComfyUI's worker reads them)
    assert nodes.services.guardrails._state["guardrails"] is None
    with pytest.raises(Exception, match="blocked"):
        nodes.Cosmos3Sampler().sample(model, text, 64, 48, 5, 0.0, 0.0, "auto", 1)
    assert len(loads) == 2


def test_a_route_checks_the_request_before_queueing_it(nodes, monkeypatch):
    import asyncio

    jobs = sys.modules[nodes.__name__ + ".serving.jobs"]
    monkeypatch.setattr(jobs, "queue_prompt", lambda graph: pytest.fail("a blocked request was queued"))
    monkeypatch.setenv("COSMOS3_GUARDRAILS", "on")
    monkeypatch.setattr(nodes.services.guardrails, "load", lambda *a, **k: pack_guardrails(nodes))
    with jobs.Job({}, 1) as job, pytest.raises(jobs.RunError) as exc:
        asyncio.run(job.start({}, ["a cat", f"a {BLOCKED}"]))
    assert exc.value.status == 400 and exc.value.body["error"]["type"] == "guardrail_blocked"
    assert "keyword blocklist" in exc.value.body["error"]["message"] and BLOCKED not in str(exc.value.body)

    def cannot_load(*a, **k):
        raise sys.modules[nodes.__name__.rsplit(".", 1)[0] + ".cosmos3_runtime"].InputError(
            "the guardrails need the cosmos-guardrail package")

    nodes.services.guardrails.release()
    monkeypatch.setattr(nodes.services.guardrails, "load", cannot_load)
    with jobs.Job({}, 1) as job, pytest.raises(jobs.RunError) as exc:
        asyncio.run(job.start({}, ["a cat"]))
    assert exc.value.status == 503 and "the server's guardrail is on and cannot run" in str(exc.value)


def test_one_check_at_a_time_and_empty_prompts_blocked_by_name():
    running, overlaps = [], []

    def slow(prompt):
        overlaps.append(len(running))
        running.append(prompt)
        threading.Event().wait(0.02)
        running.remove(prompt)
        return True

    guard = Guardrails([Check("classifier", slow)])
    threads = [threading.Thread(target=guard.check_prompts, args=([f"a cat {i}"],)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlaps == [0] * 6
    with pytest.raises(GuardrailBlocked, match="the prompt is empty, and the guardrail blocks empty prompts"):
        guard.check_prompts(["  "])


def test_a_check_that_failed_open_is_asked_again():
    calls = []

    def flaky(prompt):
        calls.append(prompt)
        if len(calls) == 1:
            raise RuntimeError("busy")
        return True

    guard = Guardrails([Check("classifier", flaky)], fail_closed=False)
    for _ in range(3):
        guard.check_prompts(["a cat"])
    assert calls == ["a cat", "a cat"]  # failed open once, then judged and remembered


def test_transfer_samplers_check_their_prompt_before_the_model_loads(nodes, monkeypatch):
    model, _, _ = nodes.Cosmos3ModelLoader().load("Cosmos3-Nano", "fp32", "default")["result"]
    text = nodes.Cosmos3TextEncode().encode(f"a {BLOCKED} at night", "", "auto", True, True, True)["result"][0]
    monkeypatch.setattr(type(model), "use", lambda *a, **k: pytest.fail("the model loaded before the prompt check"))
    controls = {"edge": torch.rand(9, 48, 64, 3)}
    guard = pack_guardrails(nodes)
    with pytest.raises(Exception, match="keyword blocklist"):
        nodes.Cosmos3TransferSampler().sample(model, text, controls, 64, 48, 9, 0.0, 0.0, 0.0, 0, 1, 0, guardrail=guard)
    with pytest.raises(Exception, match="keyword blocklist"):
        nodes.Cosmos3SimTransferSampler().sample(model, text, controls, 64, 48, 9, 0.0, 0, guardrail=guard)


def test_a_guardrail_verdict_inside_a_queued_run_maps_to_its_own_error_type(nodes):
    jobs = sys.modules[nodes.__name__ + ".serving.jobs"]
    record = {"status": {"messages": [("execution_error", {
        "exception_type": "cosmos3.cosmos3_runtime.guardrails.GuardrailBlocked", "node_type": "Cosmos3Sampler",
        "exception_message": "the prompt was blocked by the guardrail's keyword blocklist"})]}}
    assert jobs.failure(record)[0] == 400 and jobs.failure_kind(record) == "guardrail_blocked"
