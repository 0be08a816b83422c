"""GGUF transformer weights: a file from the gguf package's own writer loads and runs exactly like the safetensors
checkpoint holding the same weights (dequantized by the gguf package); the converter; bad files."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import cosmos3_runtime
from conftest import require
from cosmos3_runtime import CheckpointError, InputError
from cosmos3_runtime.__main__ import main as cli
from cosmos3_runtime.weights.files import weight_files
from cosmos3_runtime.weights.gguf import GGUFFile, GGUFLinear
from cosmos3_runtime.weights.gguf_convert import convert
from cosmos3_runtime.weights.gguf_dequant import BLOCKS
from gguf_files import random_blocks, write_gguf

gguf = require("gguf")
from gguf import GGMLQuantizationType, dequantize as reference_dequantize  # noqa: E402

# Every block linear reads 256 values per row, so the K-quants (256-value super-blocks) fit too.
WIDE = dict(hidden_size=256, head_dim=64, intermediate_size=256, rope_axes_dim=[12, 10, 10])
REQUEST = dict(width=64, height=64, num_frames=1, steps=2, seed=1, output="latents", negative_prompt="blurry")


def checkpoint_tensors(root: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in weight_files(root / "transformer") for k, v in load_file(str(f)).items()}


def without_weights(src: Path, dst: Path) -> Path:
    """A copy of a checkpoint without its transformer weights (config, VAE, tokenizer kept)."""
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if Path(d).name == "transformer"
                                                        and "safetensors" in n])
    return dst


def blocks_of(qtype: str, rows: int, values: int, seed: int) -> np.ndarray:
    """Random blocks scaled so the weights have a std near 1/sqrt(values) (activations stay finite)."""
    unit = random_blocks(qtype, rows, values, seed, scale=1.0)
    std = reference_dequantize(unit, GGMLQuantizationType[qtype]).std()
    return random_blocks(qtype, rows, values, seed, scale=float(values**-0.5 / std))


@pytest.fixture(scope="module")
def every_type(tiny_factory, tmp_path_factory):
    """(gguf checkpoint, safetensors reference): the blocks' linears cycle through every supported type."""
    base = tiny_factory(kind="gated", dtype="float32", overrides=WIDE)
    tmp = tmp_path_factory.mktemp("gguf-every-type")
    stored, reference = {}, {}
    kinds = iter(list(BLOCKS) * 10)
    for i, (name, value) in enumerate(sorted(checkpoint_tensors(base).items())):
        if name.startswith("layers.") and value.ndim == 2:
            qtype = next(kinds)
            if qtype in ("F32", "F16"):
                data = value.numpy()
            elif qtype == "BF16":
                data = value.to(torch.bfloat16).view(torch.uint8).numpy()
            else:
                data = blocks_of(qtype, value.shape[0], value.shape[1], seed=i)
        else:
            qtype, data = "F32", value.numpy()
        stored[name] = (qtype, data)
        raw = data if qtype != "F16" else data.astype(np.float16)
        reference[name] = torch.from_numpy(reference_dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32)
                                           .reshape(value.shape))
    quantized = without_weights(base, tmp / "gguf")
    write_gguf(quantized / "transformer" / "cosmos3-mixed.gguf", stored)
    dense = without_weights(base, tmp / "safetensors")
    save_file(reference, str(dense / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert {q for q, _ in stored.values()} == set(BLOCKS)
    return quantized, dense


def one_forward(pipe) -> torch.Tensor:
    model = pipe.transformer
    latents = torch.randn(1, 48, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    text = model.encode_text(torch.arange(40) % model.config.vocab_size)
    return model(latents, torch.tensor(700.0), text).vision


def test_a_gguf_writer_file_of_every_type_runs_like_its_dequantized_safetensors(every_type):
    quantized, dense = every_type
    pipe = cosmos3_runtime.load(quantized, device="cpu", dtype="fp32")
    linears = [m for m in pipe.transformer.modules() if isinstance(m, GGUFLinear)]
    assert {m.qtype for m in linears} == {k for k in BLOCKS if k.startswith("Q")}  # kept quantized in memory
    assert all(m.weight.dtype == torch.uint8 for m in linears)
    expected = one_forward(cosmos3_runtime.load(dense, device="cpu", dtype="fp32"))
    torch.testing.assert_close(one_forward(pipe), expected, atol=1e-5, rtol=1e-5)


def test_text_offload_and_block_swap_move_the_quantized_bytes(every_type):
    quantized, _ = every_type
    plain = cosmos3_runtime.load(quantized, device="cpu", dtype="fp32").generate("a cat", **REQUEST).latents
    pipe = cosmos3_runtime.load(quantized, device="cpu", dtype="fp32", offload_text=True, blocks_to_swap=2)
    assert torch.equal(pipe.generate("a cat", **REQUEST).latents, plain)
    swapped = [p for p in pipe.block_swap.held() if p.dtype == torch.uint8]
    assert swapped and all(p.device.type == "cpu" for p in swapped)


def test_transformer_file_points_at_a_gguf_anywhere(every_type, tmp_path):
    quantized, dense = every_type
    moved = tmp_path / "elsewhere.gguf"
    shutil.copy(next((quantized / "transformer").glob("*.gguf")), moved)
    pipe = cosmos3_runtime.load(dense, device="cpu", dtype="fp32", transformer_file=moved)
    assert any(isinstance(m, GGUFLinear) for m in pipe.transformer.modules())


@pytest.fixture(scope="module")
def converted(tiny_factory, tmp_path_factory):
    """The small bf16 checkpoint and its Q8_0 and Q4_0 conversions (each a checkpoint folder)."""
    base = tiny_factory(kind="gated", size="small")
    tmp = tmp_path_factory.mktemp("converted")
    folders = {}
    for qtype in ("q8_0", "q4_0"):
        folders[qtype] = without_weights(base, tmp / qtype)
        convert(base, folders[qtype] / "transformer" / f"small-{qtype}.gguf", qtype)
    return base, folders


# Round-to-nearest Q4_0 errs by 8.6 % per linear on Gaussian weights (as the gguf package quantizes); through
# the small config's 6 random-weight layers that compounds to about 20 % (Q8_0: 0.53 % per linear, 1.2 %).
@pytest.mark.parametrize("qtype,bound", [("q8_0", 0.015), ("q4_0", 0.22)])
def test_converted_files_stay_close_to_bf16(converted, qtype, bound):
    base, folders = converted
    expected = one_forward(cosmos3_runtime.load(base, device="cpu", dtype="fp32"))  # the bf16 weights, exactly
    got = one_forward(cosmos3_runtime.load(folders[qtype], device="cpu", dtype="fp32"))
    error = ((got - expected).abs().mean() / expected.abs().mean()).item()
    assert error < bound, error
    assert error > 1e-4  # the weights really are quantized


def test_converter_keeps_sensitive_tensors_in_bf16_and_records_what_it_did(converted):
    base, folders = converted
    file = GGUFFile(next((folders["q8_0"] / "transformer").glob("*.gguf")))
    for name, (qtype, shape) in file.tensors.items():
        block_linear = name.startswith("layers.") and len(shape) == 2
        assert qtype == ("Q8_0" if block_linear else "BF16"), name
    assert "lm_head.weight" not in file.tensors  # never read by generation: left out
    assert file.field("cosmos3.quantization") == "Q8_0" and file.field("cosmos3.kept_type") == "BF16"
    assert file.field("cosmos3.variant") == cosmos3_runtime.load(base, load_vae_weights=False).variant.describe()
    assert len(file.field("cosmos3.source_config_sha256")) == 64


def test_quantize_and_info_on_the_command_line(converted, tmp_path, capsys):
    base, _ = converted
    out = tmp_path / "small-q5_1.gguf"
    assert cli(["quantize", str(base), str(out), "--type", "q5_1"]) == 0
    assert "Q5_1 " in capsys.readouterr().out and not Path(str(out) + ".partial").exists()
    assert cli(["info", str(base), "--transformer-file", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "transformer GGUF small-q5_1.gguf: BF16" in printed and "quantization Q5_1" in printed
    with pytest.raises(SystemExit):  # argparse: not a type the gguf package writes
        cli(["quantize", str(base), str(tmp_path / "x.gguf"), "--type", "q6_k"])
    assert cli(["quantize", str(base), str(tmp_path / "x.bin")]) == 2
    assert "must end in .gguf" in capsys.readouterr().err


def replace_gguf(folder: Path, tensors: dict, architecture="cosmos3") -> Path:
    for old in (folder / "transformer").glob("*.gguf"):
        old.unlink()
    return write_gguf(folder / "transformer" / "model.gguf", tensors, architecture)


@pytest.fixture
def broken(every_type, tmp_path):
    """A copy of the every-type GGUF checkpoint and its tensors ({name: (type, data)}) to break."""
    quantized, _ = every_type
    folder = Path(shutil.copytree(quantized, tmp_path / "broken"))
    file = GGUFFile(next((folder / "transformer").glob("*.gguf")))
    tensors = {}
    for name, (qtype, shape) in file.tensors.items():
        data = file.data(name).numpy()
        tensors[name] = (qtype, data.view(np.float32).reshape(shape) if qtype == "F32" else
                         data.view(np.float16).reshape(shape) if qtype == "F16" else data.reshape(shape[0], -1)
                         if len(shape) == 2 else data)
    return folder, tensors


@pytest.mark.parametrize("architecture", ["wan", "flux"])
def test_another_models_gguf_names_its_architecture(broken, architecture):
    folder, tensors = broken
    replace_gguf(folder, tensors, architecture)
    with pytest.raises(CheckpointError, match=f"architecture '{architecture}', not 'cosmos3'"):
        cosmos3_runtime.load(folder, device="cpu")


def test_missing_and_misshaped_tensors_are_named(broken):
    folder, tensors = broken
    replace_gguf(folder, {k: v for k, v in tensors.items() if k != "layers.0.mlp.up_proj.weight"})
    with pytest.raises(CheckpointError, match=r"tensor layers\.0\.mlp\.up_proj\.weight is missing"):
        cosmos3_runtime.load(folder, device="cpu")
    norm = tensors["layers.0.input_layernorm.weight"]
    replace_gguf(folder, {**tensors, "layers.0.input_layernorm.weight": ("F32", norm[1][:128])})
    with pytest.raises(CheckpointError, match=r"tensor layers\.0\.input_layernorm\.weight has shape \[128\], the "
                       r"folder's config\.json implies \[256\]"):
        cosmos3_runtime.load(folder, device="cpu")


def test_a_truncated_file_says_so(broken):
    folder, _ = broken
    path = next((folder / "transformer").glob("*.gguf"))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="is truncated: tensor .* ends at byte|truncated or corrupt"):
        cosmos3_runtime.load(folder, device="cpu")


def test_an_unsupported_type_is_named(broken):
    folder, tensors = broken
    name = "layers.0.mlp.up_proj.weight"
    rows, width = 256, 256
    iq4 = np.zeros((rows, width // 32 * 18), dtype=np.uint8)  # IQ4_NL: 32 values in 18 bytes
    replace_gguf(folder, {**tensors, name: ("IQ4_NL", iq4)})
    with pytest.raises(CheckpointError, match=f"{name} is stored as GGUF type IQ4_NL, which this runtime does not read"):
        cosmos3_runtime.load(folder, device="cpu")


def test_gguf_next_to_safetensors_is_ambiguous(broken, every_type):
    folder, _ = broken
    _, dense = every_type
    shutil.copy(dense / "transformer" / "diffusion_pytorch_model.safetensors", folder / "transformer")
    with pytest.raises(CheckpointError, match=r"holds both model\.gguf|cosmos3-mixed\.gguf.*"
                       r"diffusion_pytorch_model\.safetensors.*ambiguous"):
        cosmos3_runtime.load(folder, device="cpu")


def test_options_that_cannot_apply_to_gguf_are_refused(every_type, tmp_path):
    quantized, dense = every_type
    with pytest.raises(InputError, match="a GGUF file is already quantized"):
        cosmos3_runtime.load(quantized, device="cpu", quantize="fp8")
    with pytest.raises(CheckpointError, match="is not a .gguf file"):
        cosmos3_runtime.load(dense, device="cpu", transformer_file=dense / "transformer" / "config.json")
    with pytest.raises(CheckpointError, match="does not exist"):
        cosmos3_runtime.load(dense, device="cpu", transformer_file=tmp_path / "none.gguf")
    with pytest.raises(InputError, match="already holds a GGUF file"):
        convert(quantized, tmp_path / "again.gguf")
    json.loads((quantized / "transformer" / "config.json").read_text())  # the folder is untouched


@pytest.mark.slow  # two worker processes
def test_worker_processes_load_the_gguf_file_too(every_type, tmp_path):
    from cosmos3_runtime.workers import WorkerPool

    quantized, dense = every_type
    moved = shutil.copy(next((quantized / "transformer").glob("*.gguf")), tmp_path / "moved.gguf")
    expected = cosmos3_runtime.load(quantized, device="cpu", dtype="fp32").generate("a cat", **REQUEST).latents
    pool = WorkerPool(str(dense), ["cpu", "cpu"], sp=2, dtype="fp32", local_files_only=True, transformer_file=str(moved))
    try:
        request = {k: v for k, v in REQUEST.items() if k != "output"}  # the pool always hands back latents
        torch.testing.assert_close(pool.generate("a cat", **request).latents, expected, atol=1e-5, rtol=0)
    finally:
        pool.close()
