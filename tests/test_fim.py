"""Fill-in-the-middle (``edgespec/fim.py``): each family's prompt on a tiny tokenizer that has
its FIM tokens, the refusal for a tokenizer without them, prompt lookup drafting from the
suffix, and greedy FIM output identical with lookup and without (the Python API).
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import decoders, models, pre_tokenizers

from edgespec.drafters.lookup import PromptLookupDrafter
from edgespec.errors import ConfigError
from edgespec.fim import encode_fim, fim_format
from edgespec.loading.tokenizer import Tokenizer

from .tiny import _byte_level_tokenizer

FIM_TOKENS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
PREFIX, SUFFIX = "def area(r):\n    ", "\n    return a\n"

# family -> (marker tokens, bos token or None, the prompt's documented text)
BYTE_LEVEL = {
    "starcoder": (FIM_TOKENS, None,
                  f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>"),
    "qwen2.5-coder": (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), None,
                      f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"),
    "deepseek-coder": (("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"), "<｜begin▁of▁sentence｜>",
                       f"<｜begin▁of▁sentence｜><｜fim▁begin｜>{PREFIX}<｜fim▁hole｜>{SUFFIX}"
                       "<｜fim▁end｜>"),
}


def _byte_level(markers, bos=None) -> Tokenizer:
    backend = _byte_level_tokenizer()
    backend.add_special_tokens([*markers, *([bos] if bos else [])])
    return Tokenizer(backend, {"bos_token": bos, "add_bos_token": bos is not None})


@pytest.mark.parametrize("family", list(BYTE_LEVEL))
def test_byte_level_families(family):
    markers, bos, text = BYTE_LEVEL[family]
    tok = _byte_level(markers, bos)
    assert fim_format(tok).family == family
    ids = encode_fim(tok, PREFIX, SUFFIX)
    assert tok.decode(ids) == text
    p, s, m = (tok.token_to_id(t) for t in markers)
    lead = [tok.token_to_id(bos)] if bos else []
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    assert ids == [*lead, p, *enc(PREFIX), s, *enc(SUFFIX), m]


def test_markers_in_the_text_stay_text_pieces_apart():
    """The prefix and suffix are encoded on their own: the markers come only from fim.py."""
    tok = _byte_level(FIM_TOKENS)
    ids = encode_fim(tok, "a", "b")
    assert [tok.decode([i]) for i in ids] == ["<fim_prefix>", "a", "<fim_suffix>", "b", "<fim_middle>"]


def _sentencepiece_like() -> Tokenizer:
    """A CodeLlama-like tokenizer: SentencePiece's leading space (Metaspace), byte fallback."""
    chars = sorted(set("abcdefghijklmnopqrstuvwxyz():=+*. ") - {" "})
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3}
    vocab.update({f"<0x{b:02X}>": 4 + b for b in range(256)})
    for c in chars:
        vocab.setdefault(c, len(vocab))
    backend = Backend(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    backend.add_special_tokens(["<s>", "</s>", "▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"])
    return Tokenizer(backend, {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True})


def test_codellama():
    """Meta's infilling_prompt_tokens: [BOS, PRE] + encode(prefix) (SentencePiece's leading
    space) + [SUF] + the suffix without it + [MID]; the middle ends at <EOT>."""
    tok = _sentencepiece_like()
    fmt = fim_format(tok)
    assert fmt.family == "codellama" and fmt.stop == ("<EOT>",)
    ids = encode_fim(tok, "def f(x):", "return x")
    pre, suf, mid = (tok.token_to_id(t) for t in ("▁<PRE>", "▁<SUF>", "▁<MID>"))
    space = tok.token_to_id("▁")
    prefix = tok.encode("def f(x):", add_special_tokens=False)
    assert prefix[0] == space  # the leading space the prefix keeps
    j = ids.index(suf)
    assert ids[:j] == [tok.bos_token_id, pre, *prefix] and ids[-1] == mid
    suffix = ids[j + 1:-1]
    assert suffix[0] != space and tok.decode(suffix) == "return x"  # ... and the suffix has not
    assert tok.encode("return x", add_special_tokens=False) == [space, *suffix]


def test_no_fim_tokens_is_an_error_that_says_so():
    tok = Tokenizer(_byte_level_tokenizer())
    assert fim_format(tok) is None
    with pytest.raises(ConfigError, match="tiny has no fill-in-the-middle tokens"):
        encode_fim(tok, "a", "b", "tiny")
    with pytest.raises(ConfigError, match="suffix must be a str"):
        encode_fim(_byte_level(FIM_TOKENS), "a", 5)


def test_prompt_lookup_drafts_from_the_suffix():
    """The suffix is in the prompt, so the drafter's index has it: once the middle reaches the
    suffix's first tokens, lookup drafts the rest of the suffix (no extra text needed)."""
    tok = _byte_level(FIM_TOKENS)
    suffix = "\n    return total_area_of_circle\n"
    ids = encode_fim(tok, "def f(r):\n    x = r * r", suffix)
    drafter = PromptLookupDrafter(num_draft=8, max_draft=12)
    drafter.prefill(ids, None)
    tail = tok.encode(suffix, add_special_tokens=False)
    drafter.index.extend(tail[:4])  # the generated middle has just re-joined the suffix
    tree = drafter.propose(budget=12)
    assert tree.num_drafted >= 3 and tree.tokens[1:] == tail[4:4 + tree.num_drafted]


@pytest.fixture(scope="module")
def fim_model(tiny_models):
    return tiny_models.path(tie=False, extra_tokens=FIM_TOKENS)


def test_python_api_fim_lookup_equals_plain(fim_model):
    import edgespec

    with edgespec.load(str(fim_model), progress=False) as llm:
        suffix = " the cat sat on the mat\n"
        plain = llm.complete("the cat", suffix=suffix, method="none", temperature=0,
                             max_tokens=40)
        drafted = llm.complete("the cat", suffix=suffix, method="lookup", temperature=0,
                               max_tokens=40)
        assert drafted.token_ids == plain.token_ids and drafted.text == plain.text
        assert drafted.stats.proposed > 0  # lookup did draft (from the prompt, suffix included)
        ids = encode_fim(llm.target.tokenizer, "the cat", suffix)
        assert llm.complete(ids, method="none", temperature=0, max_tokens=40).text == plain.text
        with pytest.raises(ConfigError, match="option of complete"):
            llm.chat("hi", suffix="x")


def test_fim_workload_rows_are_stdlib_code_with_a_hole():
    """scripts/make_fim_workload.py: >= 30 rows; prefix + middle + suffix is the module's own
    text (after the comment naming it); the committed file is what the script writes."""
    import json
    import sysconfig
    from pathlib import Path

    from .script_module import SCRIPTS, load_script

    rows = load_script("make_fim_workload").rows()
    assert len(rows) >= 30 and {r["kind"] for r in rows} == {"line", "block", "tail"}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for r in rows:
        head, _, before = r["turns"][0].partition("\n")
        module = head.split()[1].removesuffix(",")
        assert r["middle"].strip() and r["category"] == "fim"
        assert before + r["middle"] + r["suffix"] in (stdlib / module).read_text(), r["source"]
    committed = (SCRIPTS.parent / "data" / "workloads" / "fim.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in committed] == rows


def test_cli_generate_suffix(fim_model, tiny_models, tmp_path):
    """`edgespec generate PREFIX --suffix FILE` prints what the Python API completes."""
    import json

    from click.testing import CliRunner

    import edgespec
    from edgespec.cli import main

    suffix = tmp_path / "after.py"
    suffix.write_text(" sat on the mat\n")
    args = ["generate", "the cat", "--model", str(fim_model), "--suffix", str(suffix),
            "--method", "lookup", "--temperature", "0", "--max-tokens", "16", "--json"]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    with edgespec.load(str(fim_model), progress=False) as llm:
        expected = llm.complete("the cat", suffix=" sat on the mat\n", temperature=0,
                                max_tokens=16, method="none")
    assert json.loads(out.output.splitlines()[-1])["token_ids"] == expected.token_ids
    plain = CliRunner().invoke(main, ["generate", "a", "--model", str(tiny_models.path()),
                                      "--suffix", str(suffix)])
    assert plain.exit_code != 0 and "no fill-in-the-middle tokens" in plain.output


def test_cli_suffix_refuses_a_system_message(tmp_path):
    """--suffix builds a raw FIM prompt: a --system message would be dropped, so it is refused
    (before any model loads)."""
    from click.testing import CliRunner

    from edgespec.cli import main

    suffix = tmp_path / "after.py"
    suffix.write_text(" sat on the mat\n")
    out = CliRunner().invoke(main, ["generate", "the cat", "--model", str(tmp_path / "absent"),
                                    "--suffix", str(suffix), "--system", "be terse"])
    assert out.exit_code != 0 and "--system" in out.output and "--suffix" in out.output
