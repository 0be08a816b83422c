"""Loading a Cosmos3 checkpoint into ready-to-run components."""

import logging
import os
from pathlib import Path

import torch

from .checkpoint import Checkpoint, Variant, read_json, resolve
from .transformer import Cosmos3Transformer, checkpoint_key_mapper
from .vae import VAEConfig, WanVAE
from .weights import load_weights

log = logging.getLogger(__name__)

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """`None`/"auto": bf16 on accelerators (the released precision), fp32 on CPU."""
    if dtype is None or dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, torch.dtype):
        resolved = dtype
    elif dtype in DTYPES:
        resolved = DTYPES[dtype]
    else:
        raise ValueError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(sorted(DTYPES))}")
    if resolved == torch.float16:
        log.warning("Cosmos3 is trained and released in bf16; fp16 may overflow and is not supported upstream")
    return resolved


def load_transformer(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> Cosmos3Transformer:
    config = checkpoint.transformer_config()
    with torch.device("meta"):
        model = Cosmos3Transformer(config)
    load_weights(
        model,
        checkpoint.path("transformer"),
        dtype,
        device,
        rename=checkpoint_key_mapper(config),
        keep_fp32=("time_embedder.",),
    )
    return model


def load_vae(folder: Path, device: torch.device, dtype: torch.dtype) -> WanVAE:
    """A VAE from its folder (config.json + diffusion_pytorch_model.safetensors)."""
    config_path = folder / "config.json"
    config = VAEConfig.from_dict(read_json(config_path), source=str(config_path))
    with torch.device("meta"):
        vae = WanVAE(config)
    load_weights(vae, folder, dtype, device)
    return vae


class Cosmos3Pipeline:
    """A loaded checkpoint: its variant and its components."""

    def __init__(self, checkpoint: Checkpoint, transformer: Cosmos3Transformer, vae: WanVAE | None, device, dtype):
        self.checkpoint = checkpoint
        self.transformer = transformer
        self.vae = vae
        self.device = device
        self.dtype = dtype

    @property
    def variant(self) -> Variant:
        return self.checkpoint.variant

    def __repr__(self) -> str:
        return f"Cosmos3Pipeline({str(self.checkpoint.root)!r}, {self.variant.describe()}, {self.dtype}, {self.device})"


def load(
    path: str | os.PathLike,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    vae_dtype: str | torch.dtype | None = None,
    load_vae_weights: bool = True,
    local_files_only: bool | None = None,
) -> Cosmos3Pipeline:
    """Load a Cosmos3 checkpoint from a folder or a Hugging Face repo id (`namespace/repo[/subfolder]`).

    `dtype` is the transformer's precision, `vae_dtype` the VAE's (default: the same).
    `load_vae_weights=False` skips the VAE (for latent-only work).
    """
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    vae_dtype = dtype if vae_dtype is None else resolve_dtype(vae_dtype, device)
    components = ("transformer", "vae") if load_vae_weights else ("transformer",)
    checkpoint = Checkpoint(resolve(path, components=components, local_files_only=local_files_only))
    transformer = load_transformer(checkpoint, device, dtype)
    vae = load_vae(checkpoint.path("vae"), device, vae_dtype) if load_vae_weights else None
    return Cosmos3Pipeline(checkpoint, transformer, vae, device, dtype)
