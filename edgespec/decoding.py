"""A generation's outputs and its coroutine: :class:`Step` (one step's tokens and text),
:class:`Result` (a whole generation), :class:`Need` (a forward a decoding asks for) and
:class:`Decoding` (one generation in progress; ``engine.py`` has the contract).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field

from .drafters.base import Drafter
from .logprobs import TokenLogprob
from .stats import Stats
from .stream_text import Segment
from .targets.batched import Part
from .targets.target import TargetOutput


@dataclass
class Step:
    """One engine step's output.

    ``segments`` is the step's text in runs, each marked drafted (from accepted drafts: the first
    ``accepted`` of ``token_ids``) or not (produced by the target: the last token, the bonus or
    correction). Their concatenation is ``text``; see ``stream_text`` for how a character split
    over tokens, or held back for a possible stop string, is attributed.
    """

    token_ids: list[int]  # newly committed tokens (EOS and anything past a stop excluded)
    segments: tuple[Segment, ...]  # the text they complete (held back while it could start a stop)
    accepted: int  # how many of token_ids were drafted and accepted
    proposed: int  # how many tokens the drafter proposed this step
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" on the last step
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry, when asked for

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)


@dataclass
class Result:
    """A whole generation: its text, token ids, why it ended and what it cost (``stats``)."""

    text: str
    token_ids: list[int]
    stats: Stats
    finish_reason: str = "length"  # "stop" | "length" | "cancelled"
    steps: list[Step] = field(default_factory=list, repr=False)

    @property
    def logprobs(self) -> list[TokenLogprob] | None:
        """One per token, when the generation was asked for them (``logprobs=``)."""
        if not self.steps or self.steps[0].logprobs is None:
            return None
        return [lp for s in self.steps for lp in s.logprobs]

    @classmethod
    def from_steps(cls, steps: list[Step], stats: Stats, finish_reason: str | None = None) -> Result:
        """The Result of ``steps``; ``finish_reason`` defaults to the last step's."""
        reason = finish_reason or (steps[-1].finish_reason if steps else None) or "length"
        return cls("".join(s.text for s in steps), [t for s in steps for t in s.token_ids], stats,
                   reason, steps)


@dataclass
class Need:
    """A decoding's request for one target forward, answered by sending its ``TargetOutput``
    into the decoding. ``run()`` performs it alone; ``part`` is set for a step's tree, which
    may instead be scored in one forward with other decodings' (``targets/batched.py``:
    the same output). Prefill chunks and forwards through a drafter's lower layers run alone."""

    run: Callable[[], TargetOutput]
    part: Part | None = None


class Decoding:
    """One generation in progress: a coroutine that yields a :class:`Need` for each target
    forward (and is sent its output) and a :class:`Step` for each step, with its own drafter,
    cache, stats and random stream.

    ``rows``: the most tree nodes its next step may score (None: as many as its drafter
    proposes), set by a scheduler that shares forwards between decodings; ``alone()``: whether
    it decodes alone (only then does plain greedy decoding run pipelined). ``cancel()`` ends it
    after its current step. ``alone_steps()`` drives it by itself.
    """

    def __init__(self, drafter: Drafter | None, stats: Stats):
        self.drafter = drafter
        self.stats = stats
        self.rows: int | None = None
        self.alone: Callable[[], bool] = lambda: True
        self.cancelled = False
        self.gen: Generator | None = None

    def cancel(self) -> None:
        self.cancelled = True

    def alone_steps(self) -> Iterator[Step]:
        """Run every forward alone; yield the steps."""
        gen, sent = self.gen, None
        try:
            while True:
                try:
                    item = gen.send(sent)
                except StopIteration:
                    return
                if isinstance(item, Need):
                    sent = item.run()
                else:
                    sent = None
                    yield item
        finally:
            gen.close()
