"""Batched self-distillation data: the target writes questions (Magpie) and answers them.

Contract: ``write_questions`` and ``write_answers`` append one JSON record per line to a jsonl
file and can be killed at any time: a rerun reads what is there, skips the finished records and
continues (a half-written last line is dropped). Generation is batched with mlx-lm's
``BatchGenerator`` (continuous batching: B sequences per target forward, each with its own length),
over the target's weights dequantized to the dtype edgespec decodes in, so the answers are the
target's own greedy continuations.

Records:
- question: ``{"id": i, "prompt": text}``
- answer:   ``{"id": i, "prompt": text, "ids": prompt ids (chat template applied),
              "answer": generated ids (EOS excluded), "finish": "stop" | "length"}``
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from tqdm import tqdm

from ..errors import ConfigError
from ..loading.tokenizer import Tokenizer
from ..prompt import encode_prompt
from .clock import Deadline, passed

IDLE_ROUNDS = 5
MAGPIE_SYSTEM = None  # the template's own default system prompt, as a user of the chat sees it
OPENERS = ("Write", "Explain", "Solve", "Imagine", "Given", "Extract", "Describe", "Compare",
           "Calculate", "Rewrite", "Summarize", "Pretend", "Implement", "Suggest", "List", "What",
           "How", "Why", "Create", "Analyze", "Translate", "Classify", "Evaluate", "Design")
"""First words a Magpie question may be made to start with (``write_questions(openers=...)``):
generic instruction verbs and question words, so that a small model, which left to itself
mostly asks for advice ("Can you ...", "I'm planning ..."), also writes the other kinds of task
a user gives (writing, role-play, maths, code, extraction, comparison). Written here as a plain
list of task kinds; not taken from any evaluation set."""


def load_batch_model(path: Path, dtype=mx.float32) -> nn.Module:
    """mlx-lm's module for ``path`` with quantized layers replaced by dequantized ``dtype`` ones."""
    try:
        from mlx_lm.utils import load_model
    except ImportError:
        raise ConfigError("writing training answers needs mlx-lm (its batched generator), which is "
                          "not installed: pip install -e '.[train]' (or pip install mlx-lm)") from None
    model, _ = load_model(Path(path))

    def dequantize(_, module):
        if isinstance(module, nn.QuantizedLinear):
            w = mx.dequantize(module.weight, module.scales, module.get("biases"),
                              module.group_size, module.bits).astype(dtype)
            out = nn.Linear(w.shape[1], w.shape[0], bias="bias" in module)
            out.weight = w
            if "bias" in module:
                out.bias = module.bias.astype(dtype)
            return out
        if isinstance(module, nn.QuantizedEmbedding):
            w = mx.dequantize(module.weight, module.scales, module.get("biases"),
                              module.group_size, module.bits).astype(dtype)
            out = nn.Embedding(w.shape[0], w.shape[1])
            out.weight = w
            return out
        return module

    from mlx.utils import tree_map_with_path

    leaves = model.leaf_modules()
    model.update_modules(tree_map_with_path(dequantize, leaves, is_leaf=nn.Module.is_module))
    model.apply(lambda p: p.astype(dtype) if mx.issubdtype(p.dtype, mx.floating) else p)
    mx.eval(model.parameters())
    return model


def read_records(path: Path) -> list[dict]:
    """Every complete record of a jsonl file (a torn last line from a kill is ignored)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def _rewrite(path: Path, records: list[dict]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)


def generate_batched(model: nn.Module, prompts: list[list[int]], *, max_tokens: int,
                     stop: Iterable[int], batch: int, sampler=None,
                     on_done: Callable[[int, list[int], str], None], bar: tqdm,
                     deadline: Deadline | None = None) -> int:
    """Continuous-batched generation of every prompt; ``on_done(index, ids, finish)`` per
    sequence as it finishes (stop tokens excluded). Returns the number of generated tokens.
    Once ``deadline`` has passed it stops; unfinished sequences are dropped."""
    from mlx_lm.generate import BatchGenerator

    stop = list(stop)
    gen = BatchGenerator(model, max_tokens=max_tokens, stop_tokens=[[t] for t in stop],
                         sampler=sampler, completion_batch_size=batch,
                         prefill_batch_size=min(batch, 16))
    uids = gen.insert(prompts, max_tokens=[max_tokens] * len(prompts))
    index = {u: i for i, u in enumerate(uids)}
    out: dict[int, list[int]] = {u: [] for u in uids}
    total = 0
    try:
        while out and not passed(deadline):
            for r in gen.next_generated():
                total += 1
                bar.update(1)
                if r.finish_reason is None or r.token not in stop:
                    out[r.uid].append(r.token)
                if r.finish_reason is not None:
                    on_done(index[r.uid], out.pop(r.uid), "stop" if r.finish_reason == "stop" else "length")
    finally:
        gen.close()
    return total


def write_questions(model: nn.Module, tokenizer: Tokenizer, path: Path, count: int, *,
                    seed: int, batch: int = 32, max_tokens: int = 96,
                    keep: Callable[[str], bool] = lambda q: True, openers: Sequence[str] = (),
                    deadline: Deadline | None = None) -> dict:
    """Magpie: the chat template up to the user's turn, and the target writes the question.

    With ``openers``, each question starts with one of them (drawn per row from the round's
    seed) and the model writes the rest: the question is the opener followed by its text.

    Sampled (temperature 1, top-p 0.95, seeded) so the questions differ; a question that
    ``keep`` refuses (an evaluation prompt, an empty or cut-off one) is dropped and another is
    drawn. Appends until ``path`` holds ``count`` questions. Returns counts for the report.
    Each round's seed depends on (seed, questions kept, rounds since the last kept one), so a
    resumed run draws what an uninterrupted one would; ``IDLE_ROUNDS`` rounds in a row without
    a usable question raise :class:`ConfigError` (a model that never ends its question).
    """
    from mlx_lm.sample_utils import make_sampler

    prefix = _user_turn_prefix(tokenizer)
    stop = set(tokenizer.eos_token_ids) | _end_of_turn(tokenizer)
    done = read_records(path)
    _rewrite(path, done)
    dropped = idle = 0
    bar = tqdm(total=count, initial=len(done), desc="questions (Magpie)", unit="q")
    with path.open("a") as f, bar:
        while len(done) < count and not passed(deadline):
            if idle >= IDLE_ROUNDS:
                raise ConfigError(f"{tokenizer.name}: no usable question in {idle} rounds (each "
                                  f"must end its turn within {max_tokens} tokens and not overlap "
                                  "an evaluation prompt); pass --data prompts")
            mx.random.seed(seed + 1000 * len(done) + idle)
            before = len(done)
            want = min(batch * 4, (count - len(done)) * 5 // 4 + 4)
            fresh: list[tuple[str, list[int], str]] = []
            starts = ([openers[k] for k in np.random.default_rng(
                [seed, len(done), idle]).integers(0, len(openers), want)] if openers else [""] * want)
            rows = [prefix + tokenizer.encode(o, add_special_tokens=False) if o else prefix
                    for o in starts]

            def on_done(i, ids, finish):
                fresh.append((starts[i], ids, finish))

            generate_batched(model, rows, max_tokens=max_tokens, stop=stop, batch=batch,
                             sampler=make_sampler(temp=1.0, top_p=0.95), on_done=on_done,
                             bar=tqdm(disable=True), deadline=deadline)
            for opener, ids, finish in fresh:
                text = (opener + tokenizer.decode(ids, skip_special_tokens=True)).strip()
                if finish != "stop" or len(text) < 12 or not keep(text):
                    dropped += 1
                    continue
                if len(done) < count:
                    rec = {"id": len(done), "prompt": text}
                    done.append(rec)
                    f.write(json.dumps(rec) + "\n")
                    bar.update(1)
            f.flush()
            idle = 0 if len(done) > before else idle + (not passed(deadline))
    return {"questions": len(done), "dropped": dropped}


def write_answers(model: nn.Module, tokenizer: Tokenizer, questions: list[dict], path: Path, *,
                  batch: int = 32, max_tokens: int = 256, deadline: Deadline | None = None) -> dict:
    """The target's greedy answer to every question, appended to ``path`` as they finish
    (resumable: questions already answered there are skipped; past ``deadline`` it stops).
    Returns throughput figures."""
    done = read_records(path)
    _rewrite(path, done)
    have = {r["id"] for r in done}
    todo = [q for q in questions if q["id"] not in have]
    stop = set(tokenizer.eos_token_ids) | _end_of_turn(tokenizer)
    prompts = [encode_prompt(tokenizer, _messages(q)) for q in todo]
    bar = tqdm(total=len(todo) * max_tokens, desc="answers (batched, tokens ≤)", unit="tok")
    t0 = time.perf_counter()
    with path.open("a") as f, bar:
        def on_done(i, ids, finish):
            q = todo[i]
            f.write(json.dumps({"id": q["id"], "prompt": q["prompt"], "ids": prompts[i],
                                "answer": ids, "finish": finish}) + "\n")
            f.flush()
            # the bar counts the budget; a stop frees the rest (the stop token was counted)
            bar.update(max(0, max_tokens - len(ids) - (finish == "stop")))

        tokens = generate_batched(model, prompts, max_tokens=max_tokens, stop=stop, batch=batch,
                                  on_done=on_done, bar=bar, deadline=deadline) if todo else 0
    seconds = time.perf_counter() - t0
    have = {r["id"] for r in read_records(path)}
    return {"answers": len(have), "complete": all(q["id"] in have for q in questions),
            "new_tokens": tokens, "seconds": round(seconds, 1),
            "tokens_per_s": round(tokens / seconds, 1) if seconds and tokens else None}


def _messages(question: dict) -> list[dict]:
    return question.get("messages") or [{"role": "user", "content": question["prompt"]}]


def _user_turn_prefix(tokenizer: Tokenizer) -> list[int]:
    """The template's ids up to where the user's text starts."""
    marker = "\x00MAGPIE\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}],
                                         add_generation_prompt=False)
    return tokenizer.encode(text[: text.index(marker)])


def _end_of_turn(tokenizer: Tokenizer) -> set[int]:
    ids = {tokenizer.token_to_id(t) for t in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>")}
    return {i for i in ids if i is not None}
