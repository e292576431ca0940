"""`edgespec chat`: the Textual app driven headless by Textual's pilot, the line mode through pipes,
and a real terminal (tmux) run.

The tiny model drafts for itself (``--draft`` = the target), so every draft is accepted and each
step ends with one token the target produced itself: both token styles appear in every answer.
Sampling (temperature 1, seeded) keeps the random model from looping on one token; its EOS is
switched off so an answer runs to the token limit, or until a test stops it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.config import GenerationConfig, SpecConfig
from edgespec.tui.app import ChatApp
from edgespec.tui.cli import chat
from edgespec.tui.render import DRAFTED_STYLE, TARGET_STYLE, ansi, printable
from edgespec.tui.screens import HelpScreen
from edgespec.stream_text import Segment
from edgespec.tui.session import ChatSession, aopen_session, open_session
from edgespec.worker import Worker, loader
from edgespec.tui.widgets import AnswerView, ChatInput, LoadingPanel, StatusBar, UserMessage

ROOT = Path(__file__).resolve().parents[1]
SAMPLED = {"temperature": 1.0, "seed": 1, "top_p": 1.0, "repetition_penalty": 1.0}
"""Plain sampling (no chat defaults): a model drafting for itself has every draft accepted."""
DRAFTED_FG, TARGET_FG = DRAFTED_STYLE.split()[0], TARGET_STYLE.split()[0]


@pytest.fixture(scope="module")
def tiny(tiny_models) -> str:
    return str(tiny_models.path(layers=2, scale=0.03, context=4096))


def chat_app(model: str, *, method: str = "draft", max_tokens: int = 40,
             draft: str | None = "self", step_delay: float = 0.0) -> ChatApp:
    spec = SpecConfig(method=method, draft=model if draft == "self" else draft)

    async def load(status):
        session = await aopen_session(model, spec=spec, sampling=SAMPLED,
                                      generation=GenerationConfig(max_tokens=max_tokens),
                                      status=status)
        session.target.tokenizer.eos_token_ids = frozenset()
        if step_delay:  # a slow target, so a test can act while an answer is being generated
            score = session.target.score

            def slow_score(*args, **kwargs):
                time.sleep(step_delay)
                return score(*args, **kwargs)

            session.target.score = slow_score
        return session

    return ChatApp(load, Path(model).name)


def drive(app: ChatApp, body, size=(100, 30), load_timeout: float = 30.0) -> None:
    """Run ``body(pilot)`` against the app once it has loaded (or failed to)."""

    async def main():
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: app.busy != "loading", load_timeout)
            await body(pilot)

    asyncio.run(main())


async def until(pilot, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await pilot.pause(0.02)


async def send(pilot, text: str) -> AnswerView:
    await pilot.press(*[("space" if c == " " else c) for c in text], "enter")
    await until(pilot, lambda: pilot.app.busy == "generating" or pilot.app.busy is None)
    return pilot.app.query(AnswerView).last()


async def answered(pilot, timeout: float = 30.0) -> AnswerView:
    await until(pilot, lambda: pilot.app.busy is None, timeout)
    return pilot.app.query(AnswerView).last()


def rendered_colors(view: AnswerView) -> set[str]:
    """Foreground colours of the answer's text as drawn on the screen."""
    colors = set()
    for y in range(1, view.region.height - 1):  # inside the border
        for x in range(2, view.region.width - 2):
            color = view.get_style_at(x, y).color
            if color is not None and color.triplet is not None:
                colors.add(color.triplet.hex)
    return colors


def status(app: ChatApp) -> str:
    return str(app.query_one(StatusBar).render())


# the pieces behind the styling --------------------------------------------------------------

def test_printable_and_ansi():
    assert printable("a\x1b[31mb\r\n\tc\x07") == "a\u241b[31mb\u240d\n\tc\u2407"
    segments = [Segment("drafted ", True), Segment("\x1bx", False)]
    assert ansi(segments, color=False) == "drafted \x1bx"  # a pipe gets the exact text
    assert ansi(segments, color=True) == "\x1b[32mdrafted \x1b[0m\u241bx"


def test_reply_segments_are_the_engines(tiny):
    """Updates carry the engine's segments as they are: the answer is their text, both kinds."""
    session = open_session(tiny, spec=SpecConfig(method="draft", draft=tiny),
                           sampling={**SAMPLED, "seed": 3},
                           generation=GenerationConfig(max_tokens=30))
    session.target.tokenizer.eos_token_ids = frozenset()
    updates = list(session.reply("the cat"))
    session.close()
    segments = [s for u in updates for s in u.segments]
    assert "".join(s.text for s in segments) == session.messages[-1]["content"]
    assert {s.drafted for s in segments} == {True, False}


def test_session_stop_before_the_stream_begins(tiny):
    """A stop that lands between sending and the first step still stops the answer early."""
    from edgespec import load_target

    worker = Worker(loader(load_target(tiny))).start()
    session = ChatSession(worker, generation=GenerationConfig(max_tokens=500))
    session.target.tokenizer.eos_token_ids = frozenset()
    session.stop()
    updates = list(session.reply("hi"))
    assert updates[-1].finish_reason == "cancelled" and len(updates) <= 2
    assert [m["role"] for m in session.messages] == ["user", "assistant"]
    assert list(session.reply("again"))[-1].finish_reason == "length"  # the stop was used up
    session.close()


def test_session_methods_and_draft_needs_come_from_the_registry(tiny):
    """The palette lists the registry's methods this session can run: those needing a draft
    model (draft, cascade) only with --draft, which is then loaded once for all of them."""
    from edgespec import load_target
    from edgespec.drafters import registry
    from edgespec.errors import ConfigError

    target = load_target(tiny)
    worker = Worker(loader(target, draft=tiny)).start()
    alone = ChatSession(worker, spec=SpecConfig(method="lookup"))
    assert alone.methods == list(registry.available(None)) and "cascade" not in alone.methods
    with pytest.raises(ConfigError, match="--draft REF to use 'cascade'"):
        alone.set_method("cascade")
    drafted = ChatSession(worker, spec=SpecConfig(method="early-exit", exit_layer=1, draft=tiny),
                          generation=GenerationConfig(max_tokens=4))
    assert drafted.methods == [m.name for m in registry.METHODS  # no head, no MTP layer
                               if not m.needs_head and not m.needs_mtp]
    for method in ("cascade", "lookup", "draft"):  # exit_layer stays with early-exit
        drafted.set_method(method)
        drafted.prepare()
        assert list(drafted.reply("hi"))[-1].stats.method == method
    assert worker.draft is not None  # the draft model: loaded once, with the target
    worker.stop()


# the Textual app -----------------------------------------------------------------------------

def test_send_streams_both_styles_and_toggle(tiny, monkeypatch):
    app = chat_app(tiny, max_tokens=300, step_delay=0.03)
    shown = []  # the answer's length after each redraw: it grows while being generated
    append = AnswerView.append

    def recording_append(self, segments):
        append(self, segments)
        shown.append(len(self.text))

    monkeypatch.setattr(AnswerView, "append", recording_append)

    async def body(pilot):
        assert app.focused is app.query_one(ChatInput)
        await send(pilot, "hello there")
        view = await answered(pilot)
        assert isinstance(app.query(UserMessage).last(), UserMessage)
        assert len([n for n in shown if 0 < n < len(view.text)]) >= 3, shown
        assert {p.drafted for p in view.segments} == {True, False}
        assert {DRAFTED_FG, TARGET_FG} <= rendered_colors(view)
        text = status(app)
        assert "draft" in text and "τ" in text and "accepted 100%" in text and "tok/s" in text
        assert "tokens" in view.border_subtitle
        await pilot.press("ctrl+t")  # plain reading: no token colours
        assert not {DRAFTED_FG, TARGET_FG} & rendered_colors(view)
        await pilot.press("ctrl+t")
        assert {DRAFTED_FG, TARGET_FG} <= rendered_colors(view)

    drive(app, body)


def test_stop_mid_answer_keeps_the_text(tiny):
    app = chat_app(tiny, max_tokens=3000, step_delay=0.02)

    async def body(pilot):
        for key in ("escape", "ctrl+c"):
            view = await send(pilot, "go on")
            await until(pilot, lambda v=view: len(v.text) >= 10)
            assert "Stop" in app.export_screenshot()  # the footer offers it while generating
            await pilot.press(key)
            await answered(pilot)
            assert app._last.finish_reason == "cancelled"
            assert 0 < app._last.stats.generated_tokens < 3000
            assert view.text and "stopped" in view.border_subtitle
            assert app.session.messages[-1] == {"role": "assistant", "content": view.text}
        assert len(app.session.messages) == 4
        await until(pilot, lambda: "Stop" not in (shot := app.export_screenshot()) and "Quit" in shot)

    drive(app, body)


async def palette(pilot, query: str) -> None:
    await pilot.press("ctrl+p")
    await until(pilot, lambda: type(pilot.app.screen).__name__ == "CommandPalette")
    await pilot.press(*[("space" if c == " " else c) for c in query])
    await pilot.pause(0.4)  # the palette searches asynchronously
    await pilot.press("enter")
    await until(pilot, lambda: len(pilot.app.screen_stack) == 1)


def test_palette_switches_method_and_turns_reuse_the_cache(tiny):
    app = chat_app(tiny, max_tokens=24)

    async def body(pilot):
        await send(pilot, "hi")
        await answered(pilot)
        await palette(pilot, "method none")
        assert app.session.method == "none"
        await send(pilot, "and again")
        await answered(pilot)
        plain = app._last.stats
        assert plain.method == "none" and plain.proposed == 0
        assert plain.cached_tokens > 0  # the first turn was not read again
        assert app.session.plain_rate and "plain" in status(app)
        await palette(pilot, "method draft")
        await palette(pilot, "temperature 0 greedy")
        assert app.session.sampling.temperature == 0.0
        await send(pilot, "once more")
        await answered(pilot)
        assert app._last.stats.method == "draft" and app._last.speedup is not None
        assert "× vs plain" in status(app) and "T 0" in status(app)
        assert [m["role"] for m in app.session.messages] == ["user", "assistant"] * 3

    drive(app, body)


def test_newlines_help_and_new_conversation(tiny):
    app = chat_app(tiny, max_tokens=400, step_delay=0.02)

    async def body(pilot):
        await pilot.press("a", "shift+enter", "b", "ctrl+j", "c")  # new lines, nothing sent
        assert app.query_one(ChatInput).text == "a\nb\nc" and not app.query(AnswerView)
        app.query_one(ChatInput).clear()
        await send(pilot, "hi")
        await answered(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        shown = app.export_screenshot().replace("&#160;", " ")
        assert all(key in shown for key in ("Shift+Enter", "Escape, Ctrl+C", "Ctrl+N", "Ctrl+Q"))
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("ctrl+n")
        await pilot.pause(0.05)
        assert not app.query(AnswerView) and not app.query(UserMessage)
        assert app.session.messages == []
        view = await send(pilot, "fresh start")  # Ctrl+N while answering: stops, then clears
        await until(pilot, lambda: view.text)
        await pilot.press("ctrl+n")
        await until(pilot, lambda: app.busy is None)
        await pilot.pause(0.05)
        assert app._last is None and not app.query(AnswerView) and app.session.messages == []

    drive(app, body)


def test_load_failure_is_shown_and_exits_nonzero(tmp_path):
    app = chat_app(str(tmp_path / "no-such-model"), draft=None, method="none")

    async def body(pilot):
        assert app.busy == "failed"
        panel = app.query_one(LoadingPanel)
        assert panel.has_class("failed")
        assert "no-such-model" in str(panel.query_one("#loading-what").render())
        await pilot.press("x")
        await pilot.pause(0.05)

    drive(app, body)
    assert app.return_code == 2 and "no-such-model" in app.load_error


# line mode -----------------------------------------------------------------------------------

def test_plain_mode_through_a_pipe(tiny):
    """Not a terminal: line mode by itself, the model's exact text, stats on stderr."""
    cmd = [sys.executable, "-m", "edgespec.cli", "chat", tiny, "--method", "draft", "--draft", tiny,
           "--temp", "1", "--top-p", "1", "--repetition-penalty", "1", "--seed", "1",
           "--max-tokens", "12"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, input="hello\n/method none\nhello again\n", capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "Traceback" not in proc.stderr
    assert re.search(r"\[draft\] 12 tokens, .* tok/s, τ [\d.]+, accepted 100%", proc.stderr)
    assert re.search(r"\[none\] 12 tokens, .*cached", proc.stderr), proc.stderr


def test_plain_mode_colours_and_errors(tiny):
    args = [tiny, "--plain", "--method", "draft", "--draft", tiny, "--temp", "1", "--seed", "1",
            "--top-p", "1", "--repetition-penalty", "1", "--max-tokens", "12"]
    result = CliRunner().invoke(chat, [*args, "--color", "always"], input="hi\n/temp 9999\n")
    assert result.exit_code == 0, result.output
    assert "\x1b[32m" in result.output and "error: temperature must be" in result.output
    result = CliRunner().invoke(chat, ["/no/such/model", "--plain"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("edgespec: error:")


# a real terminal -----------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_in_tmux_starts_answers_and_quits_cleanly(tiny):
    session = f"edgespec-chat-test-{os.getpid()}"
    env = f"PYTHONPATH={ROOT} TERM=xterm-256color"
    tmux = ["tmux", "-L", session]  # a private server: nothing else is touched
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "110", "-y", "32",
                    "bash --norc --noprofile"], check=True)

    def keys(*k):
        subprocess.run([*tmux, "send-keys", "-t", session, *k], check=True)

    def pane():
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True,
                              text=True).stdout

    def wait(pattern, timeout=40.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, text := pane()):
                return text
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} never appeared; the pane shows:\n{pane()}")

    try:
        keys(f"{env} {sys.executable} -m edgespec.cli chat {tiny} --method draft --draft {tiny} "
             "--temp 1 --top-p 1 --repetition-penalty 1 --seed 1 --max-tokens 30; echo EXIT=$?",
             "Enter")
        wait(r"ready\s+draft")  # the status bar, once the model has loaded
        keys("hello", "Enter")
        screen = wait(r"\d+ tokens · [\d.]+ tok/s")  # sampling may end on EOS before 30
        assert "you" in screen and "accepted 100%" in screen
        keys("C-q")
        wait(r"EXIT=0")
        keys("stty -a | tr ' ' '\\n' | grep -x -e icanon -e echo | tr '\\n' ' '; echo usable",
             "Enter")
        wait(r"\nicanon echo usable")  # the shell answers, in cooked mode with echo again
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


# the demo model ------------------------------------------------------------------------------

@pytest.mark.demo
def test_demo_model_chat():
    """The demo model drafting for itself (every draft is accepted, so each step shows both styles):
    two turns around a plain-speed measurement, then a palette switch to plain decoding, a stopped
    answer and a new conversation.

    With EDGESPEC_CHAT_SNAPSHOT=path the finished second answer is saved there as SVG
    (docs/chat.svg is made this way)."""
    spec = SpecConfig(method="draft", draft="demo")

    async def load(status):  # plain greedy (no chat defaults): self-drafts are all accepted
        return await aopen_session("demo", spec=spec,
                                   sampling={"temperature": 0.0, "repetition_penalty": 1.0},
                                   generation=GenerationConfig(max_tokens=48), status=status)

    app = ChatApp(load, "demo")

    async def body(pilot):
        await send(pilot, "What is the capital of France?")
        await answered(pilot, timeout=180)
        await palette(pilot, "measure plain")
        await until(pilot, lambda: app.busy is None, timeout=120)
        assert app.session.plain_rate
        await send(pilot, "Name three famous buildings there.")
        view = await answered(pilot, timeout=180)
        assert {p.drafted for p in view.segments} == {True, False}
        assert {DRAFTED_FG, TARGET_FG} <= rendered_colors(view)
        assert "× vs plain" in status(app) and app._last.stats.cached_tokens > 0
        assert app._last.stats.acceptance_rate > 0.9  # self-drafting: all but near-ties
        if path := os.environ.get("EDGESPEC_CHAT_SNAPSHOT"):
            await until(pilot, lambda: "Quit" in app.export_screenshot())  # the footer is back
            Path(path).write_text(app.export_screenshot(title="edgespec chat"))
        await palette(pilot, "method none")
        # room enough that the answer is still running when Esc arrives, however fast the
        # machine (a short answer can be over before the key is pressed)
        app.session.generation = GenerationConfig(max_tokens=2000)
        view = await send(pilot, "Tell me a long story about Paris.")
        await until(pilot, lambda: len(view.text) >= 1, timeout=60)
        await pilot.press("escape")
        await answered(pilot, timeout=60)
        assert app._last.finish_reason == "cancelled" and app._last.stats.method == "none"
        await pilot.press("ctrl+n")
        await pilot.pause(0.05)
        assert app.session.messages == [] and not app.query(AnswerView)

    drive(app, body, size=(110, 32))


def test_loading_says_how_far_the_verify_cost_measurement_is(tiny, tmp_path, monkeypatch):
    """The first method that sizes its trees by this machine's cost curve measures it once
    (seconds for the demo model); the chat's loading panel gets its progress as status lines
    (its tqdm bar goes to stderr, which the chat's screen hides). Read from the cache after.
    (The drafter built here measures the curve and drafts nothing: the random tiny model has
    no trained head, which eagle3, the default where one is found, needs.)"""
    from edgespec.targets import cost
    from edgespec.tui import session as session_module

    def measuring_drafter(spec, target, sampling=None, draft=None):
        cost.verify_cost_curve(target)

    monkeypatch.setattr(session_module, "make_drafter", measuring_drafter)
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(cost, "_memo", {})
    lines = []
    open_session(tiny, spec=SpecConfig(method="lookup"), generation=GenerationConfig(max_tokens=8),
                 status=lines.append).close()
    measuring = [line for line in lines if "verify cost" in line]
    total = len(cost.SIZES) * 11
    assert measuring and measuring[-1].endswith(f"{total}/{total} forwards")
    lines.clear()
    monkeypatch.setattr(cost, "_memo", {})
    open_session(tiny, spec=SpecConfig(method="lookup"), generation=GenerationConfig(max_tokens=8),
                 status=lines.append).close()
    assert not [line for line in lines if "verify cost" in line]
