"""A simulated user for the drafter that learns from its user (issue 36): its questions, and a
client that sends them to ``edgespec serve``.

``make --out DIR``: the demo model writes the questions itself (Magpie, ``training/answers.py``),
never taken from ``../shared/eval``, in four domains the shipped head's recipe did not favour
(``DOMAINS``): translating German news sentences to English, summarising a paragraph the model
wrote, grade-school word problems, answering a question about a passage given in the prompt.
Each domain gets a quarter of ``--questions``, written by ``write_questions`` into its own
resumable file ``DIR/questions/<domain>.jsonl`` (a rerun continues), each question starting with
one of the domain's openers, the model writing the rest (the sentence, paragraph, problem or
passage). A question is kept only if its domain's ``clean`` accepts it (well formed: a quoted
German sentence, a paragraph of some length, a problem with numbers and a question mark, a
passage with a question), it does not overlap an evaluation prompt
(``EvalExclusion.from_dir()``) and it is not an exact duplicate (normalised as
``exclusion.words``). Then ``split`` makes a use set and a test set of different questions:
questions that share a run of ``NGRAM`` words (counted in what the model wrote, not in the
openers, which are shared by design) stay on the same side. It writes ``DIR/use.jsonl`` and
``DIR/test.jsonl`` in bench's prompt layout and ``DIR/summary.json``.

``use --url URL --file DIR/use.jsonl``: every question as one conversation (one user message to
``/v1/chat/completions``, greedy by default, as an editor or agent sends), ``--clients`` at a
time; a non-200 answer is counted and reported, never fatal (a 429 is retried after its
Retry-After).

    .venv/bin/python scripts/simulated_user.py make --out ~/.cache/edgespec/simuser
    .venv/bin/python scripts/simulated_user.py use --url http://127.0.0.1:8080 \\
        --file ~/.cache/edgespec/simuser/use.jsonl --report use.json
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import httpx
from tqdm import tqdm

from edgespec.errors import ConfigError
from edgespec.training.exclusion import NGRAM, EvalExclusion, words

BLOCK = 50  # conversations per row of ``by_block`` in the use report
GERMAN = frozenset("der die das den dem des und ist sind mit von im am zum zur nicht für auf "
                   "sich ein eine einer einen wird werden hat haben bei nach auch über aus "
                   "wie es sie er wir noch nur vor seit gegen bis um".split())


def _translation(body: str) -> str | None:
    """The quoted German sentence up to its closing quote (what follows is dropped)."""
    end = body.find('"')
    sentence = body[:end].strip() if end >= 0 else ""
    w = sentence.lower().split()
    if not 5 <= len(w) <= 60 or sum(x.strip(".,;:!?") in GERMAN for x in w) < 2:
        return None
    return body[: end + 1]


def _summary(body: str) -> str | None:
    """The paragraph, without a dangling last line such as "Here's your response:"."""
    lines = body.strip().splitlines()
    while lines and lines[-1].rstrip().endswith(":"):
        lines.pop()
    text = "\n".join(lines).strip()
    return text if len(words(text)) >= 30 else None


def _asks(min_words: int, need_digit: bool) -> Callable[[str], str | None]:
    """The text up to its last question mark (a trailing "Answer: ..." is dropped)."""
    def clean(body: str) -> str | None:
        end = body.rfind("?")
        text = body[: end + 1].rstrip()
        if end < 0 or len(words(text)) < min_words or (need_digit and not re.search(r"\d", text)):
            return None
        return text
    return clean


class Domain(NamedTuple):  # not a dataclass: tests load this script without sys.modules
    name: str
    openers: tuple[str, ...]  # the question starts with one; the model writes the rest
    max_tokens: int  # question tokens the model may write (a question cut off is dropped)
    clean: Callable[[str], str | None]  # the model's text -> the question's body, or None
    joiner: str = ""  # between the opener and the cleaned body


DOMAINS = (
    Domain("translate_de_en", (
        'Translate this German news sentence into English: "Die',
        'Translate this German news sentence into English: "Der',
        'Please translate this sentence from a German newspaper into English:\n\n"Am',
        'How would you say this in English? It is from a German news site: "Nach',
        'Translate into English: "Im',
        'What does this German headline sentence mean in English? "Bei'), 64, _translation),
    Domain("summarize_own", (
        "Summarize the following paragraph in one or two sentences:\n\n",
        "Can you give me a short summary of this paragraph?\n\n",
        "Please summarize this text for me:\n\n",
        "Here is a paragraph I wrote. Summarize it in one sentence.\n\n"), 192, _summary),
    Domain("word_problems", (
        "Solve this word problem step by step: Sarah",
        "Solve this word problem step by step: A farmer",
        "Here is a math word problem from my homework. Please solve it and explain each step.\n\nTom",
        "Word problem: A bakery",
        "Can you help me solve this word problem? A school",
        "Solve this word problem step by step: Maria"), 96, _asks(8, need_digit=True)),
    Domain("passage_qa", (
        "Read the passage below and answer the question at the end.\n\nPassage:",
        "Answer the question using only the passage.\n\nPassage:",
        "Read this short article and answer my question about it.\n\nArticle:"),
        192, _asks(35, need_digit=False), joiner=" "),
)


def finish(domain: Domain, text: str) -> str | None:
    """A generated question (opener + the model's text) made into the user's question, or None."""
    opener = max((o for o in domain.openers if text.startswith(o)), key=len, default=None)
    if opener is None:
        return None
    body = domain.clean(text[len(opener):])
    if body is None:
        return None
    return opener + (domain.joiner + body.lstrip() if domain.joiner else body)


def body_words(domain: Domain, question: str) -> list[str]:
    """The normalised words the model wrote (the opener's left out)."""
    opener = max((o for o in domain.openers if question.startswith(o)), key=len, default="")
    return words(question[len(opener):])


def make_keep(domain: Domain, exclusion: EvalExclusion, seen: set[str], drops: Counter):
    """``write_questions``'s filter: well formed, no evaluation overlap, not seen before."""
    def keep(text: str) -> bool:
        question = finish(domain, text)
        key = " ".join(words(question)) if question else ""
        reason = ("malformed" if question is None else "eval" if exclusion.overlaps(question)
                  else "duplicate" if key in seen else None)
        if reason:
            drops[reason] += 1
            return False
        seen.add(key)
        return True
    return keep


def check_openers(exclusion: EvalExclusion) -> None:
    for d in DOMAINS:
        for o in d.openers:
            if exclusion.overlaps(o):
                raise ConfigError(f"{d.name} opener {o!r} overlaps an evaluation prompt; "
                                  f"an opener must share no {NGRAM}-word run with one")


def split(questions: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Use and test sets: per domain ``round(n * fraction)`` questions to test, drawn by a seeded
    shuffle; questions joined by an equal text or a shared ``NGRAM``-word run (``q["words"]``)
    form one group, and a group goes whole to one side, so no test question equals or shares a
    run with a use question (a group too large for a domain's remaining test quota goes to use)."""
    parent = list(range(len(questions)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict = {}
    for i, q in enumerate(questions):
        w = q["words"]
        for key in [" ".join(w)] + [tuple(w[k : k + NGRAM]) for k in range(len(w) - NGRAM + 1)]:
            parent[root(i)] = root(owner.setdefault(key, i))
    groups: dict[int, list[int]] = {}
    for i in range(len(questions)):
        groups.setdefault(root(i), []).append(i)
    order = sorted(groups.values())
    random.Random(seed).shuffle(order)
    quota = {d: round(n * fraction) for d, n in Counter(q["category"] for q in questions).items()}
    taken: Counter = Counter()
    test: set[int] = set()
    for group in order:
        need = Counter(questions[i]["category"] for i in group)
        if all(taken[d] + n <= quota[d] for d, n in need.items()):
            taken.update(need)
            test.update(group)
    return ([q for i, q in enumerate(questions) if i not in test],
            [q for i, q in enumerate(questions) if i in test])


def bench_row(q: dict) -> dict:
    return {"question_id": q["question_id"], "category": q["category"], "turns": [q["text"]]}


def make(out: Path, count: int, fraction: float, seed: int, batch: int) -> dict:
    from edgespec.loading.hub import resolve_model
    from edgespec.loading.tokenizer import Tokenizer
    from edgespec.training.answers import load_batch_model, read_records, write_questions

    if count < 4 * 5 or not 0 < fraction < 1:
        raise ConfigError(f"--questions must be >= 20 (got {count}) and --test-fraction in (0, 1) "
                          f"(got {fraction})")
    t0 = time.perf_counter()
    exclusion = EvalExclusion.from_dir()
    check_openers(exclusion)
    model_dir = resolve_model("demo")
    tokenizer, model = Tokenizer.from_dir(model_dir), None
    (out / "questions").mkdir(parents=True, exist_ok=True)
    per = [count // 4 + (k < count % 4) for k in range(4)]
    seen: set[str] = set()
    report: dict = {}
    questions: list[dict] = []
    for k, (domain, n) in enumerate(zip(DOMAINS, per)):
        path = out / "questions" / f"{domain.name}.jsonl"
        stats_path = path.with_suffix(".drops.json")
        drops = Counter(json.loads(stats_path.read_text()) if stats_path.exists() else {})
        have = read_records(path)
        seen.update(" ".join(words(finish(domain, r["prompt"]) or "")) for r in have)
        if len(have) < n:
            model = model or load_batch_model(model_dir)
            print(f"{domain.name}: {len(have)}/{n} questions, writing the rest", file=sys.stderr)
            run = Counter()
            try:
                counts = write_questions(model, tokenizer, path, n, seed=seed * 100 + k, batch=batch,
                                         max_tokens=domain.max_tokens, openers=domain.openers,
                                         keep=make_keep(domain, exclusion, seen, run))
                run["cut_off_or_short"] = counts["dropped"] - sum(run.values())
            finally:
                drops.update(run)
                stats_path.write_text(json.dumps(dict(drops)))
        for r in read_records(path)[:n]:
            text = finish(domain, r["prompt"])
            if text is None:  # written under other cleaning rules: left out
                continue
            questions.append({"question_id": f"{domain.name}-{r['id']}", "category": domain.name,
                              "text": text, "words": body_words(domain, text)})
        report[domain.name] = {"questions": n, "openers": list(domain.openers),
                               "max_question_tokens": domain.max_tokens, "dropped": dict(drops)}
    use, test = split(questions, fraction, seed)
    for name, rows in (("use", use), ("test", test)):
        (out / f"{name}.jsonl").write_text(
            "".join(json.dumps(bench_row(q), ensure_ascii=False) + "\n" for q in rows), encoding="utf-8")
        for d, c in Counter(q["category"] for q in rows).items():
            report[d][name] = c
    summary = {"model": str(model_dir), "seed": seed, "test_fraction": fraction,
               "evaluation_prompts_excluded": len(exclusion), "use": len(use), "test": len(test),
               "domains": report, "seconds_this_run": round(time.perf_counter() - t0, 1)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False))
    return summary


def _served_model(client: httpx.Client, url: str) -> str:
    try:
        r = client.get(f"{url}/v1/models")
        return r.json()["data"][0]["id"] if r.status_code == 200 else "demo"
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return "demo"


def converse(client: httpx.Client, url: str, body: dict, retries: int = 5) -> tuple[int, dict | str]:
    """One chat completion: (status, JSON body) or (status, error text); status 0 = no answer."""
    for _ in range(retries + 1):
        try:
            r = client.post(f"{url}/v1/chat/completions", json=body)
        except httpx.HTTPError as e:
            return 0, f"{type(e).__name__}: {e}"
        if r.status_code != 429:
            break
        time.sleep(min(float(r.headers.get("retry-after", 1) or 1), 30))
    try:
        return r.status_code, r.json() if r.status_code == 200 else r.text[:300]
    except ValueError:
        return r.status_code, r.text[:300]


def conversation_record(row: dict, status: int, answer, seconds: float) -> dict:
    """One conversation for the report: its status and, when answered, the server's usage
    (edgespec's ``usage.speculative``: method, proposed, accepted, target forwards)."""
    rec = {"question_id": row.get("question_id"), "category": row.get("category"),
           "status": status, "seconds": round(seconds, 2)}
    if status != 200:
        return {**rec, "detail": answer}
    usage = answer.get("usage") or {}
    spec = usage.get("speculative") or {}
    return {**rec, "completion_tokens": usage.get("completion_tokens", 0),
            "finish_reason": (answer.get("choices") or [{}])[0].get("finish_reason"),
            **{k: spec[k] for k in ("method", "proposed", "accepted", "target_forwards") if k in spec}}


def summarize(records: list[dict], wall: float) -> dict:
    """Totals over the conversations, in the order they finished; acceptance pooled per block of
    ``BLOCK`` answered conversations shows a head rolled out while the user works."""
    ok = [r for r in records if r["status"] == 200]
    failures = [r for r in records if r["status"] != 200]
    tokens = sum(r["completion_tokens"] for r in ok)

    def pooled(rs):
        p, a = sum(r.get("proposed", 0) for r in rs), sum(r.get("accepted", 0) for r in rs)
        f = sum(r.get("target_forwards", 0) for r in rs)
        return {"conversations": len(rs), "acceptance": round(a / p, 4) if p else None,
                "tau": round(sum(r["completion_tokens"] for r in rs) / f, 3) if f else None}

    overall = pooled(ok)
    return {"conversations": len(records), "completed": len(ok), "failed": len(failures),
            "failures_by_status": dict(Counter(str(r["status"]) for r in failures)),
            "failures": failures, "completion_tokens": tokens, "wall_s": round(wall, 1),
            "completion_tokens_per_s": round(tokens / wall, 1) if wall else None,
            "methods": dict(Counter(r.get("method") for r in ok)),
            "acceptance": overall["acceptance"], "tau": overall["tau"],
            "by_block": [pooled(ok[i : i + BLOCK]) for i in range(0, len(ok), BLOCK)]}


def use(url: str, rows: list[dict], *, max_tokens: int, clients: int, temperature: float,
        model: str | None = None, timeout: float = 600.0) -> dict:
    """Every row's first turn as one conversation, ``clients`` at a time. Returns the summary
    (``summarize``) with every conversation's record."""
    url = url.rstrip("/")
    todo: queue.Queue = queue.Queue()
    for row in rows:
        todo.put(row)
    lock = threading.Lock()
    records: list[dict] = []
    with httpx.Client(timeout=timeout) as probe:
        model = model or _served_model(probe, url)
    bar = tqdm(total=len(rows), desc="conversations", unit="conv")

    def client_loop():
        with httpx.Client(timeout=timeout) as client:
            while True:
                try:
                    row = todo.get_nowait()
                except queue.Empty:
                    return
                body = {"model": model, "messages": [{"role": "user", "content": row["turns"][0]}],
                        "max_tokens": max_tokens, "temperature": temperature}
                start = time.perf_counter()
                status, answer = converse(client, url, body)
                rec = conversation_record(row, status, answer, time.perf_counter() - start)
                with lock:
                    records.append(rec)
                    bar.update(1)
                    if status != 200:
                        bar.set_postfix(failed=sum(r["status"] != 200 for r in records))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bar.close()
    settings = {"url": url, "model": model, "clients": clients, "max_tokens": max_tokens,
                "temperature": temperature}
    return {**settings, **summarize(records, time.perf_counter() - t0), "records": records}


def read_rows(path: Path) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as e:
        raise ConfigError(f"--file {path}: cannot read it as jsonl ({e})") from None
    if not rows or not all(isinstance(r.get("turns"), list) and r["turns"] for r in rows):
        raise ConfigError(f"--file {path}: expected bench rows with a non-empty 'turns' list")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make", help="write the questions, split into use and test")
    mk.add_argument("--out", type=Path, required=True)
    mk.add_argument("--questions", type=int, default=420)
    mk.add_argument("--test-fraction", type=float, default=0.2)
    mk.add_argument("--seed", type=int, default=11)
    mk.add_argument("--batch", type=int, default=32, help="sequences per batched forward")
    us = sub.add_parser("use", help="send every question to a server as one conversation")
    us.add_argument("--url", required=True)
    us.add_argument("--file", type=Path, required=True)
    us.add_argument("--max-tokens", type=int, default=256)
    us.add_argument("--clients", type=int, default=2)
    us.add_argument("--temperature", type=float, default=0.0)
    us.add_argument("--model", default=None, help="default: the first model /v1/models lists")
    us.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    us.add_argument("--report", type=Path, default=None, help="write the summary here as JSON")
    a = ap.parse_args(argv)
    try:
        if a.command == "make":
            summary = make(a.out.expanduser(), a.questions, a.test_fraction, a.seed, a.batch)
        else:
            if a.clients < 1 or a.max_tokens < 1:
                raise ConfigError(f"--clients and --max-tokens must be >= 1 (got {a.clients}, "
                                  f"{a.max_tokens})")
            summary = use(a.url, read_rows(a.file), max_tokens=a.max_tokens, clients=a.clients,
                          temperature=a.temperature, model=a.model, timeout=a.timeout)
            if a.report:
                a.report.write_text(json.dumps(summary, indent=1))
            summary = {k: v for k, v in summary.items() if k != "records"}
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
