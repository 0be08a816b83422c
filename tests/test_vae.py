"""Wan 2.2 VAE against diffusers' AutoencoderKLWan on tiny random VAEs (fp32), tiling, and errors."""

import json
import shutil

import pytest
from conftest import require
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import cosmos3_runtime
from cosmos3_runtime import CheckpointError, InputError
from cosmos3_runtime.tiny import vae_config
from cosmos3_runtime.vae import CausalConv3d, DupUp, RMSNorm, Stream, TileSpec, Upsample, VAEConfig, WanVAE

diffusers = require("diffusers", minversion="0.42.1")
from diffusers import AutoencoderKLWan  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def vaes(tiny_gated):
    ours = cosmos3_runtime.load(tiny_gated, dtype=torch.float32).vae
    theirs, info = AutoencoderKLWan.from_pretrained(
        str(tiny_gated / "vae"), torch_dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    return ours, theirs.eval()


def pixels(frames, height, width, seed=0):
    return torch.rand(1, 3, frames, height, width, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.parametrize("frames", [1, 5, 9])
def test_encode_matches_diffusers(vaes, frames):
    ours, theirs = vaes
    x = pixels(frames, 48, 80)
    with torch.no_grad():
        expected = theirs.encode(x).latent_dist.mode()
    got = ours.encode(x)
    assert got.shape == expected.shape == (1, 48, 1 + (frames - 1) // 4, 3, 5)
    assert expected.abs().max() > 0.05
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("latent_frames", [1, 2, 3])
def test_decode_matches_diffusers(vaes, latent_frames):
    ours, theirs = vaes
    z = torch.randn(1, 48, latent_frames, 3, 5, generator=torch.Generator().manual_seed(latent_frames))
    with torch.no_grad():
        expected = theirs.decode(z).sample
    got = ours.decode(z)
    assert got.shape == expected.shape == (1, 3, 1 + 4 * (latent_frames - 1), 48, 80)
    assert (got.abs() < 1).float().mean() > 0.9  # mostly unclamped values, so the comparison means something
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


def test_leftover_frames_are_dropped_like_diffusers(vaes):
    ours, theirs = vaes
    x = pixels(7, 32, 32, seed=5)
    with torch.no_grad():
        expected = theirs.encode(x).latent_dist.mode()
    torch.testing.assert_close(ours.encode(x), expected, atol=TOL, rtol=0)


def test_normalization_matches_the_pipeline(vaes):
    """(z - mean) * (1/std) and its inverse as diffusers' pipeline computes them in fp32; a bf16 VAE applies its
    statistics in fp32 too (diffusers: in bf16), so its conditioning latents carry one rounding fewer."""
    ours, theirs = vaes
    raw = torch.randn(1, 48, 2, 3, 4)
    mean = torch.tensor(theirs.config.latents_mean).view(1, -1, 1, 1, 1)
    inv_std = (1.0 / torch.tensor(theirs.config.latents_std)).view(1, -1, 1, 1, 1)
    assert torch.equal(ours.normalize(raw), (raw - mean) * inv_std)
    assert torch.equal(ours.denormalize(raw), raw / inv_std + mean)
    vae = ours.to(torch.bfloat16)
    try:
        low = raw.to(torch.bfloat16)
        assert vae.normalize(low).dtype == torch.float32
        assert torch.equal(vae.normalize(low), (low.float() - mean) * inv_std)
        assert torch.equal(vae.denormalize(low), low.float() / inv_std + mean)
    finally:
        ours.to(torch.float32)


def test_a_second_call_is_not_affected_by_the_first(vaes):
    """Temporal caches live per call: decoding twice gives identical results."""
    ours, _ = vaes
    z = torch.randn(1, 48, 2, 3, 3, generator=torch.Generator().manual_seed(9))
    assert torch.equal(ours.decode(z), ours.decode(z))


@pytest.mark.slow
def test_tiled_decode_is_no_further_from_untiled_than_diffusers_tiling(vaes):
    """Random weights see the whole frame, so any tiling changes the output; ours must change it no more
    than diffusers' tiled decode with the same tile geometry, and less with larger tiles."""
    ours, theirs = vaes
    z = torch.randn(1, 48, 2, 12, 16, generator=torch.Generator().manual_seed(3))
    full = ours.decode(z)
    errors = []
    for size, overlap in [(6, 2), (10, 4)]:
        tiled = ours.decode(z, tile=TileSpec(size=size, overlap=overlap))
        px, stride = size * 16, (size - overlap) * 16
        theirs.enable_tiling(px, px, stride, stride)
        try:
            with torch.no_grad():
                reference = theirs.decode(z).sample
        finally:
            theirs.disable_tiling()
        ours_error, their_error = (tiled - full).abs().mean(), (reference - full).abs().mean()
        assert tiled.shape == full.shape and 0 < ours_error <= their_error
        errors.append(ours_error)
    assert errors[1] < errors[0]


@pytest.mark.slow
def test_tiled_encode_is_no_further_from_untiled_than_diffusers_tiling(vaes):
    ours, theirs = vaes
    x = pixels(5, 160, 224, seed=4)
    full = ours.encode(x)
    tiled = ours.encode(x, tile=TileSpec(size=6, overlap=2))
    theirs.enable_tiling(48, 48, 32, 32)  # diffusers tiles the 2x2-patchified frame: this is 96-px tiles, 64-px stride
    try:
        with torch.no_grad():
            reference = theirs.encode(x).latent_dist.mode()
    finally:
        theirs.disable_tiling()
    assert tiled.shape == full.shape
    assert 0 < (tiled - full).abs().mean() <= (reference - full).abs().mean()


def test_one_tile_covering_everything_is_exact(vaes):
    ours, _ = vaes
    z = torch.randn(1, 48, 2, 3, 5)
    assert torch.equal(ours.decode(z, tile=TileSpec(size=8, overlap=2)), ours.decode(z))


def test_release_structure_has_the_documented_tensors():
    """The release config (base 160 / decoder 256) builds the 196 tensors of diffusers' layout."""
    config = vae_config()
    config.update(base_dim=160, decoder_base_dim=256)
    with torch.device("meta"):
        ours = WanVAE(VAEConfig.from_dict(config)).state_dict()
        theirs = AutoencoderKLWan(**{k: v for k, v in config.items() if not k.startswith("_")}).state_dict()
    assert len(ours) == 196
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}


# --- the decode's re-arrangements, bit for bit -----------------------------------------------------
# A decode moves its activations as few times as it can (see CausalConv3d, RMSNorm, Upsample, DupUp); each step below
# must give exactly what the plain composition of torch ops gives, in fp32 and bf16.

DTYPES = [torch.float32, torch.bfloat16]


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def time_major(x):
    """x laid out frame after frame, as an up block's output is (its shape unchanged)."""
    return x.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_streamed_causal_conv_equals_the_conv_over_each_concatenated_padded_window(dtype):
    """Chunks of 1, 4, 2 and 4 frames through a stream whose scratch buffer starts as NaN and is used in between by a
    convolution of another shape: each chunk's output equals the convolution of its explicitly built window (the last
    two frames seen, zeros before the first, concatenated with the chunk and zero-padded in space)."""
    conv = CausalConv3d(6, 5, 3, padding=1).to(dtype)
    other = CausalConv3d(3, 4, 3, padding=1).to(dtype)
    stream = Stream()
    stream.scratch((1, 6, 12, 11, 13), conv.weight).fill_(float("nan"))
    seen = torch.zeros(1, 6, 2, 7, 9, dtype=dtype)
    for i, frames in enumerate([1, 4, 2, 4]):
        chunk = randn(1, 6, frames, 7, 9, seed=i, dtype=dtype)
        window = F.pad(torch.cat([seen[:, :, -2:], chunk], dim=2), (1, 1, 1, 1))
        expected = F.conv3d(window, conv.weight, conv.bias)
        assert torch.equal(conv(chunk, stream), expected)
        other(randn(1, 3, 3, 4, 5, seed=10 + i, dtype=dtype), stream)
        seen = torch.cat([seen, chunk], dim=2)
    assert torch.equal(conv(chunk), F.conv3d(F.pad(chunk, (1, 1, 1, 1, 2, 0)), conv.weight, conv.bias))  # unstreamed


def test_the_causal_cache_is_updated_in_place_and_is_all_a_decode_stream_keeps():
    """Decoding on adds no cache tensors and replaces none (each causal layer's remembered frames stay where they
    are), and between calls a decode stream holds those frames and nothing else (counted on the virtual device)."""
    from virtual_device import VirtualDevice

    config = VAEConfig.from_dict(vae_config())
    with torch.device("meta"):
        vae = WanVAE(config)
    z = torch.empty(1, 48, 3, 2, 3, device="meta")
    with torch.inference_mode(), VirtualDevice() as virtual:
        decode = vae.decode_stream()
        first = decode(z[:, :, :2])
        before = {layer: state for layer, state in decode.stream.state.items() if torch.is_tensor(state)}
        second = decode(z[:, :, 2:])
        after = {layer: state for layer, state in decode.stream.state.items() if torch.is_tensor(state)}
        assert after.keys() == before.keys() and all(after[layer] is before[layer] for layer in after)
        held = sum(state.untyped_storage().nbytes() for state in after.values())
        assert virtual.allocated == held + first.untyped_storage().nbytes() + second.untyped_storage().nbytes()


@pytest.mark.parametrize("pieces", [(1, 4, 4, 8), (5, 12)])
def test_an_encode_stream_fed_in_pieces_is_the_whole_clips_encode_bit_for_bit(vaes, pieces):
    """A session's controls come a tick at a time: its first frame (or 1 + 4k), then 4k frames a call."""
    ours, _ = vaes
    x, stream, start, got = pixels(17, 48, 80, seed=3), ours.encode_stream(), 0, []
    for count in pieces:
        got.append(stream(x[:, :, start : start + count]))
        start += count
    assert torch.equal(torch.cat(got, dim=2), ours.encode(x))


@pytest.mark.parametrize("first, later", [(4, None), (1, 3), (1, 0)])
def test_an_encode_stream_refuses_pieces_that_split_a_latent_frame(vaes, first, later):
    stream = vaes[0].encode_stream()
    with pytest.raises(InputError, match="a streamed encode takes one clip's first frame \\(or 1 \\+ 4k frames\\)"):
        stream(pixels(first, 48, 80))
        stream(pixels(later, 48, 80))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", [lambda x: x, time_major], ids=["contiguous", "time-major"])
def test_norm_and_silu_round_as_the_plain_composition(dtype, layout):
    """RMSNorm's in-place steps equal the composition they replace, rounding for rounding, with and without SiLU, on
    both layouts a decode feeds them (an odd element count, so a CPU kernel's scalar tail is exercised)."""
    norm = RMSNorm(37).to(dtype)
    with torch.no_grad():
        norm.gamma.copy_(1 + 0.3 * randn(37, 1, 1, 1, seed=1))
    x = layout(randn(1, 37, 3, 11, 13, seed=2, dtype=dtype) * 3)
    with torch.no_grad():
        normalized = (F.normalize(x.float(), dim=1) * norm.scale * norm.gamma.float()).to(dtype)
        assert torch.equal(norm(x), normalized)
        assert torch.equal(norm(x, silu=True), F.silu(normalized))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_temporal_upsample_equals_its_plain_steps(dtype):
    """Upsample over a first chunk of one frame, then chunks of 1 and 2 frames: the causal time convolution over the
    concatenated window, the (earlier, later) pairs interleaved with torch.stack, nearest-exact in fp32 rounded back,
    then the 3x3 convolution, frame by frame."""
    up = Upsample(4, temporal=True).to(dtype)
    upsample, conv = up.resample
    stream, seen = Stream(), torch.zeros(1, 4, 2, 5, 6, dtype=dtype)

    def per_frame(x):
        b, c, t, h, w = x.shape
        images = x.transpose(1, 2).reshape(b * t, c, h, w)
        out = conv(F.interpolate(images.float(), scale_factor=2.0, mode="nearest-exact").to(dtype))
        return out.view(b, t, *out.shape[1:]).transpose(1, 2)

    with torch.no_grad():
        for i, frames in enumerate([1, 1, 2]):
            x = randn(1, 4, frames, 5, 6, seed=i, dtype=dtype)
            if i == 0:
                expected = per_frame(x)
            else:
                pairs = F.conv3d(torch.cat([seen[:, :, -2:], x], dim=2), up.time_conv.weight, up.time_conv.bias)
                pairs = pairs.view(1, 2, 4, frames, 5, 6)
                expected = per_frame(torch.stack([pairs[:, 0], pairs[:, 1]], dim=3).reshape(1, 4, 2 * frames, 5, 6))
                seen = torch.cat([seen, x], dim=2)
            assert torch.equal(up(x, stream), expected)


# (in, out channels, time factor, a view of the input): Wan 2.2's decoder blocks are the first three
@pytest.mark.parametrize("cin, cout, ft, view", [(8, 8, 2, True), (8, 4, 2, True), (8, 4, 1, True), (4, 8, 2, False),
                                                 (8, 3, 2, False)])
@pytest.mark.parametrize("first_chunk", [False, True])
def test_the_dup_up_shortcut_adds_what_repeat_and_unfold_give(cin, cout, ft, view, first_chunk):
    """The shortcut seen as blocks and added in place equals the repeated, unfolded copy added out of place; where the
    repeats line up with the block offsets it is a view of the input (nothing copied)."""
    shortcut = DupUp(cin, cout, ft, 2)
    t = 1 if first_chunk else 3
    x = randn(1, cin, t, 3, 4, seed=cin + cout + ft)
    out = randn(1, cout, (1 if first_chunk else ft * t), 6, 8, seed=1)
    r = cout * ft * 4 // cin
    unfolded = x.repeat_interleave(r, dim=1).view(1, cout, ft, 2, 2, t, 3, 4).permute(0, 1, 5, 2, 6, 3, 7, 4)
    unfolded = unfolded.reshape(1, cout, t * ft, 6, 8)
    expected = out + (unfolded[:, :, ft - 1 :] if first_chunk else unfolded)
    blocks = shortcut(x, first_chunk)
    out.view(blocks.shape).add_(blocks)
    assert torch.equal(out, expected)
    assert (blocks.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()) == view


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_decode_concatenates_pads_clones_and_casts_nothing_per_latent_frame(dtype):
    """One more latent frame adds no concatenation, padding, clone, stack, repeat or dtype cast to a decode (counted
    op by op on the meta device): its causal windows are built in place and it upsamples in the compute dtype."""
    config = VAEConfig.from_dict(vae_config())
    with torch.device("meta"):
        vae = WanVAE(config).to(dtype)
    counts = []
    for frames in (2, 3):
        with torch.inference_mode(), Ops() as ops:
            vae.decode(torch.empty(1, 48, frames, 2, 3, device="meta"))
        counts.append({name: ops.names.count(name) for name in set(ops.names)})
    extra = {name: counts[1].get(name, 0) - counts[0].get(name, 0) for name in counts[1]}
    moved = ["cat", "pad", "constant_pad_nd", "clone", "stack", "repeat_interleave", "to", "_to_copy", "contiguous"]
    assert {name: extra[name] for name in moved if extra.get(name)} == {}
    assert extra["conv3d"] > 0  # the frame was decoded


# --- errors --------------------------------------------------------------------------------------


def test_size_not_multiple_of_16(vaes):
    ours, _ = vaes
    with pytest.raises(InputError, match=r"frame size 72x40 .* not a multiple of 16"):
        ours.encode(pixels(1, 40, 72))


def test_wrong_latent_channels(vaes):
    ours, _ = vaes
    with pytest.raises(InputError, match=r"expects latents \[B, 48, T, h, w\]"):
        ours.decode(torch.zeros(1, 16, 1, 4, 4))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"is_residual": False}, "not the Wan 2.2 layout"),
        ({"attn_scales": [0.5]}, "attn_scales must be empty"),
        ({"latents_std": [1.0] * 16}, "latents_mean and latents_std need z_dim = 48"),
        ({"scale_factor_spatial": 8}, "scale factors 8/4 do not match"),
    ],
)
def test_configs_that_are_not_wan22(tiny_gated, tmp_path, change, message):
    root = shutil.copytree(tiny_gated, tmp_path / "ckpt")
    config = json.loads((root / "vae" / "config.json").read_text())
    (root / "vae" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=rf"vae/config.json: .*{message}"):
        cosmos3_runtime.load(root)


def test_missing_vae_weights(tiny_gated, tmp_path):
    root = shutil.copytree(tiny_gated, tmp_path / "ckpt")
    (root / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"vae has neither diffusion_pytorch_model.safetensors"):
        cosmos3_runtime.load(root)
    assert cosmos3_runtime.load(root, load_vae_weights=False).vae is None


def test_bad_tile_spec():
    with pytest.raises(InputError, match="overlap 8 must be .* smaller than the tile size 8"):
        TileSpec(size=8, overlap=8)
