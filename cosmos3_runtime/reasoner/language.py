"""The Reasoner's language model: the generator's text tower (the same tensors) plus a small head.

The generator never needs the last layer's query, output projection and MLP, the final norm or the
output head, so it does not load them; `ReasonerHead` holds exactly those. Decoding keeps a K/V cache
per layer: the prompt is run once (prefill), then one token per step: `forward` over the cache's filled rows,
or `decode_step`, whose shapes never change (the whole preallocated cache, the rows not yet written masked)
so that torch.compile captures it once and CUDA graphs can replay it.

Norms run in the Llama/Qwen form (w * normed.to(dtype)) for both families, as the reference Reasoner
does; the generator's Edge text tower uses the Nemotron form on the same gains for its K/V.

Notation: L tokens, H hidden, A query heads, K key/value heads, D head dim, V vocabulary.
"""

import torch
from torch import nn

from ..rope import apply_rope, inverse_frequencies, mrope_cos_sin
from ..transformer import MLP, Cosmos3Transformer, TransformerConfig, attention, linear, make_norm


class ReasonerHead(nn.Module):
    """What the Reasoner needs beyond the generator's text tower. Names map from checkpoint keys by `head_key`."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        H, A, D = config.hidden_size, config.num_attention_heads, config.head_dim
        self.to_q = linear(H, A * D, bias=config.attention_bias)
        self.to_out = linear(A * D, H, bias=config.attention_bias)
        self.norm_q = make_norm(config, D) if config.qk_norm_for_text else nn.Identity()
        self.post_attention_layernorm = make_norm(config, H)
        self.mlp = MLP(config)
        self.norm = make_norm(config, H)
        self.lm_head = linear(H, config.vocab_size, bias=False)


def head_key_mapper(config: TransformerConfig):
    """Checkpoint key -> ReasonerHead parameter name, or None for every other tensor."""
    last = f"layers.{config.num_hidden_layers - 1}."

    def map_key(key: str) -> str | None:
        if key in ("lm_head.weight", "norm.weight"):
            return key
        for part in ("self_attn.to_q.", "self_attn.to_out.", "self_attn.norm_q.", "post_attention_layernorm.", "mlp."):
            if key.startswith(last + part):
                return key[len(last) :].removeprefix("self_attn.")
        return None

    return map_key


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm in the reference Reasoner's form with `norm`'s gain and epsilon (identity stays identity)."""
    if isinstance(norm, nn.Identity):
        return x
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight.to(x.device) * normed.to(x.dtype)


class KVCache:
    """Keys and values of every layer, preallocated for the prompt and every new token."""

    def __init__(self, config: TransformerConfig, length: int, dtype: torch.dtype, device: torch.device):
        shape = (config.num_hidden_layers, length, config.num_key_value_heads, config.head_dim)
        # zeros, not empty: the fixed-shape step multiplies the masked rows' values by 0, and 0 x NaN is NaN
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0  # tokens stored


class LanguageModel:
    """Runs the shared text tower with the head. Not a module: the tower belongs to the generator."""

    def __init__(self, tower: Cosmos3Transformer, head: ReasonerHead):
        self.tower, self.head = tower, head
        self.config = tower.config
        self.inv_freq = None

    def embed(self, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        table = self.tower.embed_tokens
        return table(ids.to(table.weight.device)).to(device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, deepstack=None) -> torch.Tensor:
        """Hidden states x [L, H] of the next L tokens at positions [3, L] -> fp32 logits [V] of the last one.

        `deepstack`: (mask [L] of visual positions, features per early layer), added after those layers.
        """
        start, end = cache.length, cache.length + x.shape[0]
        logits = self._layers(x, positions, cache.keys, cache.values, slice(start, end), deepstack)
        cache.length = end
        return logits

    def decode_step(self, x: torch.Tensor, positions: torch.Tensor, row: torch.Tensor, keys: torch.Tensor,
                    values: torch.Tensor) -> torch.Tensor:
        """One token x [1, H] at positions [3, 1], its K/V written at cache row `row` ([1] on the device) of the
        caches' `keys` / `values`; it attends to rows up to its own. -> fp32 logits [V]."""
        return self._layers(x, positions, keys, values, row, None)

    def _layers(self, x, positions, keys, values, rows, deepstack) -> torch.Tensor:
        """Run the tower and head; `rows` is a slice of cache rows (attending to the rows before its end) or a
        one-row tensor (attending to the whole cache, later rows masked)."""
        c = self.config
        A, K, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        if self.inv_freq is None or self.inv_freq.device != x.device:
            self.inv_freq = inverse_frequencies(D, c.rope_theta, device=x.device)
        cos, sin = mrope_cos_sin(positions.to(x.device), self.inv_freq, c.rope_axes_dim, x.dtype)
        n = x.shape[0]
        static = isinstance(rows, torch.Tensor)
        mask = torch.arange(keys.shape[1], device=x.device) <= rows if static else None
        for i, layer in enumerate(self.tower.layers):
            attn = layer.self_attn
            own = self.head if not layer.text_output else None  # the last layer's query side lives in the head
            h = rms_norm(layer.input_layernorm, x)
            q = (own or attn).to_q(h).view(n, A, D)
            k, v = attn.to_k(h).view(n, K, D), attn.to_v(h).view(n, K, D)
            q, k = rms_norm((own or attn).norm_q, q), rms_norm(attn.norm_k, k)
            if static:
                keys[i, rows] = apply_rope(k, cos, sin)
                values[i, rows] = v
                out = attention(apply_rope(q, cos, sin), keys[i], values[i], mask=mask)
            else:
                keys[i, rows], values[i, rows] = apply_rope(k, cos, sin), v
                out = attention(apply_rope(q, cos, sin), keys[i, : rows.stop], values[i, : rows.stop], causal=n > 1)
            x = x + (own or attn).to_out(out)
            x = x + (own or layer).mlp(rms_norm((own or layer).post_attention_layernorm, x))
            if deepstack is not None and i < len(deepstack[1]):
                mask, features = deepstack
                x = x.clone()
                x[mask] += features[i].to(x.device, x.dtype)
        return self.head.lm_head(rms_norm(self.head.norm, x[-1:]))[0].float()
