"""Shared fixtures: the pack root on sys.path and tiny checkpoints built once per session."""

import importlib
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cosmos3_runtime.tiny import make_tiny_checkpoint, sim_bimanual_block, sim_transfer_block  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() == "true"
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")  # a real ComfyUI checkout: the tier-2 tests import it in-process


def _cpu_scaled_fp8() -> bool:
    import torch

    from cosmos3_runtime.devices import facts

    return facts(torch.device("cpu")).fp8_rowwise


# fp8_scaled's matmul on the CPU needs a torch whose CPU has the kernel (2.13 has it, 2.7 does not)
needs_cpu_scaled_fp8 = pytest.mark.skipif(not _cpu_scaled_fp8(), reason="this torch's CPU has no scaled fp8 matmul")


# Why a run may leave out a test reference on purpose: COSMOS3_WITHOUT_REFERENCES names those it lacks (module roots,
# comma-separated); .ci/run's torch 2.7 run sets "modelopt".
LEFT_OUT_BECAUSE = {"modelopt": "nvidia-modelopt 0.47 needs torch>=2.8"}


def require(module: str, minversion: str | None = None):
    """Import a test-only reference (diffusers). Locally a missing one skips the tests that need it;
    under CI=true it fails them, so the parity layer can never silently turn into skips. One named in
    COSMOS3_WITHOUT_REFERENCES skips them even under CI=true: that run lacks it on purpose."""
    root = module.split(".")[0]
    if root in os.environ.get("COSMOS3_WITHOUT_REFERENCES", "").replace(" ", "").split(","):
        pytest.skip(f"COSMOS3_WITHOUT_REFERENCES leaves out {root} in this run "
                    f"({LEFT_OUT_BECAUSE.get(root, 'on purpose')})", allow_module_level=True)
    if not IN_CI:
        return pytest.importorskip(module, minversion=minversion)
    imported = importlib.import_module(module)
    if minversion is not None:
        from packaging.version import Version

        assert Version(imported.__version__) >= Version(minversion), f"{module} {imported.__version__} < {minversion}"
    return imported


def use_flow_match_scheduler(root: Path) -> Path:
    """Give a copied tiny checkpoint a multi-step FlowMatch Euler scheduler (shift 3, no fixed sigma list): diffusers'
    task pipeline then walks plain Euler steps on its grid."""
    from cosmos3_runtime.tiny import DISTILLED_SCHEDULER

    config = {k: v for k, v in DISTILLED_SCHEDULER.items() if not k.startswith("fixed_step")}
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps({**config, "shift": 3.0,
                                                                          "stochastic_sampling": False}))
    index = json.loads((root / "model_index.json").read_text())
    index["scheduler"] = ["diffusers", "FlowMatchEulerDiscreteScheduler"]
    (root / "model_index.json").write_text(json.dumps(index))
    return root


@pytest.fixture(scope="session")
def tiny_factory(tmp_path_factory):
    """Build (and cache) a tiny checkpoint for a given set of make_tiny_checkpoint options."""
    built = {}

    def build(**options):
        key = json.dumps(options, sort_keys=True)
        if key not in built:
            name = "-".join(f"{k}={v}" if k != "causal" else k for k, v in sorted(options.items())
                            if k != "overrides") or "default"
            built[key] = make_tiny_checkpoint(tmp_path_factory.mktemp(name), **options)
        return built[key]

    return build


@pytest.fixture(scope="session")
def tiny_gated(tiny_factory):
    return tiny_factory(kind="gated")


@pytest.fixture(scope="session")
def tiny_edge(tiny_factory):
    return tiny_factory(kind="edge")


@pytest.fixture(scope="session")
def pack():
    """The pack imported the way ComfyUI imports it (a package named after its folder), with its nodes."""
    import importlib
    import importlib.util

    spec = importlib.util.spec_from_file_location("cosmos3_pack", ROOT / "__init__.py", submodule_search_locations=[str(ROOT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["cosmos3_pack"] = module
    spec.loader.exec_module(module)
    return importlib.import_module("cosmos3_pack.nodes")


@pytest.fixture
def models_dir(tmp_path, monkeypatch, tiny_factory, tiny_gguf):
    """A ComfyUI-like models/cosmos3 folder holding tiny checkpoints under the names the workflows use (and
    models/diffusion_models with the GGUF transformer the GGUF workflow uses)."""
    import shutil

    root = tmp_path / "models" / "cosmos3"
    layout = {
        "Cosmos3-Edge": dict(kind="edge"),
        "Cosmos3-Nano": dict(kind="gated", sound=True),
        "Cosmos3-Super-Text2Image-4Step": dict(kind="gated", distilled=True),
        "Cosmos3-Super-Image2Video-4Step": dict(kind="gated", distilled=True),
        "nvidia/Cosmos3-Edge-Policy-DROID": dict(kind="edge", action=True),
        "Cosmos3-Nano-Sim-Transfer": dict(kind="gated", distilled=True, causal=sim_transfer_block()),
        "Cosmos3-Nano-Sim-Transfer-framewise": dict(kind="gated", distilled=True,
                                                    causal=sim_transfer_block(1, window_frames=4, sink_frames=1)),
        "Cosmos3-Nano-Sim-Bimanual": dict(kind="gated", distilled=True, action=True, causal=sim_bimanual_block()),
    }
    for name, options in layout.items():
        shutil.copytree(tiny_factory(**options), root / name)
    monkeypatch.setenv("COSMOS3_MODEL_DIRS", str(root))
    (tmp_path / "models" / "diffusion_models").mkdir()
    shutil.copy(tiny_gguf, tmp_path / "models" / "diffusion_models" / GGUF_WORKFLOW_FILE)
    monkeypatch.setenv("COSMOS3_GGUF_DIRS", str(tmp_path / "models" / "diffusion_models"))
    return root


GGUF_WORKFLOW_FILE = "Cosmos3-Nano-Q4_0.gguf"  # the transformer file cosmos3_nano_t2v_gguf names


@pytest.fixture(scope="session")
def tiny_gguf(tiny_factory, tmp_path_factory):
    """The tiny Nano checkpoint's transformer converted to Q4_0 (what the GGUF workflow loads)."""
    from cosmos3_runtime.weights.gguf_convert import convert

    path = tmp_path_factory.mktemp("gguf") / GGUF_WORKFLOW_FILE
    convert(tiny_factory(kind="gated", sound=True), path, "q4_0")
    return path


@pytest.fixture(scope="session")
def comfyui():
    """The pack imported into a real ComfyUI (COMFYUI_DIR, on the CPU), the way ComfyUI imports it."""
    import importlib.util

    sys.path.insert(0, COMFYUI_DIR)
    from comfy.cli_args import args

    args.cpu = True  # before anything imports comfy.model_management
    spec = importlib.util.spec_from_file_location("cosmos3_tier2", ROOT / "__init__.py",
                                                  submodule_search_locations=[str(ROOT)])
    pack = importlib.util.module_from_spec(spec)
    sys.modules["cosmos3_tier2"] = pack
    spec.loader.exec_module(pack)
    return pack


@pytest.fixture
def guardrail_package(tmp_path, monkeypatch):
    """cosmos-guardrail (required under CI=true) with stand-ins for its models, its files in a Hugging Face cache of
    the tests' own (tests/guardrail_stand_ins.py): (the package's module, the classifier stand-in, the stand-ins).
    The package lives in a folder of its own (COSMOS3_GUARDRAIL_PACKAGES, default .venv/guardrails), on the path only
    in these tests: installed beside diffusers, it would be imported by diffusers' Cosmos3 pipeline module, whose
    import would then need torchvision."""
    import guardrail_stand_ins as stand_ins
    from huggingface_hub import constants

    monkeypatch.syspath_prepend(os.environ.get("COSMOS3_GUARDRAIL_PACKAGES", str(ROOT / ".venv" / "guardrails")))
    stand_ins.stub_torchvision(monkeypatch)
    checker = require("cosmos_guardrail.cosmos_guardrail")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(stand_ins.hf_cache(tmp_path / "hub")))
    return checker, stand_ins.install(checker, monkeypatch), stand_ins
