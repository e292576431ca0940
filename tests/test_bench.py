"""The benchmark on a tiny random model: report shape, the self-draft oracle, aggregation math,
prompt-file errors and rendering."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from click.testing import CliRunner

from edgespec.bench import BenchPrompt, format_report, load_prompts, report_markdown, run_bench, summarize
from edgespec.bench_plot import plot_report
from edgespec.cli import main
from edgespec.config import GenerationConfig
from edgespec.drafters import registry
from edgespec.errors import ConfigError

PROMPTS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a poem about the sea.", "Shorter."]},
    {"question_id": 2, "category": "writing", "turns": ["Draft an email to the team."]},
    {"question_id": 3, "category": "math", "turns": ["What is 12 times 7?"]},
]


def write_jsonl(path, objs) -> str:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tiny_models):
    return tiny_models.path()


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "p.jsonl", PROMPTS)


@pytest.fixture(scope="module")
def report(target, prompts_file):
    prompts = load_prompts(prompts_file)
    return run_bench(target, ["draft"], prompts, generation=GenerationConfig(max_tokens=12),
                     draft_target=target, spec={"num_draft": 3}, progress=False,
                     prompts_file=prompts_file)


def test_self_draft_oracle_report(report):
    assert list(report["methods"]) == ["none", "draft"]
    base, draft = report["methods"]["none"]["overall"], report["methods"]["draft"]["overall"]
    assert draft["exact_match"] == base["exact_match"] == "3/3"
    assert draft["acceptance_rate"] == 1.0 and draft["tau"] > 1.0 and draft["speedup"] > 0
    assert base["tau"] == 1.0 and base["acceptance_rate"] is None and base["speedup"] == 1.0
    assert draft["tokens"] == base["tokens"] == 36 and draft["prompts"] == 3
    for m in report["methods"].values():
        assert list(m["categories"]) == ["writing", "math"]
        assert m["categories"]["writing"]["prompts"] == 2
    assert [(r["method"], r["id"]) for r in report["prompts"][:2]] == [("none", 1), ("draft", 1)]
    assert len(report["prompts"]) == 6
    env = report["env"]
    assert {"backend", "device", "blas", "dtype", "model", "mlx_version", "edgespec_version",
            "max_tokens", "prompts_file", "num_prompts", "cpu_count", "platform"} <= set(env)
    assert env["num_prompts"] == 3 and env["dtype"] == "float32" and env["max_tokens"] == 12
    json.dumps(report)  # --json must be able to write it as is


def test_report_renders(report):
    md = report_markdown(report)
    for word in ("none", "draft", "writing", "math", "overall", "3/3"):
        assert word in md
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 2 * 3  # header, rule, (overall + 2 categories) x 2 methods
    assert "overall" in table[2] and "overall" in table[3]
    console = Console(file=io.StringIO(), width=200)
    console.print(format_report(report))
    assert "method: draft" in console.file.getvalue()


def row(prompt, category, method, tokens, forwards, decode_s, proposed=0, accepted=0,
        draft_s=0.0, verify_s=0.0, peak=10.0, exact=True):
    return {"prompt": prompt, "id": prompt, "category": category, "method": method,
            "generated_tokens": tokens, "target_forwards": forwards, "proposed": proposed,
            "accepted": accepted, "prefill_s": 0.5, "decode_s": decode_s, "draft_s": draft_s,
            "verify_s": verify_s, "peak_memory_mb": peak, "exact": exact}


def test_summarize_pools_and_compares_with_baseline():
    rows = [
        row(0, "a", "none", 10, 10, 1.0), row(0, "a", "draft", 10, 4, 0.5, 8, 6, 0.1, 0.3, 20.0),
        row(1, "b", "none", 20, 20, 5.0), row(1, "b", "draft", 20, 5, 1.0, 20, 15, 0.2, 0.6, 30.0, False),
    ]
    out = summarize(rows)["methods"]
    d = out["draft"]["overall"]
    assert d["tau"] == round(30 / 9, 3)
    assert d["acceptance_rate"] == round(21 / 28, 3)
    assert d["tokens_per_s"] == 20.0  # 30 tokens / 1.5 s
    assert d["speedup"] == 4.0  # baseline: 30 tokens / 6 s = 5 tok/s
    assert d["median_speedup"] == 3.5  # per prompt: 20/10 = 2x and 20/4 = 5x
    assert d["exact_match"] == "1/2"
    assert (d["draft_s"], d["verify_s"], d["other_s"]) == (0.3, 0.9, 0.3)
    assert d["prefill_s"] == 1.0 and d["peak_memory_mb"] == 30.0 and d["tokens"] == 30
    b = out["draft"]["categories"]["b"]
    assert (b["speedup"], b["tau"], b["prompts"]) == (5.0, 4.0, 1)
    assert out["none"]["overall"]["speedup"] == 1.0 and out["none"]["overall"]["acceptance_rate"] is None


def test_summarize_without_exact_match_under_sampling():
    rows = [row(0, "a", "none", 5, 5, 1.0, exact=None), row(0, "a", "draft", 5, 2, 0.5, exact=None)]
    assert summarize(rows)["methods"]["draft"]["overall"]["exact_match"] is None


def test_load_prompts(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", PROMPTS)
    prompts = load_prompts(path)
    assert prompts[0] == BenchPrompt(1, "writing", "Write a poem about the sea.")
    assert [p.category for p in prompts] == ["writing", "writing", "math"]


def test_limit_is_round_robin_over_categories(tmp_path):
    cats = ["a", "a", "a", "b", "b", "c"]
    path = write_jsonl(tmp_path / "p.jsonl", [{"category": c, "turns": [f"q{i}"]} for i, c in enumerate(cats)])
    assert [p.text for p in load_prompts(path, limit=3)] == ["q0", "q3", "q5"]
    assert [p.text for p in load_prompts(path, limit=5)] == ["q0", "q1", "q3", "q4", "q5"]
    assert load_prompts(path, limit=3)[1].id == 4  # no question_id: the line number
    assert len(load_prompts(path, limit=100)) == 6
    with pytest.raises(ConfigError, match="limit"):
        load_prompts(path, limit=0)


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ('{"category": "a", "turns": ["ok"]}\n{"turns": [\n', r"p\.jsonl:2: not valid JSON"),
    ('{"category": "a", "text": "no turns"}\n', r"p\.jsonl:1: needs \"turns\""),
    ('{"turns": []}\n', r"p\.jsonl:1: needs \"turns\""),
    ('["a list"]\n', "expected a JSON object"),
    ("\n\n", "is empty"),
])
def test_load_prompts_errors(tmp_path, content, message):
    path = tmp_path / "p.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_prompts(path)


def test_bad_methods_and_missing_draft(target):
    prompts = [BenchPrompt(1, "a", "hello")]
    with pytest.raises(ConfigError, match="choose from: " + ", ".join(registry.NAMES)) as e:
        run_bench(target, ["none", "magic"], prompts, progress=False)
    assert "'magic'" in str(e.value)
    with pytest.raises(ConfigError, match="needs a draft model"):
        run_bench(target, "none,draft", prompts, progress=False)
    with pytest.raises(ConfigError, match="no prompts"):
        run_bench(target, ["none"], [], progress=False)


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<?xml")])
def test_plot_writes_png_and_svg(report, tmp_path, suffix, magic):
    path = plot_report(report, tmp_path / f"bench{suffix}")
    data = path.read_bytes()
    assert data.startswith(magic) and len(data) > 5000
    if suffix == ".svg":
        assert b"plain decoding" in data and b"</svg>" in data


def test_plot_refuses_other_formats(report, tmp_path):
    with pytest.raises(ConfigError, match=r"\.png or \.svg.*bench\.jpg"):
        plot_report(report, tmp_path / "bench.jpg")


def test_bench_command_takes_sampling_and_spec_flags(model_dir, prompts_file, tmp_path):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    args = ["bench", "--model", str(model_dir), "--prompts", prompts_file, "--methods", "lookup",
            "--max-tokens", "6", "--limit", "2", "--temperature", "0.8", "--top-k", "20",
            "--top-p", "0.9", "--min-p", "0.01", "--seed", "3", "--num-draft", "16",
            "--max-draft", "20", "--json", str(out_json), "--plot", str(out_png)]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    env = json.loads(out_json.read_text())["env"]
    assert env["max_tokens"] == 6 and env["num_prompts"] == 2
    assert env["sampling"] == {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.01, "seed": 3,
                               "frequency_penalty": 0.0, "presence_penalty": 0.0,
                               "repetition_penalty": 1.0}
    assert out_png.read_bytes().startswith(b"\x89PNG")
    bad = CliRunner().invoke(main, [*args[:7], "--plot", str(tmp_path / "r.gif")])
    assert bad.exit_code == 2 and "r.gif" in bad.output


def test_bench_raw_sends_the_prompt_text_itself(target, prompts_file, monkeypatch):
    """--raw (base models): each prompt goes in as raw text, not wrapped in a chat message."""
    from edgespec import engine as engine_mod

    sent = []
    generate = engine_mod.Engine.generate

    def spy(self, prompt, *a, **kw):
        sent.append(prompt)
        return generate(self, prompt, *a, **kw)

    monkeypatch.setattr(engine_mod.Engine, "generate", spy)
    prompts = load_prompts(prompts_file, limit=1)
    report = run_bench(target, ["lookup"], prompts, generation=GenerationConfig(max_tokens=6),
                       progress=False, raw=True)
    assert report["env"]["prompt_format"] == "raw"
    assert sent and all(p == prompts[0].text for p in sent)
    assert all(r["exact"] for r in report["prompts"])
