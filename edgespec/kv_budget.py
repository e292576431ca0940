"""How much KV cache memory a sequence takes: the numbers behind the server's KV memory budget.

Contract: ``kv_bytes_per_token(target)`` is the bytes one committed token's keys and values take
in ``target``'s cache: summed over the layers that own keys/values (a KV-shared layer reads its
source's, a recurrent layer keeps a fixed-size state instead), each layer's KV heads x head size
for keys and for values, in the activations' dtype. It reads each layer's attention module
(``kv`` heads and ``d`` head size, as ``targets/parts.Attention`` and Gemma 4's name them) and
falls back to the config's ``num_key_value_heads`` / ``head_dim``. It counts neither the
cache's growth in blocks nor a step's scratch rows for the draft tree, nor a fixed-size
recurrent state: a lower bound on what a sequence of that length holds, so a request refused
against it could never have fitted. ``kv_bytes(target, draft, tokens)`` adds a draft model's
cache (it holds the same tokens).
"""

from __future__ import annotations

# ``edgespec serve --kv-budget-mb``'s default: a fixed size, whatever the machine's RAM, so a
# server behaves the same on every machine; it holds a 4,096-token request of an 8B model with
# 8 KV heads of 128 in float32 (256 KiB a token).
KV_BUDGET_MB = 2048
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def kv_bytes_per_token(target) -> int:
    """Bytes of keys + values one token takes in ``target``'s cache (see the module docstring)."""
    model, args = target.model, target.args
    sources, recurrent = model.kv_sources(), set(model.state_layers())
    layers = model.model.layers
    size = _itemsize(target)
    total = 0
    for i in range(args.num_hidden_layers):
        if sources[i] != i or i in recurrent:
            continue
        attn = getattr(layers[i], "self_attn", None)
        heads = getattr(attn, "kv", None) or args.num_key_value_heads
        dim = getattr(attn, "d", None) or args.head_dim
        total += 2 * heads * dim * size  # keys and values
    return total


def kv_bytes(target, draft, tokens: int) -> int:
    """Bytes of KV cache ``tokens`` tokens take in ``target``'s cache and, when a draft model is
    loaded, in the draft model's too."""
    per_token = kv_bytes_per_token(target) + (kv_bytes_per_token(draft) if draft is not None else 0)
    return tokens * per_token


def _itemsize(target) -> int:
    """Bytes per cached element: the activations' dtype, which is the final norm's weight
    dtype (a quantized model keeps its norms, and computes, in float)."""
    norm = getattr(getattr(target.model, "model", None), "norm", None)
    weight = getattr(norm, "weight", None)
    if weight is not None and weight.dtype.size in (2, 4):
        return weight.dtype.size
    return _ITEMSIZE.get(target.dtype, 4)
