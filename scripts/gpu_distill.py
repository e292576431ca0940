"""`edgespec train eagle3`'s recipe at GPU scale, in PyTorch: many more Magpie questions, the
target's greedy answers, teacher-forced features and the EAGLE-3 head with its training-time test.

Why: the head's learning curve says it is bound by data, and the answer tokens a higher tau
needs would take a 2-core CPU days to make (see docs/measurements.md, "the EAGLE-3 head's
learning curve"); a lent CUDA machine makes them in minutes. MLX is not on that machine, so
this is the same recipe written again in PyTorch; ``scripts/gpu_bundle.py`` makes its input
here and turns its output into an edgespec head, which is then measured here on the CPU like any
other head.

The same recipe as ``edgespec train`` (``training/answers.py``, ``features.py``, ``heads/eagle3.py``):
- questions: the chat template up to the user's text plus one of the ``OPENERS``, sampled at
  temperature 1, top-p 0.95, at most 96 tokens; kept when the model ended its turn, the text has
  12+ characters, is new, and ``EvalExclusion`` (``training/exclusion.py``, loaded from this
  checkout by path) finds no overlap with an evaluation prompt;
- answers: greedy, at most 256 tokens, stopped at the end of turn; all in float32 (TF32 off), so
  they are the float32 target's own continuations up to the order of float additions;
- features: the hidden states entering the aux layers, float16 (computed with TF32 products:
  the same rounding); labels the target's argmax;
- the target (``gpu_target.py``): float32 from edgespec's converted folder, batched generation;
- the head (``gpu_head.py``): ``Eagle3Head``'s math (checked against it:
  ``tests/test_gpu_distill.py``), hard labels over the draft vocabulary (the most frequent
  training labels), depth losses weighted 0.8^j, AdamW, warm-up + cosine, clipping; matrix
  products in bfloat16 autocast.

Input (``--bundle``): ``model/`` (edgespec's converted target: config.json, model.safetensors in
MLX's quantized layout, tokenizer.json), ``recipe.json`` (template pieces, stop ids, openers,
aux layers), ``eval/`` (the evaluation prompts). Output (``--out``): ``head_layer.safetensors``,
``head_lm.safetensors`` (float16; rewritten after every epoch, so a killed run keeps the last),
``answers_K.npz`` (prompt and answer ids: ``--extra`` of a later run), ``questions.jsonl.gz``,
``report.json``.
Phases run against one deadline (``--minutes``); each reports its throughput.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its two halves, beside it
from gpu_head import train  # noqa: E402
from gpu_target import Target, generate, load_weights  # noqa: E402


def load_exclusion(repo: Path, eval_dir: Path):
    """edgespec's own ``EvalExclusion`` (pure Python), loaded by path: no MLX needed here."""
    spec = importlib.util.spec_from_file_location("edgespec_exclusion",
                                                  repo / "edgespec/training/exclusion.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    ex = module.EvalExclusion.from_dir(eval_dir)
    if not len(ex):
        raise SystemExit(f"no evaluation prompts found in {eval_dir}: refusing to make data "
                         "without the exclusion")
    return ex


def write_questions(target, tok, recipe, exclusion, count, batch, seed, deadline, log, seen=()):
    """Magpie questions (see the module docstring) until ``count`` or the deadline; none equal
    to one in ``seen`` (an earlier run's)."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=target.embed.device).manual_seed(seed)
    prefix, openers = recipe["user_turn_prefix_ids"], recipe["openers"]
    stop = set(recipe["stop_ids"])
    seen, kept, counts = set(seen), [], {"dropped_eval": 0, "dropped_other": 0}
    t0, tokens = time.time(), 0
    while len(kept) < count and time.time() < deadline:
        starts = [openers[k] for k in rng.integers(0, len(openers), batch)]
        rows = [prefix + tok.encode(o, add_special_tokens=False).ids for o in starts]
        for opener, (ids, stopped) in zip(starts, generate(target, rows, recipe["question_tokens"],
                                                           stop, sampling=(1.0, 0.95), gen=gen)):
            tokens += len(ids)
            text = (opener + tok.decode(ids, skip_special_tokens=True)).strip()
            if not stopped or len(text) < 12 or text in seen:
                counts["dropped_other"] += 1
            elif not exclusion.keep(text):
                counts["dropped_eval"] += 1
            else:
                seen.add(text)
                kept.append(text)
        log(f"questions: {len(kept)}/{count} ({time.time() - t0:.0f} s)")
    secs = time.time() - t0
    return kept[:count], {**counts, "kept": min(len(kept), count), "seconds": round(secs, 1),
                          "tokens": tokens, "tokens_per_s": round(tokens / secs, 1)}


def write_answers(target, tok, recipe, questions, batch, deadline, log):
    """Greedy answers in batches until done or the deadline. The questions are taken in their
    (random) order, sorted by length only within runs of 4 batches (less padding), so a run cut
    short by the deadline does not keep only the short ones."""
    before, after = recipe["template_before"], recipe["template_after"]
    prompts = [tok.encode(before + q + after, add_special_tokens=False).ids for q in questions]
    run = 4 * batch
    order = np.concatenate([i + np.argsort([len(p) for p in prompts[i : i + run]], kind="stable")
                            for i in range(0, len(prompts), run)] or [np.zeros(0, dtype=int)])
    stop = set(recipe["stop_ids"])
    done, t0, tokens = {}, time.time(), 0
    for i in range(0, len(order), batch):
        if time.time() > deadline:
            break
        rows = order[i : i + batch]
        for r, (ids, _) in zip(rows, generate(target, [prompts[r] for r in rows],
                                              recipe["answer_tokens"], stop)):
            done[int(r)] = ids
            tokens += len(ids)
        log(f"answers: {len(done)}/{len(prompts)}, {tokens} tokens ({time.time() - t0:.0f} s)")
    secs = time.time() - t0
    seqs = [(prompts[r], done[r]) for r in sorted(done)]
    return seqs, {"answers": len(seqs), "answer_tokens": tokens, "seconds": round(secs, 1),
                  "tokens_per_s": round(tokens / secs, 1) if secs else None}


def save_answers(seqs, out: Path, per_file: int = 6_000_000) -> None:
    """The sequences' prompt and answer ids (uint16), each back to back with its offsets, in
    files of at most ``per_file`` tokens (the GPU machine returns files of at most 16 MiB);
    ``read_answers`` reads them back (``--extra``)."""
    files, cur, n = [], [], 0
    for p, a in seqs:
        if cur and n + len(p) + len(a) > per_file:
            files.append(cur)
            cur, n = [], 0
        cur.append((p, a))
        n += len(p) + len(a)
    files.append(cur)
    for k, group in enumerate(files):
        arrays = {}
        for name, part in (("prompt", 0), ("answer", 1)):
            pieces = [np.asarray(s[part], dtype=np.int64) for s in group]
            flat = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
            assert flat.size == 0 or flat.max() < 2**16, "vocabulary too large for uint16"
            arrays[f"{name}_ids"] = flat.astype(np.uint16)
            arrays[f"{name}_offsets"] = np.cumsum([0] + [len(x) for x in pieces])
        np.savez_compressed(out / f"answers_{k}.npz", **arrays)


def read_answers(path: Path) -> list[tuple[list[int], list[int]]]:
    z = np.load(path)
    po, ao = z["prompt_offsets"], z["answer_offsets"]
    p, a = z["prompt_ids"].astype(np.int64), z["answer_ids"].astype(np.int64)
    return [(p[po[i] : po[i + 1]].tolist(), a[ao[i] : ao[i + 1]].tolist()) for i in range(len(po) - 1)]


# --- features ---------------------------------------------------------------------------------


@torch.no_grad()
def write_features(target, seqs, aux, max_tokens, log):
    """Teacher forcing over every prompt+answer: flat arrays (rows = tokens, sequences back to
    back): aux float16 (N, A*H), ids, labels (the argmax at each position), mask (1 where the
    next token is an answer token: positions P-1..T-1, as ``features.py``), offsets."""
    dev = target.embed.device
    lengths = np.array([len(p) + len(a) for p, a in seqs])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    N, A, H = int(offsets[-1]), len(aux), target.c["hidden_size"]
    feats = torch.empty(N, A * H, dtype=torch.float16, device=dev)
    labels = torch.empty(N, dtype=torch.long, device=dev)
    ids_all = torch.tensor(np.concatenate([p + a for p, a in seqs]), dtype=torch.long, device=dev)
    mask = np.zeros(N, dtype=bool)
    for s, (p, _) in enumerate(seqs):
        mask[offsets[s] + len(p) - 1 : offsets[s + 1]] = True
    order = np.argsort(lengths, kind="stable")
    t0, i = time.time(), 0
    while i < len(order):
        j = i
        while j < len(order) and (j - i + 1) * int(lengths[order[j]]) <= max_tokens:
            j += 1
        rows, T = order[i : max(j, i + 1)], int(lengths[order[max(j, i + 1) - 1]])
        B = len(rows)
        ids = torch.zeros(B, T, dtype=torch.long, device=dev)
        for b, s in enumerate(rows):
            ids[b, : lengths[s]] = ids_all[offsets[s] : offsets[s + 1]]
        pos = torch.arange(T, device=dev)[None].expand(B, T)
        causal = (pos[0][:, None] >= pos[0][None, :])[None].expand(B, T, T)
        logits, _, fs = target.forward(ids, pos, causal, aux=aux)
        f = torch.cat(fs, dim=-1).half()
        am = logits.argmax(-1)
        for b, s in enumerate(rows):
            a, n = offsets[s], lengths[s]
            feats[a : a + n], labels[a : a + n] = f[b, :n], am[b, :n]
        i += B
    secs = time.time() - t0
    follows = mask.copy()
    follows[offsets[1:] - 1] = False  # the last position's next token is not in the sequence
    follows_t = torch.tensor(follows[:-1], device=dev)
    agree = float((labels[:-1] == ids_all[1:])[follows_t].float().mean())
    log(f"features: {N} tokens in {secs:.0f} s; labels agree with the answers at {agree:.2%}")
    return {"aux": feats, "ids": ids_all, "labels": labels,
            "mask": torch.tensor(mask, device=dev), "offsets": offsets,
            "report": {"tokens": N, "seconds": round(secs, 1), "tokens_per_s": round(N / secs, 1),
                       "label_agreement": round(agree, 5)}}


# --- the run ------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--minutes", type=float, default=8.0, help="deadline for all phases")
    ap.add_argument("--questions", type=int, default=40000)
    ap.add_argument("--question-minutes", type=float, default=1.5)
    ap.add_argument("--answer-minutes", type=float, default=3.0)
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--feature-tokens", type=int, default=65536, help="padded tokens per teacher-forcing forward")
    ap.add_argument("--batch-tokens", type=int, default=16384, help="padded rows per training step")
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--depths", type=int, default=4)
    ap.add_argument("--epochs", type=float, default=8.0)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--held-out", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--extra", type=Path, nargs="*", default=[],
                    help="answers_K.npz files of earlier runs: trained on too (their questions "
                         "passed the same exclusion)")
    ap.add_argument("--extra-questions", type=Path, nargs="*", default=[],
                    help="questions.jsonl.gz of earlier runs: new questions equal to one are dropped")
    ap.add_argument("--reserve-s", type=float, default=30.0,
                    help="seconds kept after training for the last evaluation and save")
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    start = time.time()
    deadline = start + 60 * args.minutes
    args.out.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(f"[{time.time() - start:6.1f}s] {msg}", flush=True)

    torch.backends.cuda.matmul.allow_tf32 = False  # the target in true float32
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    recipe = json.loads((args.bundle / "recipe.json").read_text())
    args.aux = tuple(recipe["aux_layers"])
    tok = Tokenizer.from_file(str(args.bundle / "model/tokenizer.json"))
    exclusion = load_exclusion(args.repo, args.bundle / "eval")
    config, weights = load_weights(args.bundle / "model")
    target = Target(config, weights, dev)
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
              "torch": torch.__version__, "args": {k: str(v) for k, v in vars(args).items()},
              "eval_prompts_excluded": len(exclusion)}
    log(f"target loaded on {report['device']}; {len(exclusion)} evaluation prompts excluded")
    check = recipe.get("check")
    if check:  # edgespec's own greedy continuation of one prompt, made on the CPU
        got = generate(target, [check["prompt_ids"]], len(check["answer_ids"]), set())[0][0]
        same = next((i for i, (a, b) in enumerate(zip(got, check["answer_ids"])) if a != b), len(got))
        report["check_tokens_equal"] = f"{same}/{len(check['answer_ids'])}"
        log(f"greedy check against edgespec: first {same} of {len(got)} tokens equal")
    earlier = [json.loads(line)["prompt"] for path in args.extra_questions
               for line in gzip.open(path, "rt")]
    questions, report["questions"] = write_questions(
        target, tok, recipe, exclusion, args.questions, args.gen_batch, args.seed,
        min(deadline, time.time() + 60 * args.question_minutes), log, seen=earlier)
    with gzip.open(args.out / "questions.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"id": i, "prompt": q}) + "\n" for i, q in enumerate(questions))
    seqs, report["answers"] = write_answers(target, tok, recipe, questions, args.gen_batch,
                                            min(deadline, time.time() + 60 * args.answer_minutes), log)
    save_answers(seqs, args.out)
    for path in args.extra:  # sequences from earlier runs, trained on with this run's
        more = read_answers(path)
        report.setdefault("extra", []).append({"file": path.name, "sequences": len(more),
                                               "answer_tokens": sum(len(a) for _, a in more)})
        seqs += more
    # TF32 products here: the features are stored in float16 (the same rounding), and a label
    # flips only where two logits tie within it (the agreement with the answers says how often)
    torch.backends.cuda.matmul.allow_tf32 = True
    store = write_features(target, seqs, args.aux, args.feature_tokens, log)
    report["features"] = store.pop("report")
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    train(target, store, args, deadline, args.out, report, log)
    report["total_seconds"] = round(time.time() - start, 1)
    if dev.type == "cuda":
        report["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    log("done")


if __name__ == "__main__":
    main()
