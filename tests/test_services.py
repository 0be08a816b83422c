"""The ComfyUI service wiring, against stand-ins for the documented comfy.* APIs."""

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos3_runtime.tiny_decoder import TinyDecoder
from tiny_decoder_files import published_state, write


class FakeProgressBar:
    instances = []

    def __init__(self, total, node_id=None):
        self.total, self.updates = total, []
        FakeProgressBar.instances.append(self)

    def update_absolute(self, value, total=None, preview=None):
        self.updates.append((value, total, preview))


@pytest.fixture
def comfy(monkeypatch, tmp_path):
    """Minimal comfy.utils / model_management / cli_args / latent_formats and folder_paths modules."""
    calls = {"interrupt": 0, "free": [], "empty": 0}
    FakeProgressBar.instances.clear()

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)
        return mod

    def interrupt():
        calls["interrupt"] += 1

    module("comfy")
    module("comfy.utils", ProgressBar=FakeProgressBar)
    module("comfy.model_management", throw_exception_if_processing_interrupted=interrupt,
           get_torch_device=lambda: torch.device("cpu"), unet_offload_device=lambda: torch.device("cpu"),
           free_memory=lambda n, d: calls["free"].append((n, d)),
           soft_empty_cache=lambda: calls.__setitem__("empty", calls["empty"] + 1))
    method = types.SimpleNamespace(value="latent2rgb")
    module("comfy.cli_args", args=types.SimpleNamespace(preview_method=method, preview_size=256))

    class Wan22:
        latent_rgb_factors = [[0.01 * (i % 7), -0.01 * (i % 5), 0.02] for i in range(48)]
        latent_rgb_factors_bias = [0.1, -0.1, 0.0]
        latents_mean = torch.linspace(-0.3, 0.5, 48).view(1, 48, 1, 1, 1)
        latents_std = torch.linspace(0.4, 1.7, 48).view(1, 48, 1, 1, 1)

    module("comfy.latent_formats", Wan22=Wan22)
    models = tmp_path / "models"
    folder_paths = module("folder_paths", models_dir=str(models),
                          folder_names_and_paths={"diffusers": ([str(models / "diffusers")], set())})
    folder_paths.get_folder_paths = lambda name: folder_paths.folder_names_and_paths[name][0]
    approx = models / "vae_approx"  # ComfyUI lists its files (and those of its sub-folders) by relative name
    folder_paths.get_filename_list = lambda name: sorted(
        str(p.relative_to(approx)) for p in approx.rglob("*") if p.is_file()) if name == "vae_approx" else []
    folder_paths.get_full_path = lambda name, file: str(approx / file)
    folder_paths.add_model_folder_path = lambda name, path: folder_paths.folder_names_and_paths[name][0].append(path)
    return calls, folder_paths


def test_progress_updates_with_previews_and_interrupt_checks(pack, comfy):
    calls, _ = comfy
    progress = pack.services.progress.Progress(3)
    for step in (1, 2, 3):
        progress.update(step, torch.randn(1, 48, 2, 6, 8))
    (bar,) = FakeProgressBar.instances
    assert [u[:2] for u in bar.updates] == [(1, 3), (2, 3), (3, 3)] and calls["interrupt"] == 3
    kind, image, size = bar.updates[0][2]
    assert kind == "JPEG" and image.size == (8, 6) and size == 256


def test_previews_follow_the_preview_setting(pack, comfy):
    sys.modules["comfy.cli_args"].args.preview_method = types.SimpleNamespace(value="none")
    progress = pack.services.progress.Progress(1)
    progress.update(1, torch.randn(1, 48, 1, 4, 4))
    assert FakeProgressBar.instances[0].updates == [(1, 1, None)]


@pytest.mark.parametrize("method, names, chosen", [
    ("taesd", ["taew2_2.safetensors", "lighttaew2_2.pth"], "lighttaew2_2.pth"),  # ComfyUI's own Wan 2.2 choice first
    ("taesd", ["taesd_decoder.pth", "wan/taew2_2.pth"], "wan/taew2_2.pth"),
    ("taesd", ["taew2_1.safetensors", "taew2_2.ckpt", "taesdxl_decoder.pth"], None),  # Wan 2.1's, not a weights file
    ("latent2rgb", ["taew2_2.safetensors"], None),
    ("auto", ["taew2_2.safetensors"], None),  # ComfyUI's auto is its linear previews
])
def test_previews_decode_with_a_wan_2_2_tiny_autoencoder_only_under_taesd(pack, method, names, chosen):
    assert pack.services.progress.preview_decoder_name(method, names) == chosen


def test_taesd_previews_decode_the_last_latent_frame_with_the_file_in_vae_approx(pack, comfy):
    _, folder_paths = comfy
    sys.modules["comfy.cli_args"].args.preview_method = types.SimpleNamespace(value="taesd")
    latents = torch.randn(1, 48, 2, 3, 4, generator=torch.Generator().manual_seed(0))
    pack.services.progress.Progress(1).update(1, latents)  # no file: the linear previews
    assert FakeProgressBar.instances[-1].updates[0][2][1].size == (4, 3)

    path = write(Path(folder_paths.models_dir) / "vae_approx" / "lighttaew2_2.safetensors", seed=1)
    pack.services.progress.Progress(1).update(1, latents)
    kind, image, size = FakeProgressBar.instances[-1].updates[0][2]
    assert kind == "JPEG" and image.size == (64, 48) and size == 256
    wan22 = sys.modules["comfy.latent_formats"].Wan22
    raw = latents[:, :, -1:] * wan22.latents_std + wan22.latents_mean  # lighttae* take the VAE's raw latents
    pixels = TinyDecoder.load(path).decode(raw)[0, :, 0].permute(1, 2, 0)
    assert torch.equal(torch.tensor(np.array(image)), ((pixels + 1) * 127.5).round().to(torch.uint8))


def test_a_broken_tiny_autoencoder_costs_the_previews_their_decoder_not_the_run(pack, comfy, caplog):
    _, folder_paths = comfy
    sys.modules["comfy.cli_args"].args.preview_method = types.SimpleNamespace(value="taesd")
    state = {k: v for k, v in published_state().items() if k != "decoder.22.bias"}
    write(Path(folder_paths.models_dir) / "vae_approx" / "taew2_2.safetensors", state)
    pack.services.progress.Progress(1).update(1, torch.randn(1, 48, 1, 3, 4))
    assert FakeProgressBar.instances[-1].updates[0][2][1].size == (4, 3)
    assert "taew2_2.safetensors is not the Wan 2.2 tiny autoencoder's published layout" in caplog.text


def test_model_folders_are_registered_and_listed(pack, comfy):
    _, folder_paths = comfy
    pack.services.files.register_model_folder()
    assert folder_paths.folder_names_and_paths["cosmos3"][0] == [f"{folder_paths.models_dir}/cosmos3"]
    assert pack.services.files.model_roots() == [f"{folder_paths.models_dir}/cosmos3", f"{folder_paths.models_dir}/diffusers"]


def test_sampler_node_reports_progress_through_comfyui(pack, comfy, models_dir, monkeypatch):
    monkeypatch.setattr(pack.services.files, "model_roots", lambda: [str(models_dir)])
    pack.loader.release_all()
    model, _, _ = pack.Cosmos3ModelLoader().load("Cosmos3-Edge", "fp32", "default")["result"]
    text = pack.Cosmos3TextEncode().encode("a cat", "", "auto", True, True, True)["result"][0]
    pack.Cosmos3Sampler().sample(model, text, 64, 48, 5, 0.0, 0.0, "auto", 0, schedule={"schedule": "auto", "steps": 4,
                                                                                 "flow_shift": None})
    (bar,) = FakeProgressBar.instances
    assert bar.total == 4 and [u[0] for u in bar.updates] == [1, 2, 3, 4]
    assert all(u[2] is not None for u in bar.updates)
