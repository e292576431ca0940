"""What every family's model shares: its config fields and the one layer loop.

A family file (``llama.py``, ``qwen3.py``, ``gemma3.py``, ...) defines ``ModelArgs`` (a subclass of
:class:`DecoderArgs` with the family's own fields and defaults) and ``Model`` (a subclass of
:class:`Decoder` given its blocks and final norm; the weights keep Hugging Face's names:
``model.embed_tokens``, ``model.layers.N``, ``model.norm``, ``lm_head``). The loop, the head and the cache policy live here; a family overrides
``embed`` (Gemma scales the embedding), ``logits`` (soft-capping), ``cache_windows`` (which
layers slide) or ``sanitize`` (fused checkpoint weights) where it differs.

The contract every block keeps: ``block(x, positions, mask, cache, slot)`` with ``positions`` an
int32 scalar (a chain starting there) or one position per node (a tree), ``mask`` this slot's
additive or boolean mask (or None), and keys/values written with ``cache.write(slot, k, v)``;
nothing here commits. ``fuse()`` returns whether the block now runs a fused fast path.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields
from typing import ClassVar

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..cache import KVCache
from ..errors import ModelLoadError
from ..kernels import native
from ..kernels.attention import prepare
from ..kernels.backend import q8_scope
from ..kernels.fused_block import ManyMasks, mask_runs_native
from ..kernels.matmul import halves, linear
from ..kernels.qmatmul import embedding_rows
from .weight_arena import advise_huge_pages, huge_pages_wanted, pack_blocks


def _native_stack(blocks) -> tuple:
    """(each block's fused form, its native arguments, a ``DecoderStack`` of them or None when
    some block has no native form or the native module is not loaded): ``_stack_for``'s."""
    fused = [getattr(b, "_fused", None) for b in blocks]
    args = [None if f is None else f.native_args for f in fused]
    mod = native.load()
    if mod is None or not hasattr(mod, "DecoderStack") or not fused or not all(
            f is not None and f.native_ready() for f in fused):
        return fused, args, None
    return fused, args, mod.DecoderStack(args, [f.stack_shape for f in fused])


@dataclass
class DecoderArgs:
    """The config fields every family reads (Hugging Face names); unknown keys are dropped."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    vocab_size: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 2048
    # checked at load (``check_layers``): the values a family's ``layer_types`` may hold (one
    # per layer), and its "every n-th layer" fields, which must be integers >= 1
    LAYER_TYPES: ClassVar[tuple[str, ...]] = ()
    PERIODS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, config: dict):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in known})

    def __post_init__(self) -> None:
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        self.head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        self.check_layers()

    def check_layers(self) -> None:
        """ModelLoadError, naming the field and what is allowed, for a config whose layer
        pattern cannot be read: a period below 1, or ``layer_types`` (where the family reads
        them and the config gives them) not one allowed type per layer."""
        for name in self.PERIODS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelLoadError(f"{self.model_type} config: {name} is {value!r}; it must be "
                                     "an integer >= 1 (every n-th layer)")
        types = getattr(self, "layer_types", None)
        if not self.LAYER_TYPES or types is None:
            return
        bad = [t for t in types if t not in self.LAYER_TYPES] if isinstance(types, list) else types
        if bad or len(types) != self.num_hidden_layers:
            raise ModelLoadError(
                f"{self.model_type} config: layer_types must list one of "
                f"{', '.join(self.LAYER_TYPES)} for each of its num_hidden_layers "
                f"({self.num_hidden_layers}); got {len(types) if isinstance(types, list) else 0} "
                f"entries{f' (not allowed: {sorted(set(map(str, bad)))[:4]})' if bad else ''}")


class Decoder(nn.Module):
    """A family's model: ``__call__`` runs (some of) its layers writing the cache's scratch
    slots; ``logits`` applies the final norm and the LM head. ``Target.score`` is the one caller."""

    def __init__(self, args: DecoderArgs, blocks: list[nn.Module], norm: nn.Module):
        super().__init__()
        self.args = args
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.model.layers = blocks
        self.model.norm = norm
        self.huge_page_bytes = 0  # of the streamed weights on huge pages, set by fuse()
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def embed(self, tokens: mx.array) -> mx.array:
        return embedding_rows(self.model.embed_tokens, tokens)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """A checkpoint's weights renamed or split into this model's modules (phi3's fused
        projections); called by ``load_target`` before quantization and loading."""
        return weights

    def cache_windows(self) -> list[int | None]:
        """The cache policy: per layer, its sliding window (None: it attends to everything)."""
        return [None] * self.args.num_hidden_layers

    def kv_sources(self) -> list[int]:
        """Per layer, the layer whose keys/values it attends to (itself unless it shares an
        earlier layer's: ``KVCache`` sources)."""
        return list(range(self.args.num_hidden_layers))

    def state_layers(self) -> list[int]:
        """The layers that keep a recurrent state instead of keys/values (hybrid families:
        ``targets/recurrent.py``); ``Target.make_cache`` then makes a ``HybridCache``."""
        return []

    def layer_inputs(self, tokens: mx.array) -> mx.array | None:
        """Per-layer inputs of ``tokens`` (1, N): None, or (1, N, L, P) whose ``[:, :, i]``
        block ``i`` takes as a sixth argument (Gemma 4's per-layer embeddings)."""
        return None

    def __call__(self, tokens, positions, masks: Sequence, cache: KVCache,
                 layers: Sequence[int] | None = None, hidden: mx.array | None = None,
                 capture: Collection[int] = ()) -> tuple[mx.array, dict[int, mx.array]]:
        """Run ``layers`` (increasing ids; default all) over ``tokens`` (1, N), or over ``hidden``
        (1, N, H) in place of their embedding (``tokens`` are still given: per-layer inputs).
        ``masks[slot]`` is the mask of the layer using cache slot ``slot`` (``Target.score``
        builds them). Returns the last layer's output (1, N, H) and, for each id in
        ``capture``, the hidden state entering that layer (id L: the last output).

        Cache slot of layer ``i``: ``i`` when the cache has a slot per layer of the model,
        otherwise the position of ``i`` in ``layers`` (a cache made for that subset).
        """
        if layers is None:
            stack = self._stack_for(tokens, masks, cache, hidden)
            if stack is not None:
                return self._run_stack(stack, tokens, masks, cache, hidden, capture)
        with q8_scope(self.native_blocks()):
            return self._run(tokens, positions, masks, cache, layers, hidden, capture)

    def _stack_for(self, tokens, masks, cache, hidden):
        """The blocks as one native call (``native.DecoderStack``) when every block of this
        forward would run as one native operation in ``_run`` (the checks
        ``FusedBlock.__call__`` makes, for every layer); else None.

        The stack makes the per-layer path's operations, in its order, in one call: the same
        bits, without the per-layer Python and argument conversion on the host thread, which
        a step that is not pipelined (a verification) waits for before anything runs. It is
        made once for the blocks' native forms and again when any block's changes (fused
        anew, or its native arguments set aside)."""
        blocks = self.model.layers
        if (tokens.shape[0] != 1 or len(masks) != len(blocks) or cache.num_layers != len(blocks)
                or (hidden is not None and hidden.dtype != mx.float32)):
            return None
        stack = self._current_stack()
        if stack is None:
            return None
        # every block is native here (the stack has each one's native form), so each runs
        # native where its mask does (``FusedBlock.runs_native``), asked once per distinct
        # mask; ``_run`` would ask the masks inside q8_scope(True)
        n, seen = tokens.shape[1], {}
        with q8_scope(True):
            for m in masks:
                if id(m) not in seen:
                    seen[id(m)] = mask_runs_native(n, m)
        if not all(seen.values()):
            return None
        if any(m.cached != cache.slots(i) for i, m in enumerate(masks)):
            return None  # a mask not over its layer's cached keys
        return stack

    def _current_stack(self):
        """The ``DecoderStack`` of the blocks' current native forms (made again when a block's
        changes), or None: some block has none, or this family runs its layers its own way."""
        if (type(self)._run is not Decoder._run
                or type(self).layer_inputs is not Decoder.layer_inputs):
            return None
        blocks = self.model.layers
        held = self._stack
        if held is not None and len(held[0]) == len(blocks):
            stack, current = held[2], True
            for b, f, a in zip(blocks, held[0], held[1]):  # one pass over the blocks
                if (getattr(b, "_fused", None) is not f
                        or (f is not None and f.native_args is not a)):
                    break  # a block changed: made again below
                current = current and (stack is None or f.current(b))
            else:
                return stack if current else None
        held = _native_stack(blocks)
        object.__setattr__(self, "_stack", held)  # a plain attribute, not a parameter
        stack = held[2]
        if stack is None or not all(f.current(b) for f, b in zip(held[0], blocks)):
            return None
        return stack

    def _run_stack(self, stack, tokens, masks, cache, hidden, capture):
        """``_run`` through ``stack`` (``_stack_for``): the same outputs and cache rows."""
        x = self.embed(tokens) if hidden is None else hidden
        n = x.shape[1]
        in_place, after = cache.in_place_buffers()
        keys, values, slots, ancs, qposs, starts, windows = [], [], [], [], [], [], []
        for i, (m, f) in enumerate(zip(masks, self._stack[0])):
            k, v, at = cache.write_buffers(i, n, f.native_shape[2], f.native_shape[3],
                                           in_place=in_place)
            keys.append(k)
            values.append(v)
            slots.append(at)
            anc, qpos = m.device_arrays
            ancs.append(anc)
            qposs.append(qpos)
            starts.append(m.key_start)
            windows.append(m.window or 0)
        wanted = sorted(c for c in set(capture) if 0 <= c <= len(keys))
        out, new_keys, new_values, got = stack.forward(
            x, keys, values, ancs, qposs, slots, starts, windows, masks[0].native_block[1],
            wanted, in_place, after)
        if not new_keys:
            cache.wrote(out)  # the rows went into the buffers given
        else:  # new buffers: the cache lent its arrays, or its layers differ in kv shape
            for i, (k, v) in enumerate(zip(new_keys, new_values)):
                cache.set_buffers(i, k, v)
        return out, dict(zip(wanted, got))

    def _run(self, tokens, positions, masks, cache, layers, hidden, capture):
        x = self.embed(tokens) if hidden is None else hidden
        extra = self.layer_inputs(tokens)
        positions, _ = prepare(positions, None)
        ready: dict[int, mx.array | None] = {}  # each distinct mask converted once
        for m in masks:
            if id(m) not in ready:
                ready[id(m)] = prepare(positions, m)[1]
        blocks = self.model.layers
        layers = range(len(blocks)) if layers is None else layers
        own_slots = cache.num_layers == len(blocks)
        captured = {}
        for j, i in enumerate(layers):
            if i in capture:
                captured[i] = x
            slot = i if own_slots else j
            args = () if extra is None else (extra[:, :, i],)
            x = blocks[i](x, positions, ready[id(masks[slot])], cache, slot, *args)
        if len(blocks) in capture:
            captured[len(blocks)] = x
        return x, captured

    def run_many(self, tokens: mx.array, masks: Sequence, caches: Sequence[KVCache],
                 capture: Collection[int] = ()) -> tuple[mx.array, dict[int, mx.array]]:
        """All layers over several sequences' rows at once: ``tokens`` (1, N) holds each
        sequence's rows in turn, ``masks[g]`` (a ``TreeMask``) says how many and what they see
        of ``caches[g]`` (a cache with a slot per layer). Every block runs natively
        (``native_blocks``; ``targets/batched.py`` checks). Returns what ``__call__`` does."""
        masks = ManyMasks(masks)  # made once, used by every layer
        with q8_scope(True):
            x = self.embed(tokens)
            ran = self._run_many_stack(x, masks, caches, capture)
            if ran is not None:
                return ran
            captured = {}
            blocks = self.model.layers
            for i, block in enumerate(blocks):
                if i in capture:
                    captured[i] = x
                x = block.native_many(x, masks, caches, i)
            if len(blocks) in capture:
                captured[len(blocks)] = x
            return x, captured

    def _run_many_stack(self, x: mx.array, masks: ManyMasks, caches: Sequence[KVCache],
                        capture: Collection[int]):
        """``run_many`` as one native operation (``DecoderStack.forward_many``), which writes
        every sequence's rows into its cache buffers in place, as ``_run_stack`` does for one
        sequence: the same bits as one block operation a layer, without the 30 operations and
        the 2 slice updates a layer and sequence. Only where every cache can give its buffers
        up (``KVCache.in_place_buffers``) and the stack takes them; else None."""
        stack = self._current_stack()
        if stack is None:
            return None
        # one hidden width and key/value shape (hidden, kv_heads, head_dim) for every layer,
        # as the stack's one operation needs: checked before any buffer is asked for
        shapes = {(f.native_shape[0], f.native_shape[2], f.native_shape[3])
                  for f in self._stack[0]}
        if len(shapes) != 1:
            return None
        modes = [cache.in_place_buffers() for cache in caches]
        if not all(free for free, _ in modes):
            return None
        after = [w for _, writers in modes for w in writers]
        fused = self._stack[0]
        keys, values, slots = [], [], []
        for n, cache in zip(masks.nodes, caches):
            held = [cache.write_buffers(i, n, f.native_shape[2], f.native_shape[3], in_place=True)
                    for i, f in enumerate(fused)]
            keys.append([k for k, _, _ in held])
            values.append([v for _, v, _ in held])
            slots.append([at for _, _, at in held])
        wanted = sorted(c for c in set(capture) if 0 <= c <= len(fused))
        got = stack.forward_many(x, keys, values, masks.anc, masks.qpos, masks.nodes, slots,
                                 masks.key_starts, masks.windows,
                                 masks.masks[0].native_block[1], wanted, after)
        if got is None:
            return None
        out, caught = got
        for cache in caches:
            cache.wrote(out)  # the rows went into the buffers given
        return out, dict(zip(wanted, caught))

    _stack = None  # _native_stack's (fused forms, native arguments, DecoderStack or None)
    # {(bits, to): layers} re-packed for the native products on load (``widen_for_native``); a
    # plain attribute (object.__setattr__), not a child module
    widened: dict = {}
    # {GGUF type: modules} decoded to float32 by the converter and rounded to 8 bits on load
    # (``load._round_decoded``); a plain attribute like ``widened``
    rounded: dict = {}

    def fuse(self) -> int:
        """Fuse every block that has a fused form, then put the weights a decoding step
        streams on 2 MB pages (``weight_arena``: the same bits, new places; the bytes the
        kernel put there are ``huge_page_bytes``); returns how many blocks now run fused."""
        fused = sum(block.fuse() for block in self.model.layers)
        self.huge_page_bytes = 0
        if huge_pages_wanted():
            head = self.output_head()
            head_arrays = [a for _, a in tree_flatten(head.parameters())]
            half = (halves(head) if type(head) in (nn.QuantizedEmbedding, nn.QuantizedLinear)
                    else None)
            if half is not None:  # what the native kernel reads instead of the float32 ones
                head_arrays = [head["weight"], *half]
            streamed = pack_blocks(self.model.layers) + head_arrays
            self.huge_page_bytes = sum(advise_huge_pages(a) for a in streamed)
        return fused

    def native_blocks(self) -> bool:
        """Whether every block runs small forwards as one native operation."""
        return all(getattr(b, "native_ready", lambda: False)() for b in self.model.layers)

    def native_block_count(self) -> int:
        """How many blocks run small forwards as one native operation (``native_blocks``:
        all of them)."""
        return sum(bool(getattr(b, "native_ready", lambda: False)()) for b in self.model.layers)

    def output_head(self) -> nn.Module:
        """The module the LM head applies: the tied embedding, or ``lm_head``."""
        return self.model.embed_tokens if self.args.tie_word_embeddings else self.lm_head

    def logits(self, hidden: mx.array) -> mx.array:
        h = self.model.norm(hidden)  # the head through kernels/matmul (small inputs: native)
        with q8_scope(self.native_blocks()):
            return linear(self.output_head(), h)
