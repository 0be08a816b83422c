"""Wan 2.2 VAE against diffusers' AutoencoderKLWan on tiny random VAEs (fp32), tiling, and errors."""

import json
import shutil

import pytest
from conftest import require
import torch

import cosmos3_runtime
from cosmos3_runtime import CheckpointError, InputError
from cosmos3_runtime.tiny import vae_config
from cosmos3_runtime.vae import TileSpec, VAEConfig, WanVAE

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
