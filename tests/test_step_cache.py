"""SeaCache in the sampling loop: its pieces (the indicator filter, the distance, the decisions, the cap on reuses in
a row, the residual extrapolation) on their own and, with COSMOS_FRAMEWORK_DIR (a checkout of NVIDIA's
cosmos-framework), against the framework's own functions on identical inputs; threshold 0 bit-identical to the cache
off in every mode; what runs and what is reported. The whole default run against diffusers' SeaCache:
`test_step_cache_parity.py`."""

import importlib.util
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import cosmos3_runtime
from cosmos3_runtime.action import ActionRequest
from cosmos3_runtime.step_cache import CacheConfig, StepCache, extrapolate, noise_level, relative_l1, sea_filter

FRAMEWORK = os.environ.get("COSMOS_FRAMEWORK_DIR")
SMALL = dict(width=64, height=48, num_frames=9, negative_prompt="blurry")


def noisy_run(seed=0, steps=8, frames=3):
    """Latents that lose noise step by step, like a sampler's, with their timesteps (1000 .. 0)."""
    g = torch.Generator().manual_seed(seed)
    clean, noise = torch.randn(1, 48, frames, 4, 6, generator=g), torch.randn(1, 48, frames, 4, 6, generator=g)
    sigmas = torch.linspace(1.0, 0.1, steps)
    return [((1 - s) * clean + s * noise, float(s * 1000)) for s in sigmas]


def decisions(cache: StepCache, run, passes=2) -> list[list[bool]]:
    """Which passes of each step run in full, with a stand-in layer stack (a full run stores a residual)."""
    cache.begin(len(run))
    seen = []
    for i, (latents, t) in enumerate(run):
        cache.step(i, latents, t)
        row = []
        for k in range(passes):
            ran = []
            cache.layers(k)(torch.full((4, 2), float(i)), lambda h: ran.append(1) or h * 2)
            row.append(bool(ran))
        seen.append(row)
    return seen


def test_first_and_last_steps_and_a_pass_without_history_run_in_full():
    seen = decisions(StepCache(CacheConfig(threshold=1e9, max_consecutive=0)), noisy_run())
    assert seen[0] == [True, True] and seen[-1] == [True, True]  # ret_steps 1, cutoff_from_end 1
    assert all(row == [False, False] for row in seen[1:-1])  # an unreachable threshold, no cap: every other step reuses
    cache = StepCache(CacheConfig(threshold=1e9, ret_steps=2, cutoff_from_end=2, max_consecutive=0))
    assert [row[0] for row in decisions(cache, noisy_run())] == [True, True, False, False, False, False, True, True]
    assert (cache.full, cache.skipped) == (8, 8)


def test_at_most_max_consecutive_reuses_in_a_row():
    """NVIDIA's cap (cosmos-framework PR #225, diffusers' max_consecutive_cached): after that many reuses a pass runs
    in full whatever its change, and the count starts again at the full run."""
    run = noisy_run(steps=12)
    assert CacheConfig().max_consecutive == 2
    seen = [row[0] for row in decisions(StepCache(CacheConfig(threshold=1e9)), run)]
    assert seen == [True, False, False, True, False, False, True, False, False, True, False, True]
    once = [row[0] for row in decisions(StepCache(CacheConfig(threshold=1e9, max_consecutive=1)), run)]
    assert once == [True, False] * 5 + [True, True]


def replayed(run, config: CacheConfig) -> list[bool]:
    """The framework's rule (forced ends and cap, else the sum of changes against the threshold) replayed on the
    indicators of a run, for one pathway."""
    indicators = [sea_filter(x[0], noise_level(t, config)) for x, t in run]
    expected, accumulated, reused = [True], 0.0, 0
    for i in range(1, len(run)):
        if i == len(run) - 1 or (config.max_consecutive and reused >= config.max_consecutive):
            full, accumulated = True, 0.0
        else:
            accumulated += float(relative_l1(indicators[i], indicators[i - 1]))
            full = accumulated >= config.threshold
            accumulated = 0.0 if full else accumulated
        reused = 0 if full else reused + 1
        expected.append(full)
    return expected


@pytest.mark.parametrize("config", [CacheConfig(), CacheConfig(threshold=0.35, max_consecutive=0)],
                         ids=["now: 0.25, at most 2 in a row", "before PR 225: 0.35, no cap"])
def test_threshold_zero_never_skips_and_the_sum_resets_after_a_full_run(config):
    assert all(all(row) for row in decisions(StepCache(CacheConfig(threshold=0.0)), noisy_run()))
    run = noisy_run(steps=16)
    seen = decisions(StepCache(config), run)
    expected = replayed(run, config)
    assert [row[0] for row in seen] == expected and [row[1] for row in seen] == expected
    assert False in expected and expected.count(True) > 2


def test_the_indicator_is_taken_in_the_models_dtype():
    """The framework filters the latents as the model sees them (bf16 in a bf16 run) and measures the change in that
    dtype; an fp32 run measures in fp32."""
    latents, t = noisy_run()[2]
    cache = StepCache(CacheConfig(), torch.bfloat16)
    cache.begin(8)
    cache.step(2, latents, t)
    assert cache.current.dtype == torch.bfloat16
    assert torch.equal(cache.current, sea_filter(latents[0].to(torch.bfloat16), noise_level(t, cache.config)))


def test_residuals_are_extrapolated_through_divided_differences():
    line = [(s, torch.full((3,), 2.0 * s + 1.0)) for s in (1, 2, 4)]
    assert torch.allclose(extrapolate(line, 7, order=1), torch.full((3,), 15.0))
    curve = [(s, torch.full((3,), float(s * s))) for s in (0, 1, 3)]
    assert torch.allclose(extrapolate(curve, 5, order=2), torch.full((3,), 25.0))
    assert torch.equal(extrapolate(curve, 5, order=0), curve[-1][1])  # order 0: the last residual
    assert torch.allclose(extrapolate(curve[:1], 5, order=2), curve[0][1])  # too little history: constant


def test_a_skipped_pass_adds_the_extrapolated_residual_to_its_input():
    cache = StepCache(CacheConfig(threshold=1e9))
    run = noisy_run(steps=4)
    cache.begin(4)
    outputs = []
    for i, (latents, t) in enumerate(run):
        cache.step(i, latents, t)
        hidden = torch.full((2, 3), 10.0 * i)
        outputs.append(cache.layers(0)(hidden, lambda h, i=i: h + 5.0 * (i + 1)))  # residual 5, 10, ... if run
    assert torch.equal(outputs[1], torch.full((2, 3), 10.0 + 5.0))  # one full run before: its residual, as is
    assert torch.equal(outputs[2], torch.full((2, 3), 20.0 + 5.0))  # history still one entry: order 1 falls to 0
    assert cache.report() == "SeaCache: 2 forwards run, 2 skipped"


def test_sequence_parallel_ranks_take_one_decision(monkeypatch):
    """Under sequence parallelism a rank that skipped the layer stack while another ran it would wait forever in the
    stack's all-to-alls: each step's figures are all-reduced (max) over the group before any rank decides. Here the
    other rank measures twice this rank's change: this rank decides on the larger figure, once per step."""
    from cosmos3_runtime import step_cache
    from cosmos3_runtime.parallel import Group

    reduced = []

    def all_reduce(tensor, op, group):
        reduced.append(op)
        tensor.mul_(2.0)  # the other rank's figures

    monkeypatch.setattr(step_cache.dist, "all_reduce", all_reduce)
    run = noisy_run()
    alone = decisions(StepCache(CacheConfig(threshold=0.35)), run, passes=1)
    cache = StepCache(CacheConfig(threshold=0.35))
    cache.begin(len(run))
    together = []
    for i, (latents, t) in enumerate(run):
        cache.step(i, latents, t, Group(None, 2, 0))
        ran = []
        cache.layers(0)(torch.full((4, 2), float(i)), lambda h: ran.append(1) or h * 2)
        together.append([bool(ran)])
    assert reduced == [torch.distributed.ReduceOp.MAX] * (len(run) - 2)  # every step that may skip, once
    assert sum(row[0] for row in together) > sum(row[0] for row in alone)  # the doubled figure runs more often


def test_the_indicator_filter_keeps_a_clean_signal_and_smooths_noise():
    x = torch.randn(48, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(sea_filter(x, 1e-6), x.movedim(0, -1), atol=1e-4)  # no noise: the gain is flat
    assert sea_filter(x, 0.9).shape == (3, 8, 8, 48)
    flat, checker = torch.ones(4, 3, 8, 8), (-1.0) ** torch.arange(8).view(1, 1, 8, 1).expand(4, 3, 8, 8)
    assert sea_filter(checker, 0.9).norm() < 0.1 * sea_filter(flat, 0.9).norm()  # high noise: high frequencies cut


def framework_cache():
    """NVIDIA's diffusion_cache module from COSMOS_FRAMEWORK_DIR, with its two framework imports stubbed."""
    if not FRAMEWORK:
        pytest.skip("set COSMOS_FRAMEWORK_DIR to compare SeaCache with NVIDIA's framework")
    stubs = {"cosmos_framework": types.ModuleType("cosmos_framework"),
             "cosmos_framework.utils": types.ModuleType("cosmos_framework.utils"),
             "cosmos_framework.model.generator.mot.inference_text_kv_memory": types.ModuleType("kv")}
    stubs["cosmos_framework.utils"].log = types.SimpleNamespace(info=print, warning=print)
    stubs["cosmos_framework.model.generator.mot.inference_text_kv_memory"].InferenceTextKVMemoryState = type("S", (), {})
    path = Path(FRAMEWORK, "cosmos_framework", "model", "generator", "mot", "diffusion_cache.py")
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location("nvidia_diffusion_cache", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            sys.modules.pop(name) if old is None else sys.modules.__setitem__(name, old)
    return module


def test_the_pieces_equal_nvidias_functions_on_the_same_inputs():
    theirs = framework_cache()
    reference = theirs.DiffusionCache(num_steps=8)
    for latents, t in noisy_run(frames=5):
        a, b = reference._sea_ab(t)
        expected = theirs.apply_sea_from_ab(latents[0].movedim(0, -1), a, b, power_exp=3.0, dims=(-4, -3, -2))
        assert torch.equal(sea_filter(latents[0], noise_level(t, CacheConfig())), expected)
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    assert relative_l1(x, y).item() == theirs.rel_l1_dist(x, y)
    history = [(s, torch.randn(4, 3)) for s in (0, 2, 3)]
    for order in (0, 1, 2):
        wrapped = [(s, (None, r)) for s, r in history]
        assert torch.equal(extrapolate(history, 6, order), theirs._extrapolate_gen(wrapped, 6, order))


@pytest.mark.parametrize("threshold", [0.1, 0.35, 0.6])
def test_the_decisions_equal_nvidias_on_the_same_run(threshold):
    """Their per-pathway rule (_should_compute), fed the same indicators step by step, with a stored residual after
    every full run as their layer hook stores one, decides exactly as ours."""
    theirs = framework_cache()
    run = noisy_run(seed=3, steps=12, frames=5)
    reference = theirs.DiffusionCache(num_steps=len(run), config={"diffusion_cache_thresh": threshold})
    cap = getattr(reference.config, "max_consecutive_cached", 0)  # 0 before PR #225 (commit c7e8d76 and earlier)
    expected = []
    for i, (latents, t) in enumerate(run):
        reference.state.step = i
        indicator = reference._extract_indicator(types.SimpleNamespace(vision=types.SimpleNamespace(
            tokens=[latents[0]], token_shapes=[latents.shape])), t)
        row = []
        for pathway in ("cfg0", "cfg1"):
            full = reference._should_compute(pathway, indicator)
            state = reference._pathways[pathway]
            if full:
                state.history.append((i, (None, torch.zeros(1))))
            if hasattr(state, "consecutive_cached"):  # as its layer hook counts reuses
                state.consecutive_cached = 0 if full else state.consecutive_cached + 1
            row.append(full)
        expected.append(row)
    assert decisions(StepCache(CacheConfig(threshold=threshold, max_consecutive=cap)), run) == expected


def picture(seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8))


MODES = {
    "t2v with CFG": ("gated", {}, dict(guidance_scale=4.0)),
    "i2v": ("edge", {}, dict(image=picture(1))),
    "sound": ("gated", dict(sound=True), dict(sound=True, num_frames=9)),
    "action policy": ("edge", dict(action=True), dict(action=ActionRequest(chunk_size=4, domain="droid_lerobot",
                                                                            resolution_tier=256, image=picture(2)))),
    "transfer": ("gated", {}, dict(control_videos={"edge": torch.rand(9, 48, 64, 3)}, chunk_frames=5)),
}


def test_a_pass_whose_tokens_change_starts_over():
    """A transfer's second pass is the prompt without controls inside the control-guidance interval and the negative
    with them outside it: its token count changes. A step run in full at the new size (here forced by the cap) starts
    the pass's history over; before, its residual joined one of the old size and the next skip extrapolated across the
    two shapes (a size mismatch in the middle of a run)."""
    cache = StepCache(CacheConfig(threshold=1e9))
    run = noisy_run(steps=8)
    cache.begin(len(run))
    outputs = []
    for i, (latents, t) in enumerate(run):
        cache.step(i, latents, t)
        hidden = torch.full((4 if i < 3 else 6, 2), float(i))
        outputs.append(cache.layers(0)(hidden, lambda h, i=i: h + i + 1.0))  # a full run's residual: i + 1
    assert torch.equal(outputs[3], torch.full((6, 2), 7.0))  # step 3 ran in full (the cap) at the new size
    assert torch.equal(outputs[4], torch.full((6, 2), 4.0 + 4.0))  # then reused step 3's residual alone
    assert cache.report() == "SeaCache: 4 forwards run, 4 skipped"


@pytest.mark.parametrize("mode", MODES)
def test_threshold_zero_is_bit_identical_to_the_cache_off(tiny_factory, mode):
    kind, heads, request = MODES[mode]
    pipe = cosmos3_runtime.load(tiny_factory(kind=kind, **heads), device="cpu", dtype="fp32")
    options = {**SMALL, "steps": 6, "seed": 4, **request}
    off = pipe.generate("a red ball rolls", cache="off", **options)
    zero = pipe.generate("a red ball rolls", cache_threshold=0.0, **options)
    on = pipe.generate("a red ball rolls", **options)
    for name in ("latents", "frames", "sound_latents", "actions"):
        if getattr(off, name) is not None:
            assert torch.equal(getattr(zero, name), getattr(off, name)), name
    assert off.cache is None and zero.cache.endswith(" 0 skipped")
    assert "skipped" in on.cache and on.settings.cache == CacheConfig()


def test_a_run_without_noisy_video_is_not_cached(tiny_factory):
    """Inverse dynamics holds the whole clip: nothing of the video is generated, so SeaCache has nothing to decide
    from (the framework turns it off for such packs too), and says so."""
    pipe = cosmos3_runtime.load(tiny_factory(kind="edge", action=True), device="cpu", dtype="fp32")
    action = ActionRequest(mode="inverse_dynamics", chunk_size=4, domain="pusht", resolution_tier=256,
                           video=[picture(10 + i) for i in range(5)])
    result = pipe.generate("push the block", action=action, steps=3, output="latents")
    assert result.cache is None and any("SeaCache off" in note for note in result.settings.notes)


def test_bad_cache_options_are_refused_before_loading():
    from cosmos3_runtime import InputError, Request

    with pytest.raises(InputError, match="cache must be one of seacache, off"):
        Request(cache="teacache")
    with pytest.raises(InputError, match="cache_threshold must be 0 or more"):
        Request(cache_threshold=-1.0)
    with pytest.raises(InputError, match="cache_residual_order must be 0, 1 or 2"):
        Request(cache_residual_order=3)
    for bad in (-1, 1.5, True):
        with pytest.raises(InputError, match="cache_max_consecutive must be a whole number, 0 or more"):
            Request(cache_max_consecutive=bad)
