"""scripts/simulated_user.py: the split keeps use and test apart, the filter refuses evaluation
prompts, malformed and repeated questions, and the client counts a failed conversation and goes
on (a local HTTP server on a thread). No model is loaded."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from edgespec.training.exclusion import NGRAM, EvalExclusion, words
from tests.script_module import load_script

su = load_script("simulated_user")
TRANSLATE, SUMMARY, PROBLEMS, PASSAGE = su.DOMAINS


def _question(domain, n, body):
    text = su.finish(domain, domain.openers[0] + body)
    assert text is not None, body
    return {"question_id": f"{domain.name}-{n}", "category": domain.name, "text": text,
            "words": su.body_words(domain, text)}


def _problem(n: int, extra: str = "") -> str:
    return f" has {n} apples{extra} and buys {n + 3} more. How many apples does she have?"


def _runs(w):
    return {tuple(w[i : i + NGRAM]) for i in range(len(w) - NGRAM + 1)}


def test_split_keeps_equal_and_overlapping_questions_on_one_side():
    shared = " while her brother counts the red and green marbles in the old box"
    qs = [_question(PROBLEMS, n, _problem(n, shared if n % 3 == 0 else "")) for n in range(30)]
    qs.append(dict(qs[1], question_id="word_problems-dup"))  # the same text twice
    use, test = su.split(qs, 0.2, seed=3)
    assert len(use) + len(test) == len(qs) and test and use
    assert not {q["question_id"] for q in use} & {q["question_id"] for q in test}
    use_runs = set().union(*(_runs(q["words"]) for q in use))
    use_texts = {" ".join(words(q["text"])) for q in use}
    for q in test:
        assert not _runs(q["words"]) & use_runs, q["text"]
        assert " ".join(words(q["text"])) not in use_texts
    # the group of ten sharing a run is too big for the test quota of six: it stays in use
    assert all(int(q["question_id"].split("-")[1]) % 3 for q in test)
    assert su.split(qs, 0.2, seed=3) == (use, test)  # seeded


def test_split_takes_its_fraction_from_each_domain():
    qs = [_question(PROBLEMS, n, _problem(n)) for n in range(20)]
    law = ' Regierung hat am Montag {} neue Gesetze für die Schulen beschlossen."'
    qs += [_question(TRANSLATE, n, law.format(n)) for n in range(10)]
    _, test = su.split(qs, 0.2, seed=1)
    assert Counter(q["category"] for q in test) == {"word_problems": 4, "translate_de_en": 2}


def test_keep_refuses_evaluation_overlap_malformed_and_repeated(tmp_path, monkeypatch):
    eval_text = "A farmer has 17 sheep and all but 9 run away, how many sheep are left"
    (tmp_path / "eval.jsonl").write_text(json.dumps({"turns": [eval_text]}) + "\n")
    monkeypatch.setenv("EDGESPEC_EVAL_DIR", str(tmp_path))
    exclusion = EvalExclusion.from_dir()
    seen, drops = set(), Counter()
    keep = su.make_keep(PROBLEMS, exclusion, seen, drops)
    opener = "Solve this word problem step by step: A farmer"
    assert not keep(opener + " has 17 sheep and all but 9 run away, how many sheep are left?")
    fine = opener + " grows 40 carrots and sells 12 of them. How many carrots are left?"
    assert keep(fine + "\n\nAnswer: 28")  # the answer after the question is cut off
    assert not keep(fine)  # the same question again
    assert not keep(opener + " grows carrots and sells some of them. How many are left?")  # no number
    assert drops == {"eval": 1, "duplicate": 1, "malformed": 1}
    assert su.finish(PROBLEMS, fine + "\n\nAnswer: 28") == fine
    su.check_openers(exclusion)  # no opener overlaps this evaluation file
    (tmp_path / "eval.jsonl").write_text(json.dumps({"turns": [PASSAGE.openers[0]]}) + "\n")
    with pytest.raises(su.ConfigError, match="opener"):
        su.check_openers(EvalExclusion.from_dir())


def test_domain_cleaning():
    t = TRANSLATE.openers[0]
    assert su.finish(TRANSLATE, t + ' Regierung will die Steuern im Mai senken." (The government)') \
        == t + ' Regierung will die Steuern im Mai senken."'
    assert su.finish(TRANSLATE, t + " Regierung will die Steuern senken") is None  # no closing quote
    assert su.finish(TRANSLATE, t + ' hard fans of the movie came to the party."') is None  # English
    s = SUMMARY.openers[0]
    para = " ".join(["The river rose after the storm and the village moved its boats uphill."] * 3)
    assert su.finish(SUMMARY, s + para + "\n\nHere's your response:") == s + para
    assert su.finish(SUMMARY, s + "Too short to summarise.") is None
    p = PASSAGE.openers[0]
    passage = para + "\n\nQuestion: Where did the village move its boats?"
    assert su.finish(PASSAGE, p + "\n" + passage + " Options: a, b") == p + " " + passage


class _Server(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        if "fail" in body["messages"][0]["content"]:
            self._send(500, {"error": {"message": "boom"}})
        else:
            spec = {"method": "eagle3", "proposed": 10, "accepted": 5, "target_forwards": 4}
            self._send(200, {"choices": [{"message": {"content": "ok"}, "finish_reason": "length"}],
                             "usage": {"completion_tokens": 7, "speculative": spec}})


def test_use_counts_a_failure_and_goes_on():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    server.bodies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        rows = [{"question_id": f"q-{i}", "category": "c", "turns": ["fail" if i == 2 else f"hi {i}"]}
                for i in range(5)]
        url = f"http://127.0.0.1:{server.server_address[1]}"
        summary = su.use(url, rows, max_tokens=9, clients=2, temperature=0.0)
    finally:
        server.shutdown()
        server.server_close()
    assert summary["conversations"] == 5 and summary["completed"] == 4 and summary["failed"] == 1
    assert summary["completion_tokens"] == 28 and summary["methods"] == {"eagle3": 4}
    assert summary["acceptance"] == 0.5 and summary["tau"] == 28 / 16
    assert len(summary["records"]) == 5 and summary["by_block"][0]["conversations"] == 4
    assert summary["failures_by_status"] == {"500": 1}
    assert summary["failures"][0]["question_id"] == "q-2"
    assert len(server.bodies) == 5
    assert {b["model"] for b in server.bodies} == {"tiny"}  # the name /v1/models gives
    assert all(b["max_tokens"] == 9 and b["temperature"] == 0.0 and len(b["messages"]) == 1
               for b in server.bodies)


def test_use_refuses_a_file_without_turns(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_id": 1}) + "\n")
    assert su.main(["use", "--url", "http://127.0.0.1:9", "--file", str(bad)]) == 2
