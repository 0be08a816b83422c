"""Cancel between transformer layers and VAE frames (`cosmos3_runtime.cancel`): a run stops within about one layer's
time, not at the end of a step that may take minutes; the pipeline and the worker pool stay usable afterwards."""

import importlib
import queue
import shutil
import threading
import time

import pytest
import torch

import cosmos3_runtime
from conftest import COMFYUI_DIR
from cosmos3_runtime import cancel
from cosmos3_runtime.transformer import DecoderLayer
from cosmos3_runtime.vae import TileSpec
from cosmos3_runtime.workers import WorkerPool

LAYERS = 8
LAYER_S = 0.25  # each media layer sleeps this long: a step takes seconds without burning the CPU
CANCEL_AFTER_S = 1.0  # into the first step
REQUEST = dict(width=64, height=48, num_frames=1, steps=2, seed=1, guidance_scale=4.0, output="latents")


class Cancelled(Exception):
    pass


@pytest.fixture(scope="module")
def pipe(tiny_factory):
    return cosmos3_runtime.load(tiny_factory(kind="gated", overrides={"num_hidden_layers": LAYERS}), device="cpu",
                                dtype="fp32")


def test_a_cancel_stops_a_run_within_one_layer(pipe, monkeypatch):
    forwards_per_step = 2  # guidance: a conditional and an unconditional pass
    step_s = forwards_per_step * LAYERS * LAYER_S
    assert step_s > 3  # without between-layer checks the run would go on to the step's end, seconds later
    media, layers_run, pressed, pressed_at = DecoderLayer.media, [], threading.Event(), []

    def press_cancel():
        pressed_at.append(time.monotonic())
        pressed.set()

    def slow_media(layer, *args):
        if not layers_run:  # the first step begins
            threading.Timer(CANCEL_AFTER_S, press_cancel).start()
        layers_run.append(layer)
        time.sleep(LAYER_S)
        return media(layer, *args)

    def interrupt():
        if pressed.is_set():
            raise Cancelled

    monkeypatch.setattr(DecoderLayer, "media", slow_media)
    with pytest.raises(Cancelled):
        pipe.generate("a cat", interrupt=interrupt, **REQUEST)
    delay = time.monotonic() - pressed_at[0]
    print(f"\ncancel delay {delay:.3f} s (a layer takes {LAYER_S} s, a step {step_s:.1f} s)")
    assert delay < LAYER_S + 0.75
    assert len(layers_run) < forwards_per_step * LAYERS  # stopped inside the first step


def test_the_pipeline_runs_again_after_a_cancel(pipe):
    def cancel_at_once():
        raise Cancelled

    with pytest.raises(Cancelled):
        pipe.generate("a cat", interrupt=cancel_at_once, **REQUEST)
    cancel.check()  # uninstalled: no longer raises
    assert pipe.generate("a cat", **REQUEST).latents.shape == (1, 48, 1, 3, 4)


def test_checking_restores_the_check_before_it_also_on_errors():
    calls = []
    with cancel.checking(lambda: calls.append("outer")):
        with pytest.raises(Cancelled), cancel.checking(lambda: calls.append("inner")):
            cancel.check()
            raise Cancelled
        cancel.check()
    cancel.check()
    assert calls == ["inner", "outer"]


def test_the_vae_is_cancelled_between_frames_and_tiles_without_a_progress_callback(pipe):
    latents = torch.randn(1, pipe.vae.config.z_dim, 2, 3, 3)
    checks = []
    with cancel.checking(lambda: checks.append(None)):
        pipe.vae.decode(latents, tile=TileSpec(2, 1))
    assert len(checks) == 2 * 4  # after each latent frame of each of the 2 x 2 tiles

    def cancel_at_once():
        raise Cancelled

    for coder, run in ((pipe.vae.decoder, lambda: pipe.vae.decode(latents)),  # 2 latent frames
                       (pipe.vae.encoder, lambda: pipe.vae.encode(torch.zeros(1, 3, 5, 16, 16)))):  # 2 chunks
        chunks = []
        hook = coder.register_forward_hook(lambda *_: chunks.append(1))
        try:
            with pytest.raises(Cancelled), cancel.checking(cancel_at_once):
                run()
        finally:
            hook.remove()
        assert len(chunks) == 1


def test_the_sampler_node_checks_comfyuis_cancel_between_layers(pack, models_dir, monkeypatch):
    class Interrupted(BaseException):  # ComfyUI's InterruptProcessingException is a BaseException too
        pass

    runtime = importlib.import_module(pack.__name__.rsplit(".", 1)[0] + ".cosmos3_runtime.transformer")  # the pack's copy
    media, layers_run = runtime.DecoderLayer.media, []

    def counted_media(layer, *args):
        layers_run.append(layer)
        return media(layer, *args)

    def cancel_after_the_first_layer():
        if layers_run:
            raise Interrupted

    pack.loader._loaded.clear()
    model, _, _ = pack.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default")["result"]
    text = pack.Cosmos3TextEncode().encode("a cat", "", "auto", True, True, True)["result"][0]
    monkeypatch.setattr(runtime.DecoderLayer, "media", counted_media)
    monkeypatch.setattr(pack.services.progress, "check_interrupt", cancel_after_the_first_layer)
    with pytest.raises(Interrupted):
        pack.Cosmos3Sampler().sample(model, text, 64, 48, 5, 0.0, 0.0, "auto", 1)
    assert len(layers_run) == 1 < model.pipeline.transformer.config.num_hidden_layers  # not at the step's end


def test_the_pool_stops_its_workers_at_a_step_when_interrupted():
    """The pool asks `interrupt` while its workers run; once it raises, the pool sets their shared cancel flag, which
    they agree on at their next step (no rank stops between layers), and re-raises when every rank has stopped."""
    pool = WorkerPool.__new__(WorkerPool)  # no processes: two stand-in workers that honour the flag at a step
    pool.replies, pool.cancel, pool.processes = queue.Queue(), threading.Event(), []

    def worker(rank):
        for step in range(1, 100):
            if pool.cancel.wait(0.05):
                pool.replies.put(("cancelled", rank, None))
                return
            pool.replies.put(("progress", rank, (step, 99, None)))

    asked = []

    def interrupt():
        asked.append(time.monotonic())
        if len(asked) > 3:
            raise Cancelled

    workers = [threading.Thread(target=worker, args=(rank,)) for rank in (0, 1)]
    for thread in workers:
        thread.start()
    with pytest.raises(Cancelled):
        pool._collect([0, 1], timeout=None, interrupt=interrupt)
    for thread in workers:
        thread.join()
    assert pool.cancel.is_set() and len(asked) == 4  # not asked again once it raised


@pytest.mark.skipif(not COMFYUI_DIR, reason="set COMFYUI_DIR to a ComfyUI checkout (run by ComfyUI's Python)")
def test_the_core_model_checks_comfyuis_cancel_between_layers(comfyui, tiny_edge, tmp_path, monkeypatch):
    """KSampler calls the core MODEL per step: ComfyUI's interrupt, raised from the server's /interrupt, stops the
    call at the next layer."""
    import comfy.model_management as mm
    import folder_paths

    shutil.copytree(tiny_edge, tmp_path / "Cosmos3-Edge")
    folder_paths.add_model_folder_path("cosmos3", str(tmp_path))
    handle, _, _ = comfyui.nodes.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default")["result"]
    model, _ = comfyui.nodes.Cosmos3CoreModel().build(handle)
    positive, _ = comfyui.nodes.Cosmos3CoreTextEncode().encode("a cat", "", "auto", True, True, True, 24.0)
    x = torch.randn(1, 48, 2, 3, 4)
    conds = model.model.extra_conds(**positive[0][1], cross_attn=positive[0][0], noise=x, device=torch.device("cpu"))
    transformer = handle.pipeline.transformer
    layer_class = type(transformer.layers[0])  # (the pack's own copy of the runtime)
    media, layers_run = layer_class.media, []

    def media_then_cancel(layer, *args):
        layers_run.append(layer)
        mm.interrupt_current_processing()  # what the server's /interrupt does
        return media(layer, *args)

    # the block each call runs (eager here: compile's auto is off on the CPU)
    monkeypatch.setattr(layer_class, "media", media_then_cancel)
    try:
        with pytest.raises(mm.InterruptProcessingException):
            model.model.apply_model(x, torch.tensor([0.7]), **{k: c.cond for k, c in conds.items()})
    finally:
        mm.interrupt_current_processing(False)
    assert len(layers_run) == 1 < transformer.config.num_hidden_layers
    comfyui.cosmos3_runtime.cancel.check()  # (the pack's own copy of the runtime) uninstalled after the call
