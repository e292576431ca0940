"""Engine log-probabilities -> OpenAI's ``logprobs`` objects (chat and legacy completions).

Chat (``choices[].logprobs``, and the same shape in each streamed delta chunk, covering the
chunk's tokens): ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
"logprob", "bytes"}]}], "refusal": null}``. Completions: ``{"tokens", "token_logprobs",
"top_logprobs": [{token: logprob}], "text_offset"}``, each offset the number of whole
characters of the completion before the token (continued across streamed chunks); a position's
``top_logprobs`` also holds the chosen token (OpenAI: up to ``logprobs + 1`` entries).

A token's ``token`` is its text; one that is only part of a UTF-8 character (byte-level BPE) is
written ``bytes:\\xNN...`` as OpenAI writes it, and ``bytes`` always holds its bytes. The values
are the engine's (``edgespec/logprobs.py``): the raw model distribution.
"""

from __future__ import annotations

from ..loading.tokenizer import Tokenizer
from ..logprobs import TokenLogprob


class LogprobFormat:
    """One request's log-probabilities in OpenAI's shapes (completions keep a running offset)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._done = bytearray()  # the completion's bytes so far (for text_offset)
        self._text: dict[int, tuple[str, list[int]]] = {}

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._text:
            raw = self.tokenizer.token_bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self._text[token_id] = (text, list(raw))
        return self._text[token_id]

    def _entry(self, token_id: int, logprob: float) -> dict:
        text, raw = self._token(token_id)
        return {"token": text, "logprob": logprob, "bytes": raw}

    def chat(self, lps: list[TokenLogprob]) -> dict:
        return {"content": [{**self._entry(lp.token, lp.logprob),
                             "top_logprobs": [self._entry(t, v) for t, v in lp.top]}
                            for lp in lps], "refusal": None}

    def completion(self, lps: list[TokenLogprob]) -> dict:
        tokens, offsets, tops = [], [], []
        for lp in lps:
            text = self._token(lp.token)[0]
            tokens.append(text)
            offsets.append(len(self._done.decode("utf-8", errors="ignore")))
            self._done += bytes(self._token(lp.token)[1])
            top = {self._token(t)[0]: v for t, v in lp.top}
            top.setdefault(text, lp.logprob)
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
                "top_logprobs": tops, "text_offset": offsets}
