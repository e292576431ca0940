"""Heads compared in one bench run: ``METHOD@HEAD`` variants, each its own row drafting with its
own head (random heads on a tiny target: greedy output exactly the baseline's), the 'shipped'
and 'learned' aliases, the report's ``env["heads"]``, the labels tables and plots show, and the
errors (Python: ConfigError; CLI: exit 2, one line)."""

from __future__ import annotations

import io
import json

import mlx.core as mx
import pytest
from click.testing import CliRunner
from rich.console import Console

from edgespec.bench import BenchPrompt, format_report, method_names, report_markdown, run_bench
from edgespec.bench_heads import labels, resolve
from edgespec.bench_plot import plot_report
from edgespec.cli import main
from edgespec.config import GenerationConfig
from edgespec.errors import ConfigError
from edgespec.heads import Eagle3Head, HeadConfig, MedusaHeads, fingerprint, save_head
from edgespec.heads import loaded

PROMPTS = [BenchPrompt(1, "writing", "Write a poem about the sea."),
           BenchPrompt(2, "math", "What is 12 times 7?")]


@pytest.fixture(scope="module")
def model(tiny_models):
    return tiny_models.path(tie=False), tiny_models.load(tie=False)


def _save(path, target, cls, seed):
    mx.random.seed(seed)
    config = HeadConfig.for_target(target, "medusa" if cls is MedusaHeads else "eagle3",
                                   num_heads=3)
    return save_head(path, config, cls(config))


@pytest.fixture(scope="module")
def heads(model, tmp_path_factory):
    """Two different random EAGLE-3 heads (A/eagle3, B/eagle3) and random Medusa heads."""
    _, target = model
    root = tmp_path_factory.mktemp("heads")
    _save(root / "A" / "eagle3", target, Eagle3Head, 1)
    _save(root / "B" / "eagle3", target, Eagle3Head, 2)
    _save(root / "M" / "medusa", target, MedusaHeads, 3)
    return root


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")  # the tiny target's verify cost, measured once


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path, cache):
    """No head found anywhere unless a test says so; nothing learned; a cache of our own."""
    monkeypatch.setenv("EDGESPEC_CACHE", str(cache))
    monkeypatch.setenv("EDGESPEC_LEARN_DIR", str(tmp_path / "learn"))
    monkeypatch.setenv("EDGESPEC_HEADS", str(tmp_path / "no-heads"))
    monkeypatch.setattr("edgespec.heads.find.REPO_MODELS", tmp_path / "no-models")
    monkeypatch.setattr("edgespec.heads.find.WHEEL_MODELS", tmp_path / "no-models")


def test_two_heads_in_one_run_each_drafting_with_its_own(model, heads, monkeypatch):
    _, target = model
    used = []
    load = loaded.load_head_for

    def spy(head, target, kind):
        used.append((kind, str(head)))
        return load(head, target, kind)

    monkeypatch.setattr(loaded, "load_head_for", spy)
    a, b, m = heads / "A" / "eagle3", heads / "B" / "eagle3", heads / "M" / "medusa"
    names = [f"eagle3@{a}", f"eagle3@{b}", f"medusa@{m}", f"auto@{b}"]
    report = run_bench(target, ",".join(names), PROMPTS, generation=GenerationConfig(10),
                       progress=False)
    assert list(report["methods"]) == ["none", *names]
    for name in names:
        assert report["methods"][name]["overall"]["exact_match"] == "2/2", name
    assert report["env"]["heads"] == {names[0]: str(a.resolve()), names[1]: str(b.resolve()),
                                      names[2]: str(m.resolve()), names[3]: str(b.resolve())}
    assert {("eagle3", str(a.resolve())), ("eagle3", str(b.resolve())),
            ("medusa", str(m.resolve()))} <= set(used)
    md = report_markdown(report)
    assert "| eagle3@…/A/eagle3 | **overall**" in md and "| auto@…/eagle3 |" in md
    assert str(a) not in md  # the table shows the telling tail; the JSON keeps the path
    console = Console(file=io.StringIO(), width=200)
    console.print(format_report(report))
    assert "method: medusa@…/medusa" in console.file.getvalue()
    plot_report(report, heads / "bench.svg")
    json.dumps(report)


def _learned(target, root):
    """A learned EAGLE-3 head rolled out for ``target`` under ``$EDGESPEC_LEARN_DIR``."""
    heads = root / fingerprint(target) / "heads"
    path = _save(heads / "eagle3-v0001", target, Eagle3Head, 5)
    (heads / "current.json").write_text(json.dumps({"eagle3": "eagle3-v0001"}))
    return path


def test_shipped_and_learned_on_the_command_line(model, heads, tmp_path, monkeypatch):
    path, target = model
    monkeypatch.setenv("EDGESPEC_HEADS", str(heads / "A"))
    learned = _learned(target, tmp_path / "learn")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"category": "writing", "turns": ["Hello there."]}) + "\n")
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, [
        "bench", "--model", str(path), "--prompts", str(prompts), "--max-tokens", "8",
        "--methods", "eagle3@shipped,eagle3@learned,eagle3,lookup", "--json", str(out)],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert list(report["methods"]) == ["none", "eagle3@shipped", "eagle3@learned", "eagle3",
                                       "lookup"]
    assert all(m["overall"]["exact_match"] == "1/1" for m in report["methods"].values())
    assert report["env"]["heads"] == {"eagle3@shipped": str((heads / "A" / "eagle3").resolve()),
                                      "eagle3@learned": str(learned.resolve()),
                                      "eagle3": str((heads / "A" / "eagle3").resolve())}
    assert "| eagle3@learned | **overall**" in result.output


def test_aliases_resolve_once_and_name_what_is_missing(model, heads, tmp_path, monkeypatch):
    _, target = model
    with pytest.raises(ConfigError, match="no shipped eagle3 head for model"):
        resolve(["eagle3@shipped"], target)
    with pytest.raises(ConfigError, match="no learned eagle3 head is in use.*edgespec learn"):
        resolve(["none", "eagle3@learned"], target)
    with pytest.raises(ConfigError, match="'/nowhere' is not a head directory"):
        resolve(["eagle3@/nowhere"], target)
    monkeypatch.setenv("EDGESPEC_HEADS", str(heads / "B"))
    learned = _learned(target, tmp_path / "learn")
    assert resolve(["eagle3", "eagle3@shipped", "auto@learned", "eagle3@learned"], target) == {
        "eagle3@shipped": (heads / "B" / "eagle3").resolve(), "auto@learned": learned.resolve(),
        "eagle3@learned": learned.resolve()}


@pytest.mark.parametrize("name, message", [
    ("draft@shipped", "'draft' reads no head; METHOD@HEAD takes a method that reads a head: "
                      "eagle3, medusa, corpus, auto"),
    ("none@learned", "'none' reads no head"),
    ("magic@shipped", "'magic' is not a method; METHOD@HEAD takes .*eagle3"),
    ("eagle3@", "'eagle3@' names no head after '@'; give 'shipped' or 'learned' or a head folder"),
    ("eagle3@  ", "names no head"),
])
def test_bad_variants(model, name, message, tmp_path):
    path, target = model
    with pytest.raises(ConfigError, match=message):
        method_names(["lookup", name])
    with pytest.raises(ConfigError, match=message):
        run_bench(target, ["lookup", name], PROMPTS, progress=False)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"turns": ["Hi."]}) + "\n")
    result = CliRunner().invoke(main, ["bench", "--model", str(path), "--prompts", str(prompts),
                                       "--methods", f"lookup,{name}"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and name.strip() in lines[0], result.output


def test_cli_names_a_missing_learned_head_in_one_line(model, tmp_path):
    path, target = model
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"turns": ["Hi."]}) + "\n")
    result = CliRunner().invoke(main, ["bench", "--model", str(path), "--prompts", str(prompts),
                                       "--methods", "eagle3@learned"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "no learned eagle3 head" in lines[0]


def test_labels_cut_folders_to_their_telling_tail():
    names = ["none", "eagle3@shipped", "eagle3@/x/v1/eagle3", "eagle3@/y/v2/eagle3",
             "eagle3@/x/heads/eagle3-v0003", "medusa@/x/v1/eagle3", "corpus@./c", "auto@a/b"]
    assert labels(names) == {
        "none": "none", "eagle3@shipped": "eagle3@shipped",
        "eagle3@/x/v1/eagle3": "eagle3@…/v1/eagle3",
        "eagle3@/y/v2/eagle3": "eagle3@…/v2/eagle3",
        "eagle3@/x/heads/eagle3-v0003": "eagle3@…/eagle3-v0003",
        "medusa@/x/v1/eagle3": "medusa@…/eagle3", "corpus@./c": "corpus@./c",
        "auto@a/b": "auto@…/b"}
    assert labels(["eagle3@/a/h", "eagle3@/a/h/"]) == {"eagle3@/a/h": "eagle3@/a/h",
                                                        "eagle3@/a/h/": "eagle3@/a/h/"}
