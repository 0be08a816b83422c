"""The ComfyUI service wiring, against stand-ins for the documented comfy.* APIs."""

import sys
import types

import pytest
import torch


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

    module("comfy.latent_formats", Wan22=Wan22)
    models = tmp_path / "models"
    folder_paths = module("folder_paths", models_dir=str(models),
                          folder_names_and_paths={"diffusers": ([str(models / "diffusers")], set())})
    folder_paths.get_folder_paths = lambda name: folder_paths.folder_names_and_paths[name][0]
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
