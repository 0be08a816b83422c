"""The fast decoder: the Wan 2.2 tiny autoencoder's decoder (taew2_2 / lighttaew2_2) on files written in the
published layout with random weights (`tiny_decoder_files`), from safetensors and weights-only .pth alike; a clip
decoded in pieces equal to one decode bit for bit; 1 + 4(T-1) frames as the VAE gives; the latent space by file name;
every refusal by name before anything is built; generate, causal rollouts and sessions decoding with it; with
`COMFYUI_DIR`, equal to ComfyUI's own TAEHV on the same file."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime.errors import CheckpointError, InputError
from cosmos3_runtime.tiny import sim_transfer_block
from cosmos3_runtime.tiny_decoder import TinyDecoder, latent_space_of
from cosmos3_runtime.vae import image_frames
from tiny_decoder_files import published_state, write

W, H = 64, 32


@pytest.fixture(scope="module")
def state():
    return published_state(seed=3)


@pytest.fixture(scope="module")
def files(tmp_path_factory, state):
    folder = tmp_path_factory.mktemp("vae_approx")
    return {name: write(folder / name, state) for name in ("taew2_2.safetensors", "taew2_2.pth",
                                                           "lighttaew2_2.safetensors")}


def latents(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 48, frames, 2, 3, generator=torch.Generator().manual_seed(seed))


def test_the_published_layout_loads_from_safetensors_and_pth_alike(files):
    from_safetensors = TinyDecoder.load(files["taew2_2.safetensors"])
    from_pth = TinyDecoder.load(files["taew2_2.pth"])
    assert from_safetensors.widths == (256, 128, 64, 64) and from_safetensors.dtype == torch.float32
    z = latents(3)
    pixels = from_safetensors.decode(z)
    assert torch.equal(pixels, from_pth.decode(z))
    assert pixels.shape == (1, 3, 9, 32, 48) and pixels.min() >= -1 and pixels.max() <= 1
    assert pixels.std() > 0.05  # the random weights reach the output: a test of equality is one of something


@pytest.mark.parametrize("frames", [1, 2, 5])
def test_t_latent_frames_give_1_plus_4_t_minus_1_frames_as_the_vae_does(files, frames):
    assert TinyDecoder.load(files["taew2_2.pth"]).decode(latents(frames)).shape[2] == 1 + 4 * (frames - 1)


@pytest.mark.parametrize("pieces", [[1, 2, 1], [1, 1, 1, 1], [2, 2], [4]])
def test_a_clip_decoded_in_pieces_is_one_decode_bit_for_bit(files, pieces):
    decoder = TinyDecoder.load(files["taew2_2.safetensors"])
    z = latents(4, seed=1)
    stream, start, got = decoder.stream(), 0, []
    for size in pieces:
        got.append(stream(z[:, :, start : start + size]))
        assert got[-1].shape[2] == (1 + 4 * (size - 1) if start == 0 else 4 * size)
        start += size
    assert torch.equal(torch.cat(got, 2), decoder.decode(z))


def test_each_piece_depends_on_the_frames_before_it(files):
    """The memory blocks carry the past: the second latent frame decodes differently after another first one."""
    decoder = TinyDecoder.load(files["taew2_2.safetensors"])
    z = latents(2)
    other = torch.cat([latents(1, seed=9), z[:, :, 1:]], 2)
    assert not torch.equal(decoder.decode(z)[:, :, 1:], decoder.decode(other)[:, :, 1:])


@pytest.mark.skipif(not os.environ.get("COMFYUI_DIR"), reason="needs COMFYUI_DIR (a ComfyUI checkout)")
def test_the_decoder_equals_comfyuis_taehv_on_the_same_file(files):
    """ComfyUI's `comfy/taesd/taehv.py` loaded by path in a process of its own (its two comfy imports stood in for:
    a plain Conv2d and the CPU as the output device), decoding frame by frame as its previews do, in fp32."""
    script = textwrap.dedent(f"""
        import importlib.util, sys, types, torch
        from safetensors.torch import load_file
        comfy, ops, mm = (types.ModuleType(n) for n in ("comfy", "comfy.ops", "comfy.model_management"))
        ops.disable_weight_init = types.SimpleNamespace(Conv2d=torch.nn.Conv2d)
        mm.intermediate_device = lambda: torch.device("cpu")
        comfy.ops, comfy.model_management = ops, mm
        sys.modules.update({{"comfy": comfy, "comfy.ops": ops, "comfy.model_management": mm}})
        spec = importlib.util.spec_from_file_location("taehv", {os.environ['COMFYUI_DIR']!r} + "/comfy/taesd/taehv.py")
        taehv = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(taehv)
        model = taehv.TAEHV(latent_channels=48)
        state = {{k: v.float() for k, v in load_file({str(files['taew2_2.safetensors'])!r}).items()}}
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not [k for k in missing if k.startswith("decoder.")] and not unexpected, (missing, unexpected)
        z = torch.randn(1, 48, 3, 2, 3, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.save(model.decode(z).clamp(0, 1), sys.argv[1])  # [1, 3, F, H, W] in 0..1
    """)
    out = Path(files["taew2_2.safetensors"]).parent / "comfyui.pt"
    subprocess.run([sys.executable, "-c", script, str(out)], check=True, timeout=300)
    theirs = torch.load(out)
    ours = TinyDecoder.load(files["taew2_2.safetensors"]).decode(latents(3)) / 2 + 0.5
    # a stage's frames go through a layer together here, one by one there: rounding only (measured 4.8e-6)
    assert ours.shape == theirs.shape and (ours - theirs).abs().max() <= 1e-5


def test_the_latent_space_follows_the_file_name_unless_told():
    assert latent_space_of("models/vae_approx/lighttaew2_2.safetensors") == "raw"  # lightx2v's need_scaled
    assert latent_space_of("LightTAEW2_2.pth") == "raw"
    assert latent_space_of("taew2_2.safetensors") == "normalized"  # TAEHV: the diffusion model's own latents
    assert latent_space_of("my_copy.safetensors") == "normalized"
    assert latent_space_of("lighttaew2_2.pth", "normalized") == "normalized"
    assert latent_space_of("taew2_2.pth", "raw") == "raw"
    with pytest.raises(InputError, match="fast_decoder_latents must be one of auto, normalized, raw"):
        latent_space_of("taew2_2.pth", "scaled")


class Pickled:  # code a .pth could carry: a weights-only load refuses to rebuild it
    def __reduce__(self):
        return (print, ("unpickled",))


def without(state, *keys):
    return {k: v for k, v in state.items() if k not in keys}


REFUSALS = {
    "missing": (lambda s: without(s, "decoder.22.bias"), ".safetensors", "decoder.22.bias missing"),
    "a missing stage": (lambda s: without(s, "decoder.14.weight"), ".pth", "is not a TAEHV tiny autoencoder .*has no "
                        "decoder.14.weight"),
    "Wan 2.1": (lambda s: s | {"decoder.1.weight": torch.zeros(256, 16, 3, 3)}, ".safetensors",
                "decodes 16 latent channels, not Wan 2.2's 48 .*taew2_2 or lighttaew2_2"),
    "a wider block": (lambda s: s | {"decoder.4.conv.2.weight": torch.zeros(256, 300, 3, 3)}, ".pth",
                      r"decoder.4.conv.2.weight is \[256, 300, 3, 3\], not \[256, 256, 3, 3\]"),
    "another block": (lambda s: s | {"decoder.23.weight": torch.zeros(3, 3, 3, 3)}, ".safetensors",
                      "decoder.23.weight unexpected"),
    "no tensors": (lambda s: {"decoder": Pickled()}, ".pth", "is not a weights-only tensor file"),
    "a list": (lambda s: [torch.zeros(1)], ".pth", "holds no plain dict of tensors"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_files_that_are_not_this_architecture_are_refused_by_name_before_anything_is_built(case, state, tmp_path,
                                                                                           monkeypatch):
    change, suffix, message = REFUSALS[case]
    path = tmp_path / f"taew2_2{suffix}"
    if suffix == ".pth":
        torch.save(change(dict(state)), path)
    else:
        write(path, change(dict(state)))

    def built(*args, **kwargs):
        raise AssertionError("a decoder was built from a file that was not checked")

    monkeypatch.setattr(TinyDecoder, "__init__", built)
    with pytest.raises(CheckpointError, match=message) as refusal:
        TinyDecoder.load(path)
    assert path.name in str(refusal.value)


def test_other_files_are_refused_by_name(tmp_path):
    with pytest.raises(CheckpointError, match="taew2_2.ckpt: the fast decoder loads .safetensors or .pth files only"):
        TinyDecoder.load(tmp_path / "taew2_2.ckpt")
    with pytest.raises(CheckpointError, match="fast decoder file .*gone.safetensors not found"):
        TinyDecoder.load(tmp_path / "gone.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="junk.safetensors is not a readable safetensors file"):
        TinyDecoder.load(tmp_path / "junk.safetensors")


# --- wired into runs ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipe(tiny_factory):
    return cosmos3_runtime.load(tiny_factory(kind="gated"), dtype="fp32")


def generate(pipe, **options):
    return pipe.generate("a red ball rolls across a stone floor", **dict(width=W, height=H, num_frames=9, steps=2,
                                                                         seed=4) | options)


def test_generate_decodes_with_the_fast_decoder_in_the_latent_space_its_file_takes(pipe, files):
    full = generate(pipe)
    fast = generate(pipe, fast_decoder=files["taew2_2.safetensors"])
    light = generate(pipe, fast_decoder=str(files["lighttaew2_2.safetensors"]))
    assert torch.equal(fast.latents, full.latents) and fast.frames.shape == full.frames.shape == (9, H, W, 3)
    decoder = TinyDecoder.load(files["taew2_2.safetensors"])
    assert torch.equal(fast.frames, image_frames(decoder.decode(full.latents).float()))  # the model's own latents
    raw = pipe.vae.denormalize(full.latents)
    assert torch.equal(light.frames, image_frames(decoder.decode(raw).float()))  # lightx2v's: latents * std + mean
    # on random weights this only shows the plumbing: the two decoders share nothing but the latents' shape
    print(f"fast vs full decoder, mean |difference| {(fast.frames - full.frames).abs().mean():.3f}, max "
          f"{(fast.frames - full.frames).abs().max():.3f} (0..1)")
    assert not torch.equal(fast.frames, full.frames)


def test_a_bad_fast_decoder_file_is_refused_before_any_step(pipe, state, tmp_path):
    bad = write(tmp_path / "taew2_2.safetensors", without(state, "decoder.22.bias"))
    steps = []
    with pytest.raises(CheckpointError, match="taew2_2.safetensors .*decoder.22.bias missing"):
        generate(pipe, fast_decoder=bad, callback=lambda *args: steps.append(args))
    assert steps == []


def test_options_the_fast_decoder_does_not_take_are_refused_by_name(pipe, files):
    with pytest.raises(InputError, match="vae_tile tiles the VAE's decode.*give one of them"):
        generate(pipe, fast_decoder=files["taew2_2.pth"], vae_tile=16)
    with pytest.raises(InputError, match="fast_decoder_latents must be one of auto, normalized, raw"):
        generate(pipe, fast_decoder=files["taew2_2.pth"], fast_decoder_latents="scaled")
    with pytest.raises(InputError, match="a long video or a transfer starts each chunk .*leave fast_decoder unset"):
        generate(pipe, fast_decoder=files["taew2_2.pth"], num_frames=17, chunk_frames=9)


@pytest.fixture(scope="module")
def framewise(tiny_factory):
    causal = sim_transfer_block(1, window_frames=4, sink_frames=1)
    return cosmos3_runtime.load(tiny_factory(kind="gated", dtype="float32", distilled=True, reasoner=False,
                                             causal=causal), dtype="fp32")


def test_a_session_decodes_each_tick_with_the_fast_decoder_as_the_batch_rollout_does(framewise, files):
    clip = (torch.rand(13, H, W, 3, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
    options = dict(width=W, height=H, seed=5, fast_decoder=files["lighttaew2_2.safetensors"])
    batch = framewise.generate("a red ball", control_videos={"edge": clip}, **options)
    with framewise.session("a red ball", control="edge", num_frames=13, **options) as s:
        ticks = [s.tick(clip[:1])] + [s.tick(clip[i : i + s.update]) for i in range(1, 13, s.update)]
    assert [t.shape[0] for t in ticks] == [1, 4, 4, 4]
    assert torch.equal(torch.cat(ticks), batch.frames)
    decoder = TinyDecoder.load(files["lighttaew2_2.safetensors"])
    assert torch.equal(batch.frames, image_frames(decoder.decode(framewise.vae.denormalize(batch.latents)).float()))
