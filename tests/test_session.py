"""Sessions, tiny and random, fp32 on the CPU. Cosmos3-Nano-Sim-Bimanual (its layout): the action contract and its
normalizer, a batch rollout from a first image and actions, sessions tick by tick against the batch, causality over
ticks, the null actions of frame 0, the action tokens' positions, eviction at the window with memory flat, and the
refusals. Cosmos3-Nano-Sim-Transfer (framewise and chunkwise): episodes control chunk by control chunk against the
batch rollout, resets with the next prompt and seed, memory flat over episodes, and the refusals."""

import json
import math

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime import budget, causal, causal_run
from cosmos3_runtime.action import ActionRequest
from cosmos3_runtime.errors import CheckpointError, InputError
from cosmos3_runtime.pipeline import planner
from cosmos3_runtime.session import TransferSession
from cosmos3_runtime.tiny import make_tiny_checkpoint, sim_bimanual_block, sim_transfer_block

from ar_video import sample_ar_video

W, H = 64, 32  # a 4 x 2 latent grid: 2 x 1 patches a frame
WINDOW = 6  # latent frames of history: the third tick evicts
OFFSETS = [0.01 * i for i in range(29)]
SCALES = [0.5 + 0.05 * i for i in range(29)]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    root = make_tiny_checkpoint(tmp_path_factory.mktemp("bimanual") / "ckpt", kind="gated", dtype="float32",
                                distilled=True, action=True, reasoner=False,
                                causal=sim_bimanual_block(WINDOW, OFFSETS, SCALES))
    return cosmos3_runtime.load(root, dtype="fp32")


def first_image(seed: int = 0) -> torch.Tensor:
    return torch.rand(1, H, W, 3, generator=torch.Generator().manual_seed(seed))


def actions(rows: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, 29, generator=torch.Generator().manual_seed(seed))


def request(table=None, domain="agibotworld", **options):
    return dict(action=ActionRequest(mode="forward_dynamics", image=first_image(), actions=table, domain=domain),
                width=W, height=H, seed=7, **options)


def batch(pipe, table, **options):
    return pipe.generate("the robot folds a towel", **request(table, **options))


def session(pipe, **options):
    return pipe.session("the robot folds a towel", **request(**options))


def test_the_checkpoint_is_read_as_sim_bimanual_with_its_contract(pipe):
    c = pipe.variant.causal
    assert c.takes_actions and (c.chunk_size, c.window_frames, c.sink_frames) == (4, WINDOW, 0)
    assert [(e.name, e.domain_id, e.width) for e in c.embodiments] == [("agibotworld", 15, 29), ("camera_pose", 2, 9)]
    assert c.default_embodiment == "agibotworld" and c.action_width == 64 and c.text_max_tokens == 512


def test_the_normalizer_against_hand_values():
    e = causal.Embodiment("agibotworld", 15, 3, (1.0, -2.0, 0.5), (2.0, 0.5, 4.0))
    got = e.normalize(torch.tensor([[3.0, -1.0, 0.5], [1.0, -2.0, 4.5]]), 6)
    assert torch.equal(got, torch.tensor([[1.0, 2.0, 0.0, 0, 0, 0], [0.0, 0.0, 1.0, 0, 0, 0]]))
    asinh = causal.Embodiment("camera_pose", 2, 1, (0.0,), (1.0,), "asinh")
    assert asinh.normalize(torch.tensor([[1.0]]), 1).item() == pytest.approx(1.0)
    with pytest.raises(InputError, match="NaN or infinite values \\(row 1\\)"):
        e.normalize(torch.tensor([[0.0, 0, 0], [0, float("nan"), 0]]), 6)
    with pytest.raises(InputError, match="must be \\[n, 3\\]"):
        e.normalize(torch.zeros(4, 29), 6)


def test_legacy_cosmos_dreams_metadata_for_actions_is_refused_by_name():
    raw = {"cosmos_dreams": sim_bimanual_block(), "action_gen": True}
    with pytest.raises(CheckpointError, match="legacy Cosmos-Dreams metadata .*re-export"):
        causal.read_config(raw, "Cosmos3NanoSimBimanualPipeline", "config.json")


@pytest.mark.slow  # (ticks = batch, by default, runs a batch too)
def test_a_batch_run_makes_one_frame_and_one_per_action(pipe):
    out = batch(pipe, actions(32))
    assert out.frames.shape == (33, H, W, 3) and out.latents.shape[2] == 9
    assert out.settings.steps == 2 and out.settings.sigmas == (1.0, 0.8333333333333334)  # "step42"
    full = batch(pipe, actions(32), steps=4)
    assert full.settings.sigmas == tuple(pipe.variant.causal.t_list) and not torch.equal(full.frames, out.frames)


def test_ticks_give_exactly_the_frames_of_one_batch_run_with_eviction(pipe):
    table = actions(48)  # 13 latent frames: past the 6-frame window from the second tick
    whole = batch(pipe, table).frames
    with session(pipe) as s:
        ticks = [s.tick(table[16 * k : 16 * (k + 1)]) for k in range(3)]
    assert [t.shape[0] for t in ticks] == [17, 16, 16]
    assert torch.equal(torch.cat(ticks), whole)


@pytest.mark.slow  # two sessions of ticks
def test_later_actions_never_change_earlier_frames(pipe):
    table = actions(48)
    changed = table.clone()
    changed[32:] = actions(16, seed=9)
    a, b = batch(pipe, table).frames, batch(pipe, changed).frames
    assert torch.equal(a[:33], b[:33]) and not torch.equal(a[33:], b[33:])


def test_frame_zero_null_actions_have_zero_values_and_real_keys(pipe):
    with session(pipe) as s:
        s.tick(actions(16))
        cache, tokens = s.run.history.cache, s.run.tokens
        # the first rows held are frame 0's: its video tokens, then its four null action tokens
        null = slice(tokens, tokens + causal.ACTION_TOKENS)
        assert cache.frames[: tokens + 4].eq(0).all()
        assert cache.values[:, null].eq(0).all() and cache.keys[:, null].abs().amin() > 0
        later = slice(cache.frames.tolist().index(1) + tokens, cache.frames.tolist().index(1) + tokens + 4)
        assert cache.values[:, later].abs().amax() > 0  # frame 1's real actions keep their values


def test_each_frames_last_action_token_sits_at_the_frames_own_time(pipe, monkeypatch):
    """Action token j of latent frame f at offset + ((f-1)*4 + 1 + j) * base_fps / (4 fps), frame 0's null tokens at
    frame 0's time, vision tokens at offset + f * base_fps / fps (vLLM-Omni's interleaved positions)."""
    seen = []
    model = pipe.transformer
    rope = model.rope
    monkeypatch.setattr(model, "rope", lambda positions, dtype: (seen.append(positions[0].clone()), rope(positions, dtype))[1])
    with session(pipe, fps=15.0) as s:
        s.tick(actions(16))
        tokens = s.run.tokens
    ids = pipe.planner.prepare("the robot folds a towel", cosmos3_runtime.Request.build(**request(actions(16))))[1]
    offset, stride = len(ids) + 15000, 24.0 / 15.0
    seen = [p for p in seen if p.min() >= 15000]  # the media forwards' (the text tower's start at 0)
    commit0 = seen[0]  # frame 0: its video tokens, then four null action tokens
    assert torch.allclose(commit0, torch.full_like(commit0, offset))
    chunk = seen[1]  # the first denoising forward: frames 1..4, then actions rows 0..15
    video, acts = chunk[: 4 * tokens].view(4, tokens)[:, 0], chunk[4 * tokens :]
    assert torch.allclose(video, offset + torch.arange(1, 5) * stride)
    assert torch.allclose(acts, offset + torch.arange(1, 17) * stride / 4)
    assert torch.allclose(acts[3::4], video)


@pytest.mark.slow  # three windows of ticks
def test_memory_stays_flat_over_three_windows_of_ticks(pipe):
    with session(pipe) as s:
        rows, kept = s.run.history.cache.keys.shape, []
        for k in range(1 + 3 * math.ceil(WINDOW / 4)):
            s.tick(actions(16, seed=k))
            kept.append((s.run.history.cache.held, s.run.conditioner.rows.shape[0], s.run.latents.shape[2]))
        assert s.run.history.cache.keys.shape == rows  # allocated once, at open
        per_frame = s.run.tokens + causal.ACTION_TOKENS
    held = [h for h, _, _ in kept]
    assert max(held) <= (WINDOW + 4) * per_frame and held[-1] == held[-2]  # the window, then the tick's 4 frames
    assert {a for _, a, _ in kept[1:]} == {16} and {t for _, _, t in kept[1:]} == {4}


@pytest.mark.slow
def test_a_reset_starts_again_from_the_first_image(pipe):
    with session(pipe) as s:
        first = s.tick(actions(16))
        s.tick(actions(16, seed=2))
        s.reset()
        assert s.chunk_index == 0 and torch.equal(s.tick(actions(16)), first)


def test_the_chunk_boundary_falls_between_action_rows_15_and_16(pipe):
    """Rows [(f-1)*4, f*4) condition latent frame f: row 15 (frame 4) belongs to the first chunk (frames 1-4), row
    16 (frame 5) to the second; a mapping shifted by a frame would move one of them across the boundary."""
    table = actions(32)
    base = batch(pipe, table).latents

    def changed(row):
        other = table.clone()
        other[row] += 1.0
        return batch(pipe, other).latents

    last, first = changed(15), changed(16)
    assert not torch.equal(last[:, :, 1:5], base[:, :, 1:5]) and torch.equal(last[:, :, 0], base[:, :, 0])
    assert torch.equal(first[:, :, :5], base[:, :, :5]) and not torch.equal(first[:, :, 5:], base[:, :, 5:])


def test_a_camera_pose_session_takes_nine_values_a_row(pipe):
    with session(pipe, domain="camera_pose") as s:
        assert s.tick(torch.zeros(16, 9)).shape[0] == 17 and s.tick(torch.zeros(16, 9)).shape[0] == 16


@pytest.mark.slow  # two sessions of ticks
def test_bad_actions_mid_session_leave_it_where_it_was(pipe):
    table = actions(48)
    whole = batch(pipe, table).frames
    with session(pipe) as s:
        got = [s.tick(table[:16]), s.tick(table[16:32])]
        bad = table[32:].clone()
        bad[0, 0] = float("inf")
        with pytest.raises(InputError, match="NaN or infinite"):
            s.tick(bad)
        assert s.chunk_index == 2
        got.append(s.tick(table[32:]))
    assert torch.equal(torch.cat(got), whole)


def test_a_failed_tick_loses_the_history_and_the_next_starts_again(pipe):
    def cancel(*_):
        raise KeyboardInterrupt

    with session(pipe) as s:
        first = s.tick(actions(16))
        with pytest.raises(KeyboardInterrupt):
            s.tick(actions(16, seed=2), callback=cancel)
        assert s.run is None and s.lost  # freed at once, not rebuilt while the error holds the old history
        assert torch.equal(s.tick(actions(16)), first) and s.chunk_index == 1


def test_ticks_are_refused_by_name(pipe):
    with session(pipe) as s:
        with pytest.raises(InputError, match="a tick takes 16 actions of 29 values"):
            s.tick(torch.zeros(16, 9))
        bad = actions(16)
        bad[3, 4] = float("nan")
        with pytest.raises(InputError, match="NaN"):
            s.tick(bad)
        with pytest.raises(InputError, match="a tick takes actions only: the first image belongs to the session"):
            s.tick(actions(16), image=first_image(1))  # (HTTP: only the opening tick carries one)
        assert s.chunk_index == 0
    with pytest.raises(InputError, match="this session is closed"):
        s.tick(actions(16))
    with pytest.raises(InputError, match="this session is closed"):
        s.reset()  # (it reopened the closed session)
    with pytest.raises(InputError, match="this session is closed"):
        s.tick(actions(16))


@pytest.mark.parametrize("options, message", [
    (dict(domain="droid_lerobot"), "takes actions for agibotworld \\(29 values\\), camera_pose \\(9 values\\); domain 'droid_lerobot'"),
    (dict(table=torch.zeros(18, 29)), "N a multiple of 4"),
    (dict(steps=3), "distilled to 2 or 4 steps"),
    (dict(guidance_scale=3.0), "guidance_scale 3 cannot apply"),
    (dict(causal_cache="recompute"), "Sim-Bimanual runs 'kv'"),
    (dict(num_frames=49), "num_frames 49 needs 48 actions"),
    (dict(table=None, num_frames=17), "a session has no length"),
])
def test_batch_requests_are_refused_by_name(pipe, options, message):
    table = options.pop("table") if "table" in options else actions(16)
    with pytest.raises(InputError, match=message):
        pipe.plan("a robot", **request(table, **options))


def test_other_inputs_are_refused_by_name(pipe):
    with pytest.raises(InputError, match="first image and actions"):
        pipe.plan("a robot", width=W, height=H)
    with pytest.raises(InputError, match="rolls actions out from a first image: action mode 'policy'"):
        pipe.plan("a robot", action=ActionRequest(mode="policy", image=first_image(), domain="agibotworld"))


def test_a_session_that_would_not_fit_is_refused_at_open(pipe, monkeypatch):
    def refuse(estimate, device, output_only=False):
        raise InputError(f"needs {estimate.total / 2**20:.0f} MiB")

    monkeypatch.setattr(budget, "check", refuse)
    with pytest.raises(InputError, match="needs"):
        session(pipe)


def test_sessions_need_a_sim_bimanual_checkpoint(tiny_factory):
    pipe = cosmos3_runtime.load(tiny_factory(kind="gated"), dtype="fp32")
    with pytest.raises(InputError, match="sessions drive a causal checkpoint"):
        pipe.session("a robot", **request())


def test_a_session_takes_its_actions_a_tick_at_a_time(pipe):
    with pytest.raises(InputError, match="leave the action request's actions unset"):
        pipe.session("a robot", **request(actions(16)))
    with pytest.raises(InputError, match=r"needs the actions to roll out, a table \[N, 29\] for agibotworld .* "
                                          r"open a session \(pipe.session in Python"):
        pipe.generate("a robot", **request())


def host_blocks(pipe, table, seed: int) -> causal_run.HostBlocks:
    plan = pipe.plan("a robot", **{**request(table), "seed": seed})
    return causal_run.HostBlocks(causal_run.CausalRun(pipe.parts, plan.settings, plan.request, plan.cond_ids,
                                                      plan.uncond_ids, None))


def test_sim_bimanual_on_the_host_sampler_equals_the_pack_rollout_with_its_seed_formula(pipe):
    """ComfyUI's SamplerARVideo (its stand-in): latent frame 0 the image given at sigma 0, then blocks of 4 counted
    from 0, the window evicting; the pack's batch run with causal_seeds "comfyui" is the same video."""
    table, seed = actions(48), 5  # 1 + 12 latent frames: three blocks, the window of 6 evicts
    blocks = host_blocks(pipe, table, seed)
    sigmas = pipe.denoiser.schedule_for(blocks.run.s).sigmas
    noise = torch.randn(blocks.run.latents.shape, generator=torch.manual_seed(seed))  # ComfyUI's prepare_noise
    got = sample_ar_video(blocks, sigmas[0] * noise, sigmas, seed, 4, initial_latent=blocks.run.conditioner.opening)
    expected = pipe.generate("a robot", **{**request(table, causal_seeds="comfyui"), "seed": seed}).latents
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    other = pipe.generate("a robot", **{**request(table), "seed": seed}).latents  # SGLang's seeds: another video
    assert (other[:, :, 1:] - expected[:, :, 1:]).abs().max() > 0.1


def test_what_the_host_sampler_cannot_drive_on_sim_bimanual_is_refused_by_name(pipe):
    blocks = host_blocks(pipe, actions(16), 1)
    sigmas, x = pipe.denoiser.schedule_for(blocks.run.s).sigmas, torch.randn(blocks.run.latents.shape)
    with pytest.raises(InputError, match="rolls out from its first image.*Cosmos3 Sim Actions \\(core\\)"):
        sample_ar_video(blocks, x, sigmas, 1, 4)  # no initial latent: the first block would be frames [0, 4)
    with pytest.raises(InputError, match="set num_frame_per_block to 4"):
        opening = blocks.run.conditioner.opening
        sample_ar_video(host_blocks(pipe, actions(16), 1), x, sigmas, 1, 2, initial_latent=opening)


def test_the_block_round_trips_through_the_checkpoint_files(tmp_path):
    root = make_tiny_checkpoint(tmp_path / "c", kind="gated", distilled=True, action=True, reasoner=False,
                                causal=sim_bimanual_block())
    assert json.loads((root / "model_index.json").read_text())["_class_name"] == "Cosmos3NanoSimBimanualPipeline"
    c = planner(root).variant.causal
    assert c.window_frames == 96 and c.embodiment("camera_pose").domain_id == 2


@pytest.mark.slow  # two sessions of ticks (a guarded run's checks run by default in test_guardrails.py)
def test_a_guarded_session_checks_its_prompt_at_open_and_filters_every_tick(pipe):
    from cosmos3_runtime.guardrails import Check, GuardrailBlocked, Guardrails

    def grey(frames):
        frames[:, :8, :8] = 128
        return frames

    guard = Guardrails([Check("keyword blocklist", lambda prompt: "towel" not in prompt)], face_filter=grey)
    with pytest.raises(GuardrailBlocked, match="keyword blocklist"):
        pipe.session("the robot folds a towel", guardrails=guard, **request())
    guard = Guardrails([], face_filter=grey)
    with session(pipe) as plain, pipe.session("the robot folds a towel", guardrails=guard, **request()) as guarded:
        for seed in (1, 2):
            ours, theirs = guarded.tick(actions(16, seed)), plain.tick(actions(16, seed))
            assert torch.equal(ours[:, 8:], theirs[:, 8:]) and (ours[:, :8, :8] - 128 / 255).abs().max() <= 0.5 / 255


# --- Sim-Transfer ---------------------------------------------------------------------------------------------------

CAPTION = "a red ball rolls across a stone floor"


@pytest.fixture(scope="module")
def framewise(tiny_factory):
    """One latent frame (4 frames) a chunk, a window of 4 latent frames with 1 sink: a 17-frame episode evicts."""
    causal = sim_transfer_block(1, window_frames=4, sink_frames=1)
    return cosmos3_runtime.load(tiny_factory(kind="gated", dtype="float32", distilled=True, reasoner=False,
                                             causal=causal), dtype="fp32")


def controls(frames: int, seed: int = 0) -> torch.Tensor:
    return (torch.rand(frames, H, W, 3, generator=torch.Generator().manual_seed(seed)) * 255).to(torch.uint8)


def transfer_batch(pipe, clip, prompt=CAPTION, seed=5, **options):
    return pipe.generate(prompt, control_videos={"edge": clip}, width=W, height=H, seed=seed, **options).frames


def episode(pipe, frames=17, prompt=CAPTION, seed=5, **options):
    return pipe.session(prompt, control="edge", num_frames=frames, width=W, height=H, seed=seed, **options)


def play(s, clip) -> torch.Tensor:
    """The control clip as a camera sends it: its first frame, then the session's updates."""
    return torch.cat([s.tick(clip[:1])] + [s.tick(clip[i : i + s.update]) for i in range(1, len(clip), s.update)])


def test_an_episode_tick_by_tick_is_the_batch_rollout_bit_for_bit_with_eviction(framewise):
    clip = controls(17)  # 5 latent frames: past the 4-frame window
    with episode(framewise) as s:
        assert isinstance(s, TransferSession) and s.update == 4
        got = play(s, clip)
    assert torch.equal(got, transfer_batch(framewise, clip))


def test_a_reset_starts_the_next_episode_with_its_prompt_and_seed_and_a_short_one_is_the_batchs_start(framewise):
    first, second = controls(17), controls(17, seed=1)
    with episode(framewise) as s:
        play(s, first[:9])  # reset before its budget: the first 9 frames of the batch over the budget
        assert torch.equal(torch.cat([s.tick(first[9:13]), s.tick(first[13:17])]),
                           transfer_batch(framewise, first)[9:17])
        s.reset("a blue cube slides over sand", seed=8)
        got = torch.cat([s.tick(second[:1]), s.tick(second[1:5])])
        s.reset()  # the same prompt and seed again
        again = torch.cat([s.tick(second[:1]), s.tick(second[1:5])])
    expected = transfer_batch(framewise, second, "a blue cube slides over sand", seed=8)[:5]
    assert torch.equal(got, expected) and torch.equal(again, expected)


def test_the_episodes_prompt_states_its_budget_as_the_batch_of_that_many_frames_does(framewise):
    batch = framewise.plan(CAPTION, control_videos={"edge": controls(17)}, width=W, height=H, seed=5)
    with episode(framewise) as long, episode(framewise, frames=9) as short:
        assert long.plan.cond_ids == batch.cond_ids and short.plan.cond_ids != batch.cond_ids


def test_memory_stays_flat_over_episodes_of_ticks(framewise):
    """The history is allocated once at open; the control latents, the latents and the encoder's and decoder's states
    stay those of one tick whatever the episode's length (each tick's control latents dropped once run)."""
    with episode(framewise, frames=41) as s:
        rows, held = s.run.history.cache.keys.shape, []
        for k in range(13):
            play(s, controls(41, seed=k))
            held.append((s.run.history.cache.held, s.run.conditioner.latents.shape[2], s.run.latents.shape[2]))
            assert s.run.history.cache.keys.shape == rows
            s.reset(seed=k)
    assert len(set(held)) == 1 and held[0][1:] == (1, 1)


def test_a_failed_tick_starts_the_episode_again(framewise):
    def cancel(*_):
        raise KeyboardInterrupt

    clip = controls(9)
    with episode(framewise, frames=9) as s:
        first = s.tick(clip[:1])
        with pytest.raises(KeyboardInterrupt):
            s.tick(clip[1:5], callback=cancel)
        assert s.run is None and s.lost
        with pytest.raises(InputError, match="this tick takes 1 control frame \\(an episode's first tick 1"):
            s.tick(clip[1:5])  # the episode starts again: its first frame
        assert torch.equal(s.tick(clip[:1]), first)


def test_ticks_are_refused_by_name_and_leave_the_episode_where_it_was(framewise):
    clip = controls(9)
    with episode(framewise, frames=9) as s:
        with pytest.raises(InputError, match="this tick takes 1 control frame"):
            s.tick(clip[:4])
        s.tick(clip[:1])
        with pytest.raises(InputError, match="this tick takes 4 control frames"):
            s.tick(clip[1:2])
        with pytest.raises(InputError, match="floats in 0..1"):
            s.tick(torch.full((4, H, W, 3), 2.0))
        s.tick(clip[1:5])
        s.tick(clip[5:9])
        with pytest.raises(InputError, match="made all 9 frames of its budget: reset"):
            s.tick(clip[5:9])
        assert s.chunk_index == 3 and s.frames == 9
    with pytest.raises(InputError, match="this session is closed"):
        s.tick(clip[:1])
    with pytest.raises(InputError, match="this session is closed"):
        s.reset("another prompt")


@pytest.mark.parametrize("options, message", [
    (dict(), "name their hint as control"),
    (dict(control="edge", control_videos={"edge": controls(9)}), "leave control_videos unset"),
    (dict(control="edge", num_frames=None), "needs num_frames: its episode's frame budget"),
    (dict(control="edge", num_frames=10), "10 frames is not whole chunks of 1 latent frames: give 9"),
    (dict(control="edge", causal_cache="recompute"), "leave causal_cache unset"),
    (dict(control="wsm"), "one of edge, blur, depth, seg"),
])
def test_episodes_are_refused_at_open_by_name(framewise, options, message):
    options = {"num_frames": 9, "width": W, "height": H, **options}
    with pytest.raises(InputError, match=message):
        framewise.session(CAPTION, **options)


def test_a_sim_bimanual_session_takes_no_control(pipe):
    with pytest.raises(InputError, match="control names a Sim-Transfer session's controls"):
        session(pipe, control="edge")


def test_a_chunkwise_episode_takes_16_control_frames_a_tick(tmp_path):
    root = make_tiny_checkpoint(tmp_path / "chunkwise", kind="gated", dtype="float32", distilled=True, reasoner=False,
                                causal=sim_transfer_block())
    pipe = cosmos3_runtime.load(root, dtype="fp32")
    clip = controls(33)
    with episode(pipe, frames=33) as s:
        assert s.update == 16
        got = play(s, clip)
    assert torch.equal(got, transfer_batch(pipe, clip))
