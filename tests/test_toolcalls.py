"""toolcalls: each family's calls read from text in its real format (whole and in any chunking),
written and read back, rendered through a real template as transformers renders it (or the
fallback prompt), and constrained by a grammar that accepts exactly the valid calls."""

from __future__ import annotations

import json
import random

import jsonschema
import llguidance
import pytest

from edgespec.errors import ToolCallError
from edgespec.grammar import Grammar, engine_tokenizer
from edgespec.toolcalls import (FALLBACK, SYNTAXES, CallReader, detect, read_all, render,
                                supports_tools, tool_request, write)
from edgespec.toolcalls.parse import Call

from .tiny import CHATML
from .tool_samples import PLAIN, QWEN25_TEMPLATE, SAMPLES, TOOLS, history, tokenizer


def _chunked(syntax, text: str, seed: int):
    reader, rng, out, i = CallReader(syntax), random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        out += reader.feed(text[i:i + n])
        i += n
    out += reader.finish()
    content = "".join(p for p in out if isinstance(p, str)) or None
    return content, [p for p in out if isinstance(p, Call)]


@pytest.mark.parametrize("family,text,content,calls", SAMPLES)
def test_each_family_reads_its_calls_whole_and_chunked(family, text, content, calls):
    syntax = SYNTAXES[family]
    expected = (content, [Call(n, a) for n, a in calls])
    assert read_all(syntax, text) == expected
    for seed in range(20):
        assert _chunked(syntax, text, seed) == expected, seed


@pytest.mark.parametrize("family,text", PLAIN)
def test_text_without_a_call_is_content_unchanged(family, text):
    assert read_all(SYNTAXES[family], text) == (text, [])
    assert _chunked(SYNTAXES[family], text, 1) == (text, [])


def test_text_that_may_start_a_marker_is_held_back_until_resolved():
    reader = CallReader(SYNTAXES["hermes"])
    assert reader.feed("Sure. <tool") == ["Sure."]  # the space may precede a call: held too
    assert reader.feed("box> ok") == [" <toolbox> ok"]
    assert reader.finish() == []


def test_a_cut_call_is_released_as_content_and_parallel_false_keeps_one():
    cut = '<tool_call>\n{"name": "get_time", "argu'
    assert read_all(SYNTAXES["hermes"], cut) == (cut, [])
    two = SAMPLES[0][1]
    assert [c.name for c in read_all(SYNTAXES["hermes"], two, parallel=False)[1]] == ["get_weather"]


@pytest.mark.parametrize("family", sorted(SYNTAXES))
def test_written_calls_read_back(family):
    syntax = SYNTAXES[family]
    calls = [("get_weather", {"city": "Oslo", "days": 2}), ("get_time", {"tz": "CET"})]
    text = write(syntax, calls if syntax.joiner or syntax.wrap_list or family == "mistral_args"
                 else calls[:1])
    got = read_all(syntax, text)[1]
    assert [(c.name, json.loads(c.arguments)) for c in got] == [
        (n, a) for n, a in calls][:len(got)] and got


def test_detect_reads_the_vocabulary_and_the_template():
    qwen = ["<tool_call>", "</tool_call>"]
    assert detect(tokenizer(QWEN25_TEMPLATE, markers=qwen)).name == "hermes"
    assert detect(tokenizer(CHATML, markers=[])).name == "hermes"  # the fallback's syntax
    assert detect(tokenizer(CHATML, markers=["[TOOL_CALLS]"])).name == "mistral"
    assert detect(tokenizer(CHATML, markers=["[TOOL_CALLS]", "[ARGS]"])).name == "mistral_args"
    assert detect(tokenizer(CHATML, markers=["<|tool_call|>"])).name == "phi4"
    llama = "{{ '<|start_header_id|>' + messages[0]['content'] }}"
    assert detect(tokenizer(llama, markers=["<|python_tag|>"])).name == "llama3"
    assert detect(tokenizer("{{ '<start_of_turn>' }}", markers=[])).name == "gemma"


def test_a_template_with_tools_renders_as_transformers_renders_it():
    from transformers.utils.chat_template_utils import render_jinja_template

    tok = tokenizer(QWEN25_TEMPLATE)
    assert supports_tools(tok) == "tools"
    ours = render(tok, history(), TOOLS, SYNTAXES["hermes"])
    decoded = history()
    decoded[2] = {**decoded[2], "content": "", "tool_calls": [
        {**decoded[2]["tool_calls"][0], "function": {"name": "get_weather",
                                                     "arguments": {"city": "Paris", "days": 3}}}]}
    theirs = render_jinja_template([decoded], tools=TOOLS, chat_template=QWEN25_TEMPLATE,
                                   add_generation_prompt=True)[0][0]
    assert ours == theirs
    assert '"name": "get_weather", "arguments": {"city": "Paris", "days": 3}' in ours
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in ours and "# Tools" in ours


def test_a_template_without_tools_gets_the_fallback_prompt():
    tok = tokenizer(CHATML, markers=[])
    assert supports_tools(tok) is None
    text = render(tok, history(), TOOLS, SYNTAXES["hermes"])
    assert FALLBACK.split("{")[0] in text and '"name": "get_time"' in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 3}}\n</tool_call><|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\nsunny, 21C\n</tool_response><|im_end|>" in text
    assert text.count("<|im_start|>system") == 1  # the instruction joins the system message


def _accepts(grammar, tok, text: str) -> bool:
    m = llguidance.LLMatcher(engine_tokenizer(tok), grammar.llguidance(), log_level=0)
    ids = tok.encode(text, add_special_tokens=False)
    return m.try_consume_tokens(ids) == len(ids) and m.is_accepting()


@pytest.mark.parametrize("family", sorted(SYNTAXES))
def test_the_required_grammar_accepts_exactly_valid_calls(family):
    syntax, tok = SYNTAXES[family], tokenizer(CHATML)
    req = tool_request(TOOLS, "required", False, syntax)
    grammar = req.grammar(tok)
    good = write(syntax, [("get_weather", {"city": "Lima", "days": 7})])
    assert _accepts(grammar, tok, good), grammar.source
    assert not _accepts(grammar, tok, write(syntax, [("get_weather", {"city": "Lima", "days": 9})]))
    assert not _accepts(grammar, tok, write(syntax, [("get_wether", {"tz": "UTC"})]))
    assert not _accepts(grammar, tok, "It is sunny.")
    named = tool_request(TOOLS, {"type": "function", "function": {"name": "get_time"}}, None,
                         syntax).grammar(tok)
    assert _accepts(named, tok, write(syntax, [("get_time", {"tz": "UTC"})]))
    assert not _accepts(named, tok, good)
    (call,) = read_all(syntax, good)[1]
    jsonschema.validate(json.loads(call.arguments), TOOLS[0]["function"]["parameters"])


ANSWER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.parametrize("family", sorted(SYNTAXES))
def test_auto_with_a_response_format_allows_calls_or_the_answer(family):
    syntax, tok = SYNTAXES[family], tokenizer(CHATML)
    answer = Grammar.json_schema(ANSWER, True, "response_format.json_schema.schema")
    either = tool_request(TOOLS, "auto", True, syntax).grammar(tok, answer)
    assert _accepts(either, tok, write(syntax, [("get_time", {"tz": "UTC"})])), either.source
    assert _accepts(either, tok, '{"city": "Lima"}')
    assert not _accepts(either, tok, '{"city": "Lima", "x": 1}')  # strict: closed
    assert not _accepts(either, tok, '{"city":"Lima"}')  # not in json.dumps' layout
    assert not _accepts(either, tok, "It is sunny.")
    assert not _accepts(either, tok, write(syntax, [("get_wether", {"tz": "UTC"})]))
    any_object = Grammar("json_object", param="response_format")
    assert _accepts(tool_request(TOOLS, "auto", True, syntax).grammar(tok, any_object), tok,
                    '{"x": [1, 2]}')
    required = tool_request(TOOLS, "required", True, syntax).grammar(tok, answer)
    assert not _accepts(required, tok, '{"city": "Lima"}')  # required: the answer is a call
    assert tool_request(TOOLS, "none", True, syntax).grammar(tok, answer) is answer


def test_a_marker_in_the_vocabulary_is_forced_as_its_token():
    tok = tokenizer(CHATML)
    source = tool_request(TOOLS, "required", True, SYNTAXES["hermes"]).grammar(tok).source
    assert f"<[{tok.token_to_id('<tool_call>')}]>" in source
    plain = tool_request(TOOLS, "required", True, SYNTAXES["hermes"]).grammar(
        tokenizer(CHATML, markers=[])).source
    assert '"<tool_call>"' in plain


@pytest.mark.parametrize("tools,choice,parallel,param", [
    ([{"type": "code_interpreter"}], None, None, "tools.0.type"),
    ([{"type": "function", "function": {"name": "bad name"}}], None, None, "tools.0.function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}], None,
     None, "tools.0.function.parameters"),
    (TOOLS + [TOOLS[0]], None, None, "tools"),
    (TOOLS, "sometimes", None, "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, None, "tool_choice.function.name"),
    (None, "required", None, "tool_choice"),
])
def test_bad_tool_fields_name_the_field(tools, choice, parallel, param):
    with pytest.raises(ToolCallError) as e:
        tool_request(tools, choice, parallel, SYNTAXES["hermes"])
    assert e.value.param == param


def test_tool_choice_semantics():
    hermes = SYNTAXES["hermes"]
    assert tool_request(None, None, None, hermes) is None
    auto = tool_request(TOOLS, None, None, hermes)
    assert auto.choice == "auto" and auto.parallel and auto.offered == TOOLS
    assert auto.grammar(tokenizer(CHATML)) is None and auto.reader() is not None
    none = tool_request(TOOLS, "none", False, hermes)
    assert none.offered is None and none.reader() is None and not none.parallel
    assert len(tool_request(TOOLS, None, None, SYNTAXES["mistral"]).call_id()) == 9
