"""The soak's clients (``scripts/soak.py``): its prompts and one client's loop of requests.

Prompts are built from a fixed word list (never from ``../shared/eval``): short and longer
requests from templates, and every third one a long "file" (one of two) resent with a varying
question, as an editor does, so the server's prefix cache is exercised.

A request's mode (``MODES``, drawn with these weights):

- ``stream``: streamed, read to ``[DONE]``;
- ``full``: one JSON body;
- ``disconnect``: streamed, the connection closed after a random number of content chunks;
- ``cancel``: one JSON body with a client timeout that gives up before most answers.

Each request gives a record: mode, key (prompt index, method, max_tokens), status, outcome
(completed, disconnected, cancelled, or what went wrong), latency, time to first content
(streamed), completion tokens and the text of a completed one. A 429 is counted in the record
and the request sent again after its Retry-After.
"""

from __future__ import annotations

import json
import random
import time

import httpx

MODES = {"stream": 0.35, "full": 0.3, "disconnect": 0.175, "cancel": 0.175}
WORDS = ("the a small river engine window garden quiet table paper light cache request server "
         "model token green stone bridge morning letter market careful simple number answer "
         "question friend city winter summer road house music old new fast slow bright library "
         "field cloud memory file editor line function value list open close read write build "
         "test run and of to in with for on over under after before").split()
TOPICS = ("rivers", "bread", "trains", "the moon", "gardens", "old maps", "winter storms",
          "chess", "bees", "lighthouses", "tea", "bicycles", "volcanoes", "libraries")
AUDIENCES = ("a child", "a new colleague", "a tourist", "a teacher", "my neighbour", "a chef")
TEMPLATES = ("Write a short note about {topic} for {audience}.", "List four facts about {topic}.",
             "Explain {topic} to {audience} in three sentences.", "Tell a tiny story about {topic}.",
             "Give {audience} one tip about {topic}.")
QUESTIONS = ("What does this text say about {topic}?", "Summarize the file above in one line.",
             "Which word appears most often above?", "Rewrite the first sentence for {audience}.")


def sentences(rng: random.Random, words: int) -> str:
    out = []
    while words > 0:
        n = min(words, rng.randint(6, 14))
        out.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
        words -= n
    return " ".join(out)


def build_prompts(rng: random.Random, n: int, prefix_words: int) -> list[str]:
    """``n`` prompts of varied length; every third resends one of two long files."""
    files = [sentences(rng, prefix_words) for _ in range(2)]

    def pick(template: str) -> str:
        return template.format(topic=rng.choice(TOPICS), audience=rng.choice(AUDIENCES))

    prompts = []
    for i in range(n):
        if i % 3 == 0:
            prompts.append(f"{rng.choice(files)}\n\nQuestion: {pick(rng.choice(QUESTIONS))}")
        else:
            extra = sentences(rng, rng.choice((0, 0, 10, 40, 120)))
            prompts.append(f"{extra} {pick(rng.choice(TEMPLATES))}".strip())
    return prompts


def body(model: str, prompt: str, method: str, max_tokens: int, stream: bool) -> dict:
    b = {"model": model, "messages": [{"role": "user", "content": prompt}],
         "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    if method != "default":
        b["method"] = method
    return b


def read_stream(r: httpx.Response, rec: dict, t0: float, close_after: int | None) -> None:
    """Read an SSE response into ``rec``; close it after ``close_after`` content chunks."""
    parts, chunks = [], 0
    for line in r.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            rec.update(outcome="completed", text="".join(parts))
            return
        obj = json.loads(data)
        if "error" in obj:
            rec.update(outcome="stream_error", error=obj["error"])
            return
        if obj.get("usage"):
            rec["tokens"] = obj["usage"]["completion_tokens"]
        for choice in obj.get("choices", ()):
            text = choice.get("delta", {}).get("content") or ""
            if text:
                rec.setdefault("ttft", time.perf_counter() - t0)
                parts.append(text)
                chunks += 1
        if close_after is not None and chunks >= close_after:
            rec["outcome"] = "disconnected"
            return  # leaving the `with` closes the connection mid-stream
    rec["outcome"] = "truncated"  # the server closed the stream without [DONE]


def one_request(http: httpx.Client, url: str, req: dict, mode: str, rng: random.Random,
                opts) -> dict:
    """Send one request (again after each 429) and return its record."""
    rec = {"mode": mode, "key": [req["prompt_id"], req["method"], req["max_tokens"]],
           "429": 0}
    stream = mode in ("stream", "disconnect")
    b = body(opts.model_name, req["prompt"], req["method"], req["max_tokens"], stream)
    close_after = rng.randint(1, opts.disconnect_chunks) if mode == "disconnect" else None
    timeout = rng.uniform(*opts.cancel_after) if mode == "cancel" else 600.0
    while True:
        rec.pop("status", None)
        t0 = time.perf_counter()
        try:
            if stream:
                with http.stream("POST", url, json=b, timeout=timeout) as r:
                    rec["status"] = r.status_code
                    if r.status_code == 200:
                        read_stream(r, rec, t0, close_after)
                    else:
                        r.read()
            else:
                r = http.post(url, json=b, timeout=timeout)
                rec["status"] = r.status_code
                if r.status_code == 200:
                    out = r.json()
                    rec.update(outcome="completed", text=out["choices"][0]["message"]["content"],
                               tokens=out["usage"]["completion_tokens"])
        except httpx.TimeoutException:
            rec["outcome"] = "cancelled" if mode == "cancel" else "timeout"
        except httpx.TransportError as e:
            rec.update(outcome="transport_error", error=repr(e))
        rec["latency"] = time.perf_counter() - t0
        if rec.get("status") == 429:
            rec["429"] += 1
            time.sleep(float(r.headers.get("retry-after", 1)))
            continue
        rec.setdefault("outcome", "http_error")
        return rec


def client(k: int, opts, prompts: list[str], deadline: float, out: list) -> None:
    rng = random.Random(opts.seed * 1000 + k + 1)
    url = opts.url + "/v1/chat/completions"
    modes, weights = list(MODES), list(MODES.values())
    with httpx.Client() as http:
        while time.monotonic() < deadline:
            pid = rng.randrange(len(prompts))
            req = {"prompt_id": pid, "prompt": prompts[pid], "method": rng.choice(opts.methods),
                   "max_tokens": rng.choice(opts.max_tokens)}
            out.append(one_request(http, url, req, rng.choices(modes, weights)[0], rng, opts))
