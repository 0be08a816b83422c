"""Checkpoint resolution, variant detection from config files, and clear errors for bad folders."""

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch

import cosmos3_runtime
from cosmos3_runtime import CheckpointError, checkpoint
from cosmos3_runtime.checkpoint import detect_variant
from conftest import ROOT
from cosmos3_runtime.tiny import DISTILLED_SCHEDULER, DISTILLED_SIGMAS, UNIPC_SCHEDULER, transformer_config


def write_configs(root, *, class_name="Cosmos3OmniPipeline", transformer=None, scheduler=None, modular=None, **index):
    """A checkpoint folder with config files only: enough for variant detection."""
    (root / "transformer").mkdir(parents=True, exist_ok=True)
    (root / "scheduler").mkdir(exist_ok=True)
    (root / "model_index.json").write_text(json.dumps({"_class_name": class_name, **index}))
    (root / "transformer" / "config.json").write_text(json.dumps(transformer or transformer_config("gated")))
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler or UNIPC_SCHEDULER))
    if modular is not None:
        (root / "modular_model_index.json").write_text(json.dumps(modular))
    return root


def edited(config, **changes):
    return {**config, **changes}


# --- variant detection ---------------------------------------------------------------------------


def test_plain_checkpoint(tmp_path):
    v = detect_variant(write_configs(tmp_path))
    assert (v.is_edge, v.is_distilled, v.distilled_sigmas, v.has_action, v.has_sound) == (
        False,
        False,
        None,
        False,
        False,
    )
    assert v.default_use_system_prompt is True
    assert v.describe() == "gated (SwiGLU), multi-step"


@pytest.mark.parametrize("name", ["Cosmos3OmniPipeline", "Cosmos3OmniDiffusersPipeline"])
def test_both_pipeline_class_spellings(tmp_path, name):
    assert detect_variant(write_configs(tmp_path, class_name=name)).pipeline_class == name
    assert cosmos3_runtime.Checkpoint(tmp_path).variant.pipeline_class == name


def test_other_pipeline_class_is_refused(tmp_path):
    write_configs(tmp_path, class_name="WanPipeline")
    with pytest.raises(CheckpointError, match="model_index.json.*WanPipeline.*not a Cosmos3 pipeline"):
        cosmos3_runtime.Checkpoint(tmp_path)


def test_edge_from_backbone_type_alone(tmp_path):
    config = edited(transformer_config("gated"), backbone_type="cosmos3_edge_nemotron_dense")
    assert detect_variant(write_configs(tmp_path, transformer=config)).is_edge


def test_edge_from_relu2_alone(tmp_path):
    config = transformer_config("edge")
    del config["backbone_type"]
    assert config["hidden_act"] == "relu2"
    assert detect_variant(write_configs(tmp_path, transformer=config)).is_edge


def test_distilled_from_scheduler_t_list(tmp_path):
    v = detect_variant(write_configs(tmp_path, scheduler=DISTILLED_SCHEDULER))
    assert v.is_distilled and v.distilled_sigmas == tuple(DISTILLED_SIGMAS) and v.stochastic_distilled


def test_distilled_from_modular_index(tmp_path):
    scheduler = {k: v for k, v in DISTILLED_SCHEDULER.items() if k != "fixed_step_sampler_config"}
    scheduler["stochastic_sampling"] = False
    modular = {"_class_name": "Cosmos3DistilledModularPipeline", "is_distilled": True, "distilled_sigmas": [1.0, 0.5]}
    v = detect_variant(write_configs(tmp_path, scheduler=scheduler, modular=modular))
    assert v.is_distilled and v.distilled_sigmas == (1.0, 0.5) and not v.stochastic_distilled


def test_t_list_wins_over_different_modular_sigmas(tmp_path, caplog):
    modular = {"is_distilled": True, "distilled_sigmas": [1.0, 0.75, 0.5, 0.25]}
    with caplog.at_level(logging.WARNING):
        v = detect_variant(write_configs(tmp_path, scheduler=DISTILLED_SCHEDULER, modular=modular))
    assert v.distilled_sigmas == tuple(DISTILLED_SIGMAS)
    assert "differs from modular distilled_sigmas" in caplog.text


def test_unipc_scheduler_with_stray_t_list_is_not_distilled(tmp_path):
    scheduler = {**UNIPC_SCHEDULER, "fixed_step_sampler_config": {"t_list": [1.0, 0.5]}, "some_new_key": 3}
    assert not detect_variant(write_configs(tmp_path, scheduler=scheduler)).is_distilled


def test_flow_match_scheduler_without_a_sigma_list_is_multi_step(tmp_path):
    """Only a declared sigma list makes a checkpoint distilled (the serving reference's rule)."""
    scheduler = {k: v for k, v in DISTILLED_SCHEDULER.items() if k != "fixed_step_sampler_config"}
    v = detect_variant(write_configs(tmp_path, scheduler=scheduler))
    assert not v.is_distilled and v.distilled_sigmas is None
    assert v.scheduler_class == "FlowMatchEulerDiscreteScheduler" and "multi-step" in v.describe()


def test_heads_and_system_prompt_flag(tmp_path):
    config = transformer_config("edge", action=True, sound=True)
    v = detect_variant(write_configs(tmp_path, transformer=config, default_use_system_prompt=False))
    assert v.has_action and v.has_sound and not v.default_use_system_prompt
    assert v.describe() == "Edge (dense relu2), multi-step, action head, sound head (no sound tokenizer)"


def test_detection_is_cached_until_a_config_changes(tmp_path, monkeypatch):
    write_configs(tmp_path)
    reads = []
    real = checkpoint.read_json
    monkeypatch.setattr(checkpoint, "read_json", lambda path, required=True: reads.append(path) or real(path, required))
    first = detect_variant(tmp_path)
    count = len(reads)
    assert detect_variant(tmp_path) is first and len(reads) == count  # no file read the second time
    config_path = tmp_path / "transformer" / "config.json"
    config_path.write_text(json.dumps(transformer_config("edge")))
    os.utime(config_path, ns=(1, 1))
    assert detect_variant(tmp_path).is_edge


# --- bad folders and files -----------------------------------------------------------------------


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint folder: .*does-not-exist"):
        cosmos3_runtime.load(tmp_path / "does-not-exist")


def test_folder_without_model_index(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="has no model_index.json"):
        cosmos3_runtime.load(tmp_path)


def test_transformer_subfolder_gets_a_hint(tiny_gated):
    with pytest.raises(CheckpointError, match="looks like the transformer/ subfolder; point at its parent"):
        cosmos3_runtime.load(tiny_gated / "transformer")


def test_malformed_json_names_the_file(tmp_path):
    write_configs(tmp_path)
    (tmp_path / "scheduler" / "scheduler_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"scheduler_config.json is not valid JSON"):
        cosmos3_runtime.Checkpoint(tmp_path)


def test_unknown_hidden_act_names_the_file(tmp_path):
    write_configs(tmp_path, transformer=edited(transformer_config("gated"), hidden_act="gelu"))
    with pytest.raises(CheckpointError, match=r"transformer/config.json: hidden_act 'gelu' is not supported"):
        cosmos3_runtime.Checkpoint(tmp_path)


@pytest.fixture
def broken_copy(tiny_gated, tmp_path):
    return shutil.copytree(tiny_gated, tmp_path / "ckpt")


SHARD_2 = "diffusion_pytorch_model-00002-of-00002.safetensors"


def test_missing_shard_names_the_shard(broken_copy):
    (broken_copy / "transformer" / SHARD_2).unlink()
    with pytest.raises(CheckpointError, match=f"missing weight shard .*{SHARD_2}"):
        cosmos3_runtime.load(broken_copy)


def test_truncated_shard_names_the_file(broken_copy):
    shard = broken_copy / "transformer" / SHARD_2
    os.truncate(shard, shard.stat().st_size // 2)
    with pytest.raises(CheckpointError, match=f"{SHARD_2} is not a readable safetensors file.*truncated"):
        cosmos3_runtime.load(broken_copy)


def test_weights_from_another_config_are_refused(broken_copy):
    config_path = broken_copy / "transformer" / "config.json"
    config_path.write_text(json.dumps(edited(json.loads(config_path.read_text()), intermediate_size=96)))
    with pytest.raises(CheckpointError, match=r"tensor layers.0.mlp\S* has shape .*the config implies .*96"):
        cosmos3_runtime.load(broken_copy)


def test_missing_and_unexpected_keys_are_named(broken_copy):
    config_path = broken_copy / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(edited(config, sound_gen=True, sound_dim=16)))
    with pytest.raises(CheckpointError, match=r"audio_modality_embed, audio_proj_in.bias.*are missing"):
        cosmos3_runtime.load(broken_copy)
    config_path.write_text(json.dumps(edited(config, qk_norm_for_text=False)))
    with pytest.raises(CheckpointError, match=r"layers.0.self_attn.norm_k.weight.*do not exist in a model"):
        cosmos3_runtime.load(broken_copy)


def test_pickle_weights_are_never_loaded(broken_copy):
    folder = broken_copy / "transformer"
    for f in folder.glob("*.safetensors*"):
        f.unlink()
    (folder / "diffusion_pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(CheckpointError, match="only has pickle weights.*safetensors only"):
        cosmos3_runtime.load(broken_copy)


# --- loading -------------------------------------------------------------------------------------


def test_weights_land_in_target_dtype_with_fp32_time_embedder(tiny_edge):
    pipe = cosmos3_runtime.load(tiny_edge, device="cpu", dtype="bf16")
    model = pipe.transformer
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.layers[0].mlp_moe_gen.up_proj.weight.dtype == torch.bfloat16
    assert model.time_embedder.linear_1.weight.dtype == torch.float32
    assert not any(p.is_meta or p.requires_grad for p in model.parameters())
    names = {n for n, _ in model.named_parameters()}
    last = f"layers.{model.config.num_hidden_layers - 1}."
    assert "lm_head.weight" not in names and "norm.weight" not in names
    assert not any(n.startswith(last + "mlp.") or n.startswith(last + "self_attn.to_q") for n in names)
    assert pipe.variant.is_edge


def test_quantizer_and_unused_tensors_are_skipped(broken_copy):
    from safetensors.torch import load_file, save_file

    shard = broken_copy / "transformer" / SHARD_2
    tensors = load_file(shard)
    tensors["layers.0.self_attn.to_q.weight_quantizer._amax"] = torch.ones(1)
    save_file(tensors, shard)
    cosmos3_runtime.load(broken_copy)


def test_bf16_forward_runs(tiny_gated):
    model = cosmos3_runtime.load(tiny_gated, dtype="bf16").transformer
    out = model(torch.randn(1, 48, 2, 4, 4), torch.tensor(500), model.encode_text(torch.arange(5))).vision
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


# --- hub names -----------------------------------------------------------------------------------


def fake_hub_cache(cache, repo_id, source, subfolder=""):
    """Lay out `source` as a cached snapshot of `repo_id` the way huggingface_hub stores it."""
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0" * 40
    shutil.copytree(source, repo_dir / "snapshots" / commit / subfolder)
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(commit)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache (huggingface_hub reads HF_HUB_CACHE once, at import)."""
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_repo_id_resolves_from_the_local_cache_offline(tiny_gated, hub_cache, monkeypatch):
    fake_hub_cache(hub_cache, "nvidia/Cosmos3-Tiny", tiny_gated)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pipe = cosmos3_runtime.load("nvidia/Cosmos3-Tiny")
    assert pipe.checkpoint.root.name == "0" * 40 and not pipe.variant.is_edge


def test_repo_subfolder_resolves_from_the_local_cache(tiny_edge, hub_cache):
    fake_hub_cache(hub_cache, "nvidia/Cosmos3-Collection", tiny_edge, subfolder="edge/diffusers")
    pipe = cosmos3_runtime.load("nvidia/Cosmos3-Collection/edge/diffusers", local_files_only=True)
    assert pipe.variant.is_edge


def test_repo_id_absent_offline_is_a_clear_error(hub_cache):
    with pytest.raises(CheckpointError, match="not in the local Hugging Face cache and downloads are off"):
        cosmos3_runtime.load("nvidia/Cosmos3-Absent", local_files_only=True)


@pytest.mark.parametrize("name", ["nvidia", "nvidia/../etc", "a//b"])
def test_names_that_are_neither_folders_nor_repo_ids(name):
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        cosmos3_runtime.load(name)


def test_a_missing_repo_shaped_path_says_both_what_it_looked_for(hub_cache):
    with pytest.raises(CheckpointError, match=r"no such checkpoint folder: .*models/Cosmos3-Nano; also tried as a "
                                              r"Hugging Face repo id \(repo models/Cosmos3-Nano\): models/Cosmos3-Nano "
                                              "is not in the local Hugging Face cache"):
        cosmos3_runtime.load("models/Cosmos3-Nano", local_files_only=True)


def test_loaded_weights_survive_the_files_being_replaced(broken_copy):
    """Weights must not stay memory-mapped: rewriting a checkpoint under a running server would SIGBUS it."""
    script = f"""
import os, sys, torch
sys.path.insert(0, {str(ROOT)!r})
import cosmos3_runtime
model = cosmos3_runtime.load({str(broken_copy)!r}, dtype=torch.bfloat16).transformer
before = [p.float().sum().item() for p in model.parameters()]
for f in (os.path.join({str(broken_copy / "transformer")!r}, n) for n in os.listdir({str(broken_copy / "transformer")!r})):
    if f.endswith(".safetensors"):
        os.truncate(f, 0)
assert before == [p.float().sum().item() for p in model.parameters()]
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:] or f"crashed with signal {-result.returncode}"


def test_checkpoint_errors_are_one_line_whatever_a_library_wrote():
    assert str(CheckpointError("cannot read x (OSError: first line\n  second line\n)")) == \
        "cannot read x (OSError: first line second line )"
