"""Causal rollouts (Cosmos3-Nano-Sim-Transfer's layout, tiny and random, fp32 on the CPU): the rolling K/V cache
against the whole-sequence recompute under the block-causal mask, a one-chunk rollout against the bidirectional
forward, causality, the sampler and seed arithmetic, the commit pass, the prompt, and the refusals; a host's block
sampler (`causal_run.HostBlocks`) driven by a stand-in of ComfyUI 0.33's `sample_ar_video` (`ar_video.py`) equal to the pack's
rollout with its seed formula (`test_comfyui_core.py` runs the real sampler)."""

import json
from dataclasses import replace

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime import causal, causal_run, runs
from cosmos3_runtime.errors import CheckpointError, InputError
from cosmos3_runtime.kinds import Causal
from cosmos3_runtime.schedulers import distilled_schedule, stepper_for
from cosmos3_runtime.tiny import make_tiny_checkpoint, sim_transfer_block
from cosmos3_runtime.vae import TileSpec

from ar_video import sample_ar_video

TOL = 1e-5
W, H = 48, 32  # a 3 x 2 latent grid: 2 x 1 patches a frame


@pytest.fixture(scope="module")
def chunkwise(tmp_path_factory):
    root = make_tiny_checkpoint(tmp_path_factory.mktemp("sim") / "chunkwise", kind="gated", dtype="float32",
                                distilled=True, causal=sim_transfer_block(), reasoner=False)
    return cosmos3_runtime.load(root, dtype="fp32")


@pytest.fixture(scope="module")
def framewise(tmp_path_factory):
    root = make_tiny_checkpoint(tmp_path_factory.mktemp("sim") / "framewise", kind="gated", dtype="float32",
                                distilled=True, causal=sim_transfer_block(1, window_frames=4, sink_frames=1),
                                reasoner=False)
    return cosmos3_runtime.load(root, dtype="fp32")


def clip(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(frames, H, W, 3, generator=torch.Generator().manual_seed(seed))


def rollout(pipe, frames=17, control=None, **options):
    control = clip(frames) if control is None else control
    return pipe.generate("a robot arm stacks cubes", control_videos={"edge": control}, width=W, height=H, seed=3,
                         **options)


def test_the_checkpoint_is_read_as_a_causal_sim_transfer(chunkwise, framewise):
    c = chunkwise.variant.causal
    assert (c.chunk_size, c.window_frames, c.sink_frames, c.hints) == (4, None, 0, causal.HINTS)
    assert chunkwise.variant.is_distilled and chunkwise.variant.distilled_sigmas == c.t_list
    f = framewise.variant.causal
    assert (f.chunk_size, f.window_frames, f.sink_frames) == (1, 4, 1)


@pytest.mark.slow  # (the framewise rollout with eviction = the recompute runs by default)
@pytest.mark.parametrize("frames", [49, 65])  # latent frame 0, then 3 and 4 chunks of 4
def test_the_kv_rollout_equals_the_whole_sequence_recompute(chunkwise, frames):
    kv = rollout(chunkwise, frames)
    recomputed = rollout(chunkwise, frames, causal_cache="recompute")
    assert len(kv.settings.kind.rollout.chunks) == 1 + (frames - 1) // 16 and kv.latents.shape[2] == 1 + (frames - 1) // 4
    torch.testing.assert_close(kv.latents, recomputed.latents, atol=TOL, rtol=0)


def test_the_kv_rollout_with_eviction_equals_the_recompute_over_what_each_frame_kept(framewise):
    kv = rollout(framewise, 25)  # 7 chunks of one latent frame: eviction from the fourth on
    plan = kv.settings.kind.rollout
    assert len(plan.chunks) == 7 and plan.kept(6) == [0, 4, 5] and plan.kept(3) == [0, 1, 2]
    recomputed = rollout(framewise, 25, causal_cache="recompute")
    torch.testing.assert_close(kv.latents, recomputed.latents, atol=TOL, rtol=0)
    whole = rollout(framewise, 25, causal_window=100)  # a window past the clip keeps everything
    assert not torch.equal(whole.latents, kv.latents)
    torch.testing.assert_close(whole.latents, rollout(framewise, 25, causal_window=100,
                                                      causal_cache="recompute").latents, atol=TOL, rtol=0)


@pytest.mark.slow  # four rollouts
def test_a_window_past_the_clip_is_bit_identical_to_keeping_everything(chunkwise, framewise):
    assert torch.equal(rollout(chunkwise, 49, causal_window=100).latents, rollout(chunkwise, 49).latents)
    kept = rollout(framewise, 25, causal_window=7)  # 7 latent frames: nothing to evict
    assert torch.equal(kept.latents, rollout(framewise, 25, causal_window=100).latents)


@pytest.mark.parametrize("chunk", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_changing_a_chunks_control_leaves_every_frame_before_it_bit_identical(chunkwise, chunk):
    control = clip(49)
    first = 1 + 16 * (chunk - 1)  # the chunk's first pixel frame (latent 1 + 4 (chunk - 1))
    changed = control.clone()
    changed[first:] = torch.rand(49 - first, H, W, 3, generator=torch.Generator().manual_seed(9))
    a, b = rollout(chunkwise, 49, control), rollout(chunkwise, 49, changed)
    latent = 1 + 4 * (chunk - 1)
    assert torch.equal(a.latents[:, :, :latent], b.latents[:, :, :latent])
    assert not torch.equal(a.latents[:, :, latent:], b.latents[:, :, latent:])
    assert torch.equal(a.frames[:first], b.frames[:first])  # the causal decoder: their frames too


def test_one_chunk_over_the_whole_clip_is_the_bidirectional_model_sampled_in_the_fixed_steps(chunkwise):
    """Without a control and with every frame in one chunk, a rollout is four plain forwards of the whole clip."""
    plan = chunkwise.plan("a robot arm", control_videos={"edge": clip(17)}, width=W, height=H, seed=3)
    rollout = replace(plan.settings.kind.rollout, hint=None, chunks=((0, 3),))
    s = replace(plan.settings, num_frames=9, kind=Causal(rollout))
    run = causal_run.CausalRun(chunkwise.parts, s, plan.request, plan.cond_ids, plan.uncond_ids, None)
    got = runs.execute(run, chunkwise.parts, 3, None, None, None, None).latents

    seeds = causal.SEEDS["framework"]
    x = torch.randn(1, 48, 3, 2, 3, generator=torch.Generator().manual_seed(seeds(3, 0, 0, None)))
    text = chunkwise.denoiser.text_kv(plan.cond_ids)
    sigmas = list(chunkwise.variant.causal.t_list) + [0.0]
    for i in range(4):
        v = chunkwise.transformer(x, torch.tensor(sigmas[i] * 1000), text, None, s.fps).vision
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(seeds(3, 0, 0, i)))
        x = (1 - sigmas[i + 1]) * (x - sigmas[i] * v) + sigmas[i + 1] * noise
    torch.testing.assert_close(got, x, atol=TOL, rtol=0)


def test_the_commit_is_a_clean_forward_not_the_last_steps_keys_and_values(chunkwise, monkeypatch):
    """Committing a chunk runs its denoised frames again with no time embedding; committing what the last step saw
    (its noisy input, its timestep) instead breaks the equality with the recompute, which this test shows."""
    committed = []
    original = causal_run.KVHistory.commit

    def spy(self, run, latents, start):
        committed.append((start, latents.shape[2]))
        original(self, run, latents, start)

    monkeypatch.setattr(causal_run.KVHistory, "commit", spy)
    kv = rollout(chunkwise, 33)
    # controls [0], [1, 5), [5, 9) each in one forward; RGB frames one by one except the last chunk's
    assert committed == [(0, 1), (0, 1), (1, 4), (1, 1), (2, 1), (3, 1), (4, 1), (5, 4)]

    def noisy_commit(self, run, latents, start):  # the K/V a last step's forward leaves: noisy input, time embedding
        noise = torch.randn(latents.shape, generator=torch.Generator().manual_seed(0))
        run.model(0.375 * latents + 0.625 * noise, torch.tensor(625.0), run.parts.denoiser.text_kv(run.cond_ids),
                  None, run.s.fps, hooks=replace(run.parts.denoiser.hooks, cache=self.cache, start_frame=start))
        self.cache.append()

    monkeypatch.setattr(causal_run.KVHistory, "commit", noisy_commit)
    assert (rollout(chunkwise, 33).latents - kv.latents).abs().max() > 100 * TOL


def test_the_sampler_and_the_seeds_by_hand():
    assert causal.seed_framework(5, 9, 2, None) == causal.seed_sglang(5, 9, 2, None) == 14
    assert causal.seed_framework(5, 9, 2, 2) == 5 + 9 * 1_000_003 + 3 * 9_176
    assert causal.seed_sglang(5, 9, 2, 2) == 5 + 9 * 1_000_003 + 2 * 9_176
    assert causal.seed_comfyui(5, 9, 2, None) == 5 and causal.seed_comfyui(5, 9, 2, 1) == 5 + 2 * 1000 + 1
    assert causal.chunk_ranges(9, 4) == [(0, 1), (1, 5), (5, 9)] and causal.chunk_ranges(4, 1)[-1] == (3, 4)
    assert causal.whole_chunks(21, 4) == 17 and causal.whole_chunks(33, 4) == 33 and causal.whole_chunks(13, 1) == 13
    schedule = distilled_schedule(causal.DEFAULT_T_LIST, stochastic=True)
    assert schedule.timesteps.tolist() == pytest.approx([1000.0, 937.5, 833.3, 625.0])
    stepper = stepper_for(schedule)
    x, v = torch.tensor([2.0]), torch.tensor([0.5])
    noise = torch.randn(1, generator=torch.Generator().manual_seed(1))
    got = stepper.step(v, x, torch.Generator().manual_seed(1))
    assert got.item() == pytest.approx((1 - 0.9375) * (2.0 - 1.0 * 0.5) + 0.9375 * noise.item(), abs=1e-6)
    for _ in range(2):
        stepper.step(v, x, torch.Generator())
    assert stepper.step(v, x, torch.Generator()).item() == pytest.approx(2.0 - 0.625 * 0.5)  # the last: x0, no noise


def test_the_prompt_gets_the_control_duration_and_resolution_sentences(chunkwise):
    text = causal.prompt_text("A robot arm stacks cubes.", "edge", True, 121, 30.0, 480, 832)
    assert text == ("A robot arm stacks cubes. Follow the edge control video precisely: shape, contour, silhouette, "
                    "position, and motion of every visible structure must align with the edge signal at every frame. "
                    "The video is 4.0 seconds long and is of 30 FPS. This video is of 480x832 resolution.")
    assert causal.prompt_text("a cat", "edge", False, 17, 24.0, 480, 832) == \
        "a cat. The video is 0.7 seconds long and is of 24 FPS. This video is of 480x832 resolution."
    plan = chunkwise.plan("a cat", control_videos={"edge": clip(17)}, width=W, height=H)
    rendered = chunkwise.planner.tokenizer.render(causal.prompt_text("a cat", "edge", True, 17, 30.0, H, W),
                                                  cosmos3_runtime.transfer.SYSTEM_PROMPT)
    assert chunkwise.planner.tokenizer.encode(causal.prompt_text("a cat", "edge", True, 17, 30.0, H, W),
                                              cosmos3_runtime.transfer.SYSTEM_PROMPT) == plan.cond_ids
    assert "control signals" in rendered


def test_defaults_a_trained_canvas_and_whole_chunks():
    variant_plan = causal.canvas_for(1080, 1920), causal.canvas_for(1000, 1000), causal.canvas_for(1920, 1080)
    assert variant_plan == ((832, 480), (640, 640), (480, 832))


@pytest.mark.parametrize("options, message", [
    (dict(guidance_scale=3.0), "guidance_scale 3 cannot apply"),
    (dict(steps=8), "steps 8 cannot apply"),
    (dict(schedule="unipc"), "fixed sigmas"),
    (dict(chunk_frames=9), "chunks are its own"),
    (dict(control_videos={"edge": clip(17), "depth": clip(17)}), "one control clip"),
    (dict(control_videos={"wsm": clip(17)}), "one control clip, one of edge, blur, depth, seg"),
    (dict(control_videos=None), "give control_videos"),
    (dict(control_videos={"edge": clip(13)}), "are not one chunk"),
    (dict(causal_window=3), "causal_window 3 leaves no history"),
])
def test_what_a_causal_checkpoint_cannot_take_is_refused_before_any_step(chunkwise, options, message):
    options = {"control_videos": {"edge": clip(17)}, **options}
    with pytest.raises(InputError, match=message):
        chunkwise.plan("a cat", width=W, height=H, **options)


@pytest.mark.parametrize("edit, message", [
    (lambda c, i: c.update(cosmos3_nano_sim_auto={}), "Sim-Auto .* is not supported yet"),
    (lambda c, i: c.update(backbone_type="cosmos3_multiview"), "Sim-Auto"),
    (lambda c, i: c["cosmos3_nano_sim_bimanual"]["conditioning"].update(mode="action"), "lists no embodiments"),
    (lambda c, i: c["cosmos3_nano_sim_bimanual"]["conditioning"].update(mode="lidar"), "conditioned on 'lidar' is not"),
    (lambda c, i: c["cosmos3_nano_sim_bimanual"]["fixed_step_sampler_config"].update(sample_type="ode"), "only 'sde'"),
])
def test_checkpoints_the_pack_cannot_roll_out_are_refused_by_name(tmp_path, edit, message):
    root = make_tiny_checkpoint(tmp_path / "c", kind="gated", distilled=True, causal=sim_transfer_block(),
                                reasoner=False)
    path = root / "transformer" / "config.json"
    config, index = json.loads(path.read_text()), json.loads((root / "model_index.json").read_text())
    edit(config, index)
    path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        cosmos3_runtime.pipeline.planner(root)


def test_a_history_setting_beside_the_recompute_is_noted_as_ignored(chunkwise):
    s = chunkwise.plan("a cat", control_videos={"edge": clip(17)}, width=W, height=H, causal_cache="recompute",
                       causal_history="fp8").settings
    assert "causal_history 'fp8' ignored: causal_cache 'recompute' keeps no K/V history" in " ".join(s.notes)
    assert s.kind.rollout.history == "device"


def test_the_plan_counts_the_history_it_keeps(chunkwise, framewise):
    big = chunkwise.plan("a cat", control_videos={"edge": clip(49)}, width=W, height=H)
    assert big.settings.kind.rollout.history_frames() == 2 * 13 and big.estimate.parts["media K/V cache"] > 0
    small = framewise.plan("a cat", control_videos={"edge": clip(25)}, width=W, height=H)
    assert small.settings.kind.rollout.history_frames() == 2 * 4  # the window: sink, two recent frames and the chunk


def test_the_kept_history_is_every_recent_frame_the_window_allows():
    """A window of 8 with 1 sink and chunks of 1 keeps 6 recent frames: at frame 4 all four earlier frames (the
    history was once cut to its last 6 - 4 = 2 by a negative slice; the cache's own eviction kept all four)."""
    config = causal.CausalConfig(1, 8, 1, causal.DEFAULT_T_LIST, ("edge",), False, "test")
    plan = causal.Rollout(config, "edge", tuple(causal.chunk_ranges(12, 1)), 8, 1)
    assert [plan.kept(start) for start in (1, 4, 7, 9)] == [[0], [0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6],
                                                            [0, 3, 4, 5, 6, 7, 8]]


def test_a_rollout_that_does_not_fit_is_refused_naming_what_does(chunkwise, monkeypatch):
    from cosmos3_runtime import budget

    def plan(**options):
        return chunkwise.plan("a cat", control_videos={"edge": clip(65)}, width=W, height=H, **options)

    def needs(p):
        return p.estimate.total + p.estimate.host_total  # the CPU's one memory

    full, fp8 = plan(), plan(causal_history="fp8")
    monkeypatch.setattr(budget, "available_bytes", lambda device: (needs(full) + needs(fp8)) // 2)
    with pytest.raises(InputError, match="causal_history 'fp8' fits"):  # the same history, in fp8
        chunkwise.planner.check(full)
    chunkwise.planner.check(fp8)
    at = {w: needs(plan(causal_history="fp8", causal_window=w)) for w in (9, 10)}
    monkeypatch.setattr(budget, "available_bytes", lambda device: (at[9] + at[10]) // 2)  # a window of 9 fits, 10 not
    with pytest.raises(InputError, match="causal_window 9 fits"):
        chunkwise.planner.check(fp8)
    chunkwise.planner.check(plan(causal_history="fp8", causal_window=9))


@pytest.mark.slow  # two 65-frame rollouts, one of them the recompute (eviction = recompute runs by default)
def test_a_window_on_a_chunkwise_checkpoint_evicts_as_the_recompute_masks(chunkwise):
    kv = rollout(chunkwise, 65, causal_window=9)  # chunks of 4: each keeps 5 latent frames of history
    assert kv.settings.kind.rollout.kept(13) == [8, 9, 10, 11, 12] and kv.settings.kind.rollout.kept(9) == [4, 5, 6, 7, 8]
    torch.testing.assert_close(kv.latents, rollout(chunkwise, 65, causal_window=9, causal_cache="recompute").latents,
                               atol=TOL, rtol=0)


def test_a_history_kept_in_cpu_memory_gives_the_same_clip_and_leaves_the_device(chunkwise):
    """On the CPU both live in one memory; the plan moves the K/V to the host's part and the rollout is bit-identical
    (on a GPU each layer's rows come to the device as the layer runs, the GPU check's business)."""
    device, cpu = rollout(chunkwise, 33), rollout(chunkwise, 33, causal_history="cpu")
    assert torch.equal(device.latents, cpu.latents)
    plan = chunkwise.plan("a cat", control_videos={"edge": clip(33)}, width=W, height=H, causal_history="cpu")
    assert "media K/V cache" in plan.estimate.host and "media K/V cache" not in plan.estimate.parts


def test_an_fp8_history_is_close_to_the_full_one_in_a_quarter_of_fp32s_memory(chunkwise):
    exact, fp8 = rollout(chunkwise, 33), rollout(chunkwise, 33, causal_history="fp8")
    error = ((fp8.latents - exact.latents).abs().mean() / exact.latents.abs().mean()).item()
    assert 0 < error < 0.002, error  # e4m3 keys and values, a scale per token and head
    plans = {h: chunkwise.plan("a cat", control_videos={"edge": clip(33)}, width=W, height=H, causal_history=h)
             for h in ("device", "fp8")}
    full, small = (plans[h].estimate.parts["media K/V cache"] for h in ("device", "fp8"))
    text = 2 * len(plans["device"].cond_ids) * 2 * 2 * 32 * 4  # the device's slabs hold the prompt's K/V before it
    assert small == pytest.approx((full - text) * (1 + 4 / 32) / 4, rel=1e-3)  # fp32: 4 bytes -> 1, a scale per 32


def test_an_fp8_history_keeps_each_rows_scale_through_eviction(framewise):
    exact, fp8 = rollout(framewise, 25), rollout(framewise, 25, causal_history="fp8")  # evicts from chunk 4 on
    error = ((fp8.latents - exact.latents).abs().mean() / exact.latents.abs().mean()).item()
    assert 0 < error < 0.002, error  # 0.0007 here; 0.006 when eviction leaves the scales behind


def test_a_recompute_too_large_to_mask_and_compile_are_refused_by_name(chunkwise, monkeypatch):
    monkeypatch.setattr(causal_run, "RECOMPUTE_MASK", 1000)  # a 33-frame clip's mask here is 36 x 36 (2 tokens a frame)
    with pytest.raises(InputError, match="'recompute' is a reference for short clips"):
        rollout(chunkwise, 33, causal_cache="recompute")
    with pytest.raises(InputError, match="compile runs the K/V rollout; the recompute reference runs eagerly"):
        rollout(chunkwise, 17, compile=True, causal_cache="recompute")
    assert "of 1 FPS" in causal.prompt_text("a cat", None, False, 17, 0.5, 480, 832)  # not a division by zero


PROMPT = "a robot arm stacks cubes"


def host_run(pipe, frames: int, seed: int) -> causal_run.HostBlocks:
    plan = pipe.plan(PROMPT, control_videos={"edge": clip(frames)}, width=W, height=H, seed=seed)
    return causal_run.HostBlocks(causal_run.CausalRun(pipe.parts, plan.settings, plan.request, plan.cond_ids,
                                                      plan.uncond_ids, None))


def sigmas_of(pipe) -> torch.Tensor:
    return torch.tensor([*pipe.variant.causal.t_list, 0.0])


def test_the_host_sampler_equals_the_pack_rollout_with_its_seed_formula(framewise):
    frames, seed = 25, 7  # 7 latent frames, each a block: eviction from the fourth on
    blocks = host_run(framewise, frames, seed)
    sigmas = sigmas_of(framewise)
    noise = torch.randn(blocks.run.latents.shape, generator=torch.manual_seed(seed))  # ComfyUI's prepare_noise
    got = sample_ar_video(blocks, sigmas[0] * noise, sigmas, seed, 1)
    expected = framewise.generate(PROMPT, control_videos={"edge": clip(frames)}, width=W, height=H, seed=seed,
                                  causal_seeds="comfyui").latents
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    other = framewise.generate(PROMPT, control_videos={"edge": clip(frames)}, width=W, height=H, seed=seed).latents  # the framework's seeds: another video
    assert (other - expected).abs().max() > 0.1


def test_what_the_host_sampler_cannot_drive_is_refused_by_name(framewise, chunkwise):
    blocks, sigmas = host_run(framewise, 9, 1), sigmas_of(framewise)
    x = torch.randn(blocks.run.latents.shape)
    with pytest.raises(InputError, match="set num_frame_per_block to 1"):
        sample_ar_video(blocks, x, sigmas, 1, 2)
    with pytest.raises(InputError, match="sample this MODEL with SamplerARVideo"):
        sample_ar_video(host_run(framewise, 9, 1), x, sigmas, 1, 1, cache={"end": 5})
    with pytest.raises(InputError, match="chunkwise Sim-Transfer.*Cosmos3 Sim-Transfer Sampler"):
        blocks = host_run(chunkwise, 17, 1)
        sample_ar_video(blocks, torch.randn(blocks.run.latents.shape), sigmas_of(chunkwise), 1, 4)
    with pytest.raises(InputError, match="causal_seeds 'comfyui' counts SamplerARVideo's equal blocks"):
        chunkwise.plan(PROMPT, control_videos={"edge": clip(17)}, width=W, height=H, causal_seeds="comfyui")
    with pytest.raises(InputError, match="a session does not know ahead"):
        framewise.session(PROMPT, control="edge", num_frames=9, width=W, height=H, causal_seeds="comfyui")


def test_each_chunk_decodes_as_the_next_samples_into_the_whole_clips_frames(chunkwise):
    """The batch rollout decodes chunk by chunk (`codec.ChunkDecode`): its frames are one decode of the whole clip bit
    for bit; a tiled decode still waits for the clip (its tiles would see each chunk's edges otherwise)."""
    out = rollout(chunkwise, 33)
    assert torch.equal(out.frames, chunkwise.codec.decode(out.latents))
    tiled = rollout(chunkwise, 33, vae_tile=(2, 1))
    assert torch.equal(tiled.latents, out.latents)
    assert torch.equal(tiled.frames, chunkwise.codec.decode(out.latents, tile=TileSpec(2, 1)))
    assert not torch.equal(tiled.frames, out.frames)


def test_the_decode_stream_waits_for_the_sampling_and_is_waited_for_once(chunkwise, monkeypatch):
    """On a GPU each chunk's decode is queued on a second stream (a recording stand-in for torch.cuda here): it first
    waits for the sampling stream, marks the latents it reads as used there, and is queued before the chunk's commits
    and the next chunk's sampling; a chunk's frames land in ordinary memory two chunks on (their pinned buffer reused),
    the rest at the end; the same frames as in line."""
    from contextlib import contextmanager

    from cosmos3_runtime import codec

    log = []

    class Cuda:
        class Stream:
            def __init__(self, device):
                pass

            def wait_stream(self, other):
                log.append(("wait", other))

        class Event:
            def record(self, stream):
                pass

            def synchronize(self):
                log.append("landed")

        @staticmethod
        def current_stream(device):
            return "sampling"

        @staticmethod
        @contextmanager
        def stream(side):
            log.append("decode")
            yield
            log.append("decoded")

        @staticmethod
        def is_available():
            return False  # (no pinned memory on this machine)

    made = codec.ChunkDecode.__init__

    def on_a_gpu(self, *args):
        made(self, *args)
        self.side = Cuda.Stream(None)

    spied = {"commit": causal_run.KVHistory.commit, "denoise": chunkwise.denoiser.denoise}

    def spy(name):
        def call(*args, **kwargs):
            log.append(name)
            return spied[name](*args, **kwargs)
        return call

    monkeypatch.setattr(codec, "cuda", Cuda)
    monkeypatch.setattr(codec.ChunkDecode, "__init__", on_a_gpu)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda t, s: log.append(("read", tuple(t.shape))), raising=False)
    monkeypatch.setattr(causal_run.KVHistory, "commit", spy("commit"))
    monkeypatch.setattr(chunkwise.denoiser, "denoise", spy("denoise"))
    out = rollout(chunkwise, 49)  # chunks [0, 1), [1, 5), [5, 9), [9, 13); controls committed before each
    shown = [e for i, e in enumerate(log) if e != "commit" or log[i - 1] != "commit"]  # a run of commits once
    chunk = [("wait", "sampling"), "decode"]
    assert shown == ["commit", "denoise", *chunk, ("read", (1, 48, 1, 2, 3)), "decoded", "commit",
                     "denoise", *chunk, ("read", (1, 48, 4, 2, 3)), "decoded", "commit",
                     "denoise", "landed", *chunk, ("read", (1, 48, 4, 2, 3)), "decoded", "commit",
                     "denoise", "landed", *chunk, ("read", (1, 48, 4, 2, 3)), "decoded", "landed", "landed"]
    monkeypatch.undo()  # (the last chunk's frames went through the buffer of the second's)
    assert torch.equal(out.frames, rollout(chunkwise, 49).frames)


def test_fp8_attention_rounds_every_forwards_inputs_and_stays_close(chunkwise, monkeypatch):
    """causal_attention 'fp8' (off by default): every media attention of the rollout, its commits' too, reads queries,
    keys and values rounded to e4m3 with a scale per key/value head (what torch's FP8 attention kernel reads); the
    latents stay within 1.5 % of full attention (1.0 % measured here, fp32)."""
    from cosmos3_runtime.weights.fp8 import rounded_per_head

    assert chunkwise.plan("a cat", control_videos={"edge": clip(33)}, width=W, height=H).settings.kind.rollout.attention \
        == "full"
    exact = rollout(chunkwise, 33)
    seen, attend = [], causal_run.attention

    def spy(q, k, v):
        seen.append(all(torch.equal(rounded_per_head(t, k.shape[1]), t) for t in (q, k, v)))  # already on the grid
        return attend(q, k, v)

    monkeypatch.setattr(causal_run, "attention", spy)
    fp8 = rollout(chunkwise, 33, causal_attention="fp8")
    assert seen and all(seen) and len(seen) == 2 * (3 * 4 + 1 + 3 + 4)  # 2 layers: 3 chunks x 4 steps, the commits
    error = ((fp8.latents - exact.latents).abs().mean() / exact.latents.abs().mean()).item()
    assert 0 < error < 0.015, error
    with pytest.raises(InputError, match="causal_attention 'fp8' rounds the K/V rollout's attention inputs"):
        rollout(chunkwise, 17, causal_attention="fp8", causal_cache="recompute")
