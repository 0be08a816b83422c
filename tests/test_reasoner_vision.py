"""The Reasoner's vision towers (Qwen3-VL for Nano/Super, SigLIP2 for Edge): per-image attention, positions, dtypes."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosmos3_runtime.reasoner import tiny, vision_edge, vision_qwen
from cosmos3_runtime.reasoner.config import EDGE, OMNI, EdgeVisionConfig, ProcessorConfig, QwenVisionConfig
from cosmos3_runtime.reasoner.processing import patchify, prepare_image

TEXT_HIDDEN = 48
FAMILIES = (OMNI, EDGE)
rng = np.random.RandomState(0)
WIDE = (rng.rand(64, 96, 3) * 255).astype(np.uint8)  # grid (1, 4, 6)
TALL = (rng.rand(128, 64, 3) * 255).astype(np.uint8)  # grid (1, 8, 4)


def build_tower(family: str, seed: int = 0, dtype: torch.dtype = torch.float32):
    """The tiny checkpoint's tower shape (reasoner/tiny.py) with its kind of random weights, on the CPU."""
    config = tiny.TINY_VISION[family]
    if family == OMNI:
        tower = vision_qwen.QwenVisionTower(QwenVisionConfig(**{**config.__dict__, "out_hidden_size": TEXT_HIDDEN}))
    else:
        tower = vision_edge.EdgeVisionTower(EdgeVisionConfig(**{**config.__dict__, "text_hidden_size": TEXT_HIDDEN}))
    tower.load_state_dict(tiny.random_vision_weights(tower, torch.Generator().manual_seed(seed)))
    return tower.to(dtype).eval()


def processor(family: str) -> ProcessorConfig:
    return ProcessorConfig(min_pixels=tiny.IMAGE_SIZE["shortest_edge"], max_pixels=tiny.IMAGE_SIZE["longest_edge"],
                           temporal_patch_size=2 if family == OMNI else 1)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tensors this small gain nothing from intra-op threads, and on a busy machine waiting for them costs seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def tower(family):
    return build_tower(family)


def run(tower, inputs):
    """Tokens and deepstack features of several (pixels, grid) pairs encoded in one call."""
    pixels = torch.cat([p for p, _ in inputs])
    with torch.no_grad():
        return tower(pixels, [g for _, g in inputs])


def assert_close(got: torch.Tensor, expected: torch.Tensor, atol: float, what: str = "") -> None:
    """Same shape and dtype, at most `atol` apart (torch.testing.assert_close imports torch.distributed: seconds)."""
    assert got.shape == expected.shape and got.dtype == expected.dtype, what
    error = (got - expected).abs().max().item()
    assert error <= atol, f"{what} max error {error}"


def tokens_of(grid) -> int:
    t, h, w = grid
    return t * h * w // 4


def test_output_shapes(family, tower):
    image = prepare_image(WIDE, family, processor(family))
    assert image.grid == (1, 4, 6)
    tokens, deepstack = run(tower, [(image.pixels, image.grid)])
    assert tokens.shape == (6, TEXT_HIDDEN) and tokens.dtype == torch.float32
    assert torch.isfinite(tokens).all()
    if family == OMNI:
        assert len(deepstack) == len(tiny.TINY_VISION[OMNI].deepstack_visual_indexes)
        assert all(d.shape == (6, TEXT_HIDDEN) for d in deepstack)
        assert not torch.allclose(deepstack[0], deepstack[1])  # each tap has its own merger and depth
    else:
        assert deepstack == []


def test_two_images_in_one_call_equal_each_alone(family, tower):
    p = processor(family)
    images = [prepare_image(a, family, p) for a in (WIDE, TALL)]
    assert images[0].grid != images[1].grid
    together, together_deep = run(tower, [(i.pixels, i.grid) for i in images])
    splits = [tokens_of(i.grid) for i in images]
    for k, image in enumerate(images):
        alone, alone_deep = run(tower, [(image.pixels, image.grid)])
        assert_close(together.split(splits)[k], alone, 1e-5)
        assert len(alone_deep) == len(together_deep)
        for layer, expected in zip(together_deep, alone_deep):
            assert_close(layer.split(splits)[k], expected, 1e-5)


def test_other_image_pixels_leave_an_image_bit_identical(family, tower):
    p = processor(family)
    first, second = prepare_image(WIDE, family, p), prepare_image(TALL, family, p)
    changed = second.pixels + torch.randn(second.pixels.shape, generator=torch.Generator().manual_seed(1))
    before, before_deep = run(tower, [(first.pixels, first.grid), (second.pixels, second.grid)])
    after, after_deep = run(tower, [(first.pixels, first.grid), (changed, second.grid)])
    n = tokens_of(first.grid)
    assert torch.equal(before[:n], after[:n])
    assert all(torch.equal(b[:n], a[:n]) for b, a in zip(before_deep, after_deep))
    assert (before[n:] - after[n:]).abs().max() > 1e-2  # the changed image itself does change


def test_each_video_slice_attends_only_to_itself(family, tower):
    """A clip's temporal slices are encoded as if each were an image of its own (same grid, same positions)."""
    p = processor(family)
    frames = torch.randn(4, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    pixels, grid = patchify(frames, family, p)
    t, h, w = grid
    assert t == (2 if family == OMNI else 4)
    clip, _ = run(tower, [(pixels, grid)])
    for i, (slice_pixels, slice_tokens) in enumerate(zip(pixels.split(h * w), clip.split(h * w // 4))):
        alone, _ = run(tower, [(slice_pixels, (1, h, w))])
        assert_close(slice_tokens, alone, 1e-5, f"slice {i}")
    assert not torch.allclose(clip[: h * w // 4], clip[h * w // 4: 2 * h * w // 4], atol=1e-3)


def test_block_order_matters(family, tower):
    """Positions are part of the encoding: the same 2x2 blocks in another order are not just reordered tokens."""
    image = prepare_image(WIDE, family, processor(family))
    tokens, _ = run(tower, [(image.pixels, image.grid)])
    blocks = image.pixels.view(-1, 4, image.pixels.shape[-1])
    reordered, _ = run(tower, [(blocks.flip(0).reshape(image.pixels.shape), image.grid)])
    assert (tokens - reordered.flip(0)).abs().max() > 1e-2


def test_the_position_table_shapes_the_tokens(family, tower):
    image = prepare_image(TALL, family, processor(family))
    flat = build_tower(family)
    table = flat.pos_embed if family == OMNI else flat.visual.embeddings.position_embedding
    with torch.no_grad():
        table.weight.zero_()
    tokens, flat_tokens = run(tower, [(image.pixels, image.grid)])[0], run(flat, [(image.pixels, image.grid)])[0]
    assert (tokens - flat_tokens).abs().max() > 1e-2


def test_qwen_rotary_shapes_the_tokens(monkeypatch):
    tower = build_tower(OMNI)
    image = prepare_image(TALL, OMNI, processor(OMNI))
    tokens, _ = run(tower, [(image.pixels, image.grid)])
    d = tower.config.hidden_size // tower.config.num_heads
    n = image.pixels.shape[0]
    monkeypatch.setattr(tower, "rotary", lambda grids, device: (torch.ones(n, d), torch.zeros(n, d)))  # no rotation
    unrotated, _ = run(tower, [(image.pixels, image.grid)])
    assert (tokens - unrotated).abs().max() > 1e-2


def test_qwen_deepstack_features_are_each_mergers_view_of_its_block():
    tower = build_tower(OMNI)
    image = prepare_image(WIDE, OMNI, processor(OMNI))
    hidden = {}
    for i, block in enumerate(tower.blocks):
        block.register_forward_hook(lambda module, args, out, i=i: hidden.__setitem__(i, out))
    tokens, deepstack = run(tower, [(image.pixels, image.grid)])
    indexes = tower.config.deepstack_visual_indexes
    assert len(deepstack) == len(indexes) and len(hidden) == tower.config.depth
    with torch.no_grad():
        for k, i in enumerate(indexes):
            assert torch.equal(deepstack[k], tower.deepstack_merger_list[k](hidden[i])), f"deepstack {k}"
        assert torch.equal(tokens, tower.merger(hidden[tower.config.depth - 1]))


def merge_block_order(h: int, w: int) -> list[tuple[int, int]]:
    """(row, col) of each patch, 2x2 merge blocks in row-major order, row-major inside a block."""
    return [(2 * br + dr, 2 * bc + dc) for br in range(h // 2) for bc in range(w // 2) for dr in (0, 1) for dc in (0, 1)]


def test_qwen_positions_are_the_table_bilinearly_resampled_with_corners_aligned():
    tower = build_tower(OMNI)
    side = int(tower.config.num_position_embeddings**0.5)
    table = tower.pos_embed.weight.detach()
    image = table.view(side, side, -1).permute(2, 0, 1).unsqueeze(0)
    with torch.no_grad():
        for h, w in ((side, side), (6, 10), (4, 2), (12, 16)):
            got = tower.position_embedding([(2, h, w)], torch.device("cpu"))
            resampled = F.interpolate(image, size=(h, w), mode="bilinear", align_corners=True)[0]
            expected = torch.stack([resampled[:, r, c] for r, c in merge_block_order(h, w)])
            assert_close(got, expected.repeat(2, 1), 1e-5, f"{h}x{w}")
        # at the table's own size each patch gets exactly its own row of the table
        rows = [r * side + c for r, c in merge_block_order(side, side)]
        assert torch.equal(tower.position_embedding([(1, side, side)], torch.device("cpu")), table[rows])


def test_qwen_rotary_angles_follow_row_and_column():
    tower = build_tower(OMNI)
    d = tower.config.hidden_size // tower.config.num_heads
    cos, sin = tower.rotary([(1, 4, 6)], torch.device("cpu"))
    assert cos.shape == sin.shape == (24, d) and cos.dtype == torch.float32
    inv_freq = 1.0 / vision_qwen.ROPE_THETA ** (torch.arange(0, d // 2, 2).float() / (d // 2))
    for i, (r, c) in enumerate(merge_block_order(4, 6)):
        half = torch.cat([r * inv_freq, c * inv_freq])
        assert_close(cos[i], torch.cat([half, half]).cos(), 1e-6, f"cos {r},{c}")
        assert_close(sin[i], torch.cat([half, half]).sin(), 1e-6, f"sin {r},{c}")


def test_edge_positions_are_the_table_resized_per_grid():
    tower = build_tower(EDGE)
    embeddings = tower.visual.embeddings
    side = int(tower.config.num_patches**0.5)
    table = embeddings.position_embedding.weight.detach()
    with torch.no_grad():
        native = embeddings.positions([(1, side, side)], torch.device("cpu"))
        rows = [r * side + c for r, c in merge_block_order(side, side)]
        assert_close(native, table[rows], 1e-6)  # same size: the table itself
        image = table.view(side, side, -1).permute(2, 0, 1).unsqueeze(0)
        for h, w in ((6, 8), (2, 2), (2, 6)):  # larger and smaller than the table (antialiased when shrunk)
            resized = F.interpolate(image, size=(h, w), mode="bilinear", align_corners=False, antialias=True)[0]
            expected = torch.stack([resized[:, r, c] for r, c in merge_block_order(h, w)])
            got = embeddings.positions([(3, h, w)], torch.device("cpu"))
            assert_close(got, expected.repeat(3, 1), 1e-6, f"{h}x{w}")


def test_bfloat16_towers_run_on_the_cpu_close_to_float32(family, tower):
    """bf16 weights on the CPU (Edge resizes its position table in fp32: bf16 has no antialiased kernel there)."""
    image = prepare_image(TALL, family, processor(family))
    half = build_tower(family, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    low, low_deep = run(half, [(image.pixels, image.grid)])
    high, high_deep = run(tower, [(image.pixels, image.grid)])
    assert low.dtype == torch.bfloat16
    scale = high.abs().max()
    assert (low.float() - high).abs().max() < 0.1 * scale
    for a, b in zip(low_deep, high_deep):
        assert (a.float() - b).abs().max() < 0.1 * b.abs().max()
