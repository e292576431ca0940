"""``edgespec doctor`` on a tiny model: every finding is there and the bandwidth line's numbers
agree with each other; the streamed weights leave out only an untied embedding table."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlx.utils import tree_flatten

from edgespec import doctor


def test_streamed_bytes_counts_a_tied_table_once_and_skips_an_untied_one(tiny_models):
    tied, untied = tiny_models.load(), tiny_models.load(tie=False)
    for target in (tied, untied):
        params = dict(tree_flatten(target.model.parameters()))
        table = params["model.embed_tokens.weight"].nbytes
        total = sum(v.nbytes for v in params.values())
        expected = total - table if target is untied else total
        assert doctor.streamed_bytes(target) == expected


def test_doctor_reports_the_bandwidth_limit(tiny_models, monkeypatch):
    monkeypatch.setattr(doctor, "stream_bandwidth", lambda: 8.0e9)  # the measure itself: below
    f = doctor.run_doctor(str(tiny_models.path()))
    assert f["bandwidth_gb_s"] == 8.0
    weight_bytes = doctor.streamed_bytes(tiny_models.load())
    assert f["bandwidth_limit_tok_s"] == round(8.0e9 / weight_bytes, 2)
    assert f["plain_decode_tok_s"] > 0 and set(f["forward_ms"]) == {1, 2, 4, 8, 16}
    text = doctor.format_findings(f)
    assert "8.0 GB/s read (all cores)" in text
    share = round(100 * f["plain_decode_tok_s"] / f["bandwidth_limit_tok_s"])
    assert f"plain decoding reaches {share}% of it" in text
    rounds = f["bandwidth_share_rounds"]
    assert len(rounds) == doctor._DECODE_ROUNDS  # each round: its tokens/s over the limit
    assert min(rounds) <= f["plain_decode_tok_s"] / f["bandwidth_limit_tok_s"] + 1e-3
    assert max(rounds) >= f["plain_decode_tok_s"] / f["bandwidth_limit_tok_s"] - 1e-3
    assert f"each round {100 * min(rounds):.0f}-{100 * max(rounds):.0f}%" in text
    assert "kernels" in text and "BLAS" in text
    ms = f["forward_ms"]  # issue 12's two targets, each on the line it is read from
    assert f"8-token / 1-token = {f['forward_ratio_8_vs_1']:.2f}x" in text
    assert f"16-token / 1-token = {ms[16] / ms[1]:.2f}x" in text
    if f["huge_page_mb"] is None:  # not Linux's CPU backend, or the policy is 'never'
        assert "huge pages" not in text
    else:  # a tiny model's blocks are too small to pack; its head may not fill a page either
        mb = f"{f['huge_page_mb']:.0f} of the {f['streamed_weights_mb']:.0f} MB"
        assert f"{mb} on huge pages" in text
    if f["fma_g_per_s"]:  # the native module is built (CI builds it)
        assert "G multiply-adds/s (FMA loop, all cores)" in text
        assert f["fma_one_thread_g_per_s"] > 0 and f["fma_threads_ratio"] > 0
        assert f"one thread alone {f['fma_one_thread_g_per_s']:.0f} G" in text
        shared = f["kernel_threads"] > 1 and f["fma_threads_ratio"] < 0.75 * f["kernel_threads"]
        assert ("share FMA units now" in text) == shared
        # two threads at 1.0x one alone: shared cores, said; at 1.9x: separate ones, nothing said
        assert "share FMA units now" in doctor.format_findings(
            dict(f, kernel_threads=2, fma_threads_ratio=1.0))
        assert "share FMA units now" not in doctor.format_findings(
            dict(f, kernel_threads=2, fma_threads_ratio=1.9))


def test_multiply_adds_per_token_counts_weights_not_bytes(tiny_models, tmp_path):
    from edgespec.targets import load_target

    from .test_qmatmul import _quantized_copy

    plain = tiny_models.load()
    q = load_target(_quantized_copy(tiny_models.path(), tmp_path / "q"), dtype="auto")
    n = doctor.multiply_adds_per_token(plain)
    assert n == doctor.streamed_bytes(plain) // 4 - sum(
        v.size for k, v in tree_flatten(plain.model.parameters()) if v.ndim == 1)
    assert doctor.multiply_adds_per_token(q) == n  # 4-bit: as many weights, fewer bytes


FINDINGS = {  # what run_doctor returns, made up
    "blas": {"name": "openblas", "status": "active", "path": "x", "provider": "p",
             "loaded_at_import": "openblas"},
    "forward_ms": {1: 10.0, 2: 10.0, 4: 11.0, 8: 12.0, 16: 16.0}, "forward_ratio_8_vs_1": 1.2,
    "edgespec": "0", "mlx": "0", "python": "3", "platform": "Linux x", "device": "cpu",
    "gpu_available": False, "native_kernels": "active", "metal_kernels": "off", "model": "m",
    "dtype": "native", "layers": 2, "quantized": True, "other_curve": None,
    "plain_decode_tok_s": 100.0, "bandwidth_gb_s": 30.0, "streamed_weights_mb": 100.0,
    "bandwidth_limit_tok_s": 250.0, "huge_page_mb": None, "bandwidth_share_rounds": [0.4],
    "fma_g_per_s": 100.0, "fma_one_thread_g_per_s": 50.0, "fma_threads_ratio": 2.0,
    "kernel_threads": 2, "int8_g_per_s": None, "multiply_adds_per_token_m": 100.0,
    "expert_read_share": None, "kernel_floor_ms": None}


def test_the_compute_floor_of_int8_products_is_the_vpdpbusd_loop():
    """A quantized model whose products take int8 x gets its floor from the int8 loop's rate
    (a float model, or a CPU without the VNNI form, from the FMA loop's)."""
    floats = doctor.format_findings(FINDINGS)
    ints = doctor.format_findings(dict(FINDINGS, int8_g_per_s=400.0))
    assert "100 G multiply-adds/s (FMA loop, all cores)" in floats and "8 tokens >= 8.0 ms" in floats
    assert "400 G multiply-adds/s (int8 vpdpbusd loop" in ints and "8 tokens >= 2.0 ms" in ints
    assert "one thread alone 50 G" in ints  # the FMA loop's threads line stays


def test_the_kernels_own_floor_is_reported_against_the_bandwidth_floor():
    """The kernels timed on cached weights: each row count's floor, and 8/1 and 16/1 against
    one token's bandwidth floor (1000 / 250 tok/s = 4 ms here); nothing without it."""
    text = doctor.format_findings(dict(FINDINGS, kernel_floor_ms={1: 2.0, 8: 6.0, 16: 12.0}))
    assert "products of 1 token >= 2.0 ms, 8 tokens >= 6.0 ms, 16 tokens >= 12.0 ms" in text
    assert "8/1 >= 1.50x, 16/1 >= 3.00x against 1 token's bandwidth floor" in text
    assert "the kernels themselves" not in doctor.format_findings(FINDINGS)


def test_the_kernels_floor_times_the_models_own_products(tiny_models, tmp_path):
    """A float and a kept-quantized tiny model: a positive floor for each row count, where
    the blocks run natively (None where they do not)."""
    from .test_qmatmul import _quantized_copy

    for target in (tiny_models.load(), doctor.load(str(_quantized_copy(tiny_models.path(),
                                                                       tmp_path / "q")),
                                                   dtype="auto", progress=False)):
        floor = doctor.kernel_floor(target, doctor.multiply_adds_per_token(target), rounds=1)
        if not target.model.native_blocks():
            assert floor is None
            continue
        assert set(floor) == set(doctor._KERNEL_ROWS) and all(ms > 0 for ms in floor.values())


def test_the_vpdpbusd_loop_rate_is_plausible_or_absent():
    from edgespec.kernels import native

    mod = native.load()
    if mod is None:
        pytest.skip("no native module")
    rate = mod.q8_peak(1)
    assert rate == 0.0 if not mod.q8_vnni() else 1e9 < rate < 1e14
    assert doctor.int8_rate(type("T", (), {"quantized": False})()) is None  # a float model


def test_fma_rates_are_plausible_speeds():
    rates = doctor.fma_rates()
    if rates is not None:
        both, one, ratio, threads = rates
        assert 1e8 < one < 1e13 and 1e8 < both < 1e13
        assert 0.3 < ratio < 2 * threads


def test_decoding_and_the_read_take_turns(monkeypatch):
    calls = []
    monkeypatch.setattr(doctor, "stream_bandwidth", lambda: calls.append("read") or 8.0e9)

    class Engine:
        def generate(self, messages, max_tokens):
            calls.append(max_tokens)
            return SimpleNamespace(stats=SimpleNamespace(tokens_per_s=10.0 + len(calls)))

    decode, reads = doctor.decode_and_bandwidth(Engine(), rounds=3)
    assert calls == [8, 64, "read", 64, "read", 64, "read"]  # a warm-up, then turns
    assert decode == [12.0, 14.0, 16.0] and reads == [8.0e9] * 3
    with pytest.raises(ValueError, match="rounds must be at least 1, got 0"):
        doctor.decode_and_bandwidth(Engine(), rounds=0)


def test_stream_bandwidth_is_a_plausible_memory_speed():
    gb_s = doctor.stream_bandwidth(mib=64, repeats=3) / 1e9
    assert 0.2 < gb_s < 2000  # any real machine; a unit slip (bits, MiB) would land outside


def test_a_curve_is_called_friendly_only_when_eight_rows_cost_little_more_than_one():
    assert doctor.curve_verdict(1.19) == "speculation-friendly"
    assert doctor.curve_verdict(doctor.FRIENDLY_RATIO) == "speculation-friendly"
    assert doctor.curve_verdict(1.89) != "speculation-friendly"  # a 4-bit curve's ratio
    assert "expensive" in doctor.curve_verdict(4.09)


def test_doctor_reports_the_quantized_curve_beside_the_float_one(tiny_models, tmp_path, monkeypatch):
    from .test_qmatmul import _quantized_copy

    monkeypatch.setattr(doctor, "stream_bandwidth", lambda: 8.0e9)
    path = _quantized_copy(tiny_models.path(), tmp_path / "q")
    for dtype, other_quantized in (("float32", True), ("auto", False)):
        f = doctor.run_doctor(str(path), dtype)
        assert f["quantized"] is not other_quantized
        other = f["other_curve"]
        assert other["quantized"] is other_quantized and set(other["forward_ms"]) == {1, 2, 4, 8, 16}
        text = doctor.format_findings(f)
        ratio = other["forward_ms"][8] / other["forward_ms"][1]
        assert f"8-token / 1-token = {ratio:.2f}x" in text
        assert ("--dtype auto" in text) is other_quantized
    assert doctor.run_doctor(str(tiny_models.path()))["other_curve"] is None  # one form only


def test_the_timed_forwards_score_ids_the_model_has(tiny_models, monkeypatch):
    """A tiny model's vocabulary is smaller than the ids a real one is timed with; MLX's
    embedding gather does not check its indices (an id past the table read past its buffer)."""
    target = tiny_models.load()
    seen: list[int] = []
    real = type(target).score

    def score(self, tokens, cache, **kw):
        seen.extend(tokens if isinstance(tokens, list) else tokens.tokens)
        return real(self, tokens, cache, **kw)

    monkeypatch.setattr(type(target), "score", score)
    doctor.forward_times(target, (1, 4), context=200, rounds=1)
    assert target.args.vocab_size < 1010 and seen
    assert 0 <= min(seen) and max(seen) < target.args.vocab_size


def test_widened_weights_are_named_on_the_model_line():
    text = doctor.format_findings(dict(FINDINGS, widened=[{"bits": 5, "to": 8, "layers": 81}]))
    assert "81 layers of 5-bit weights re-packed as 8-bit for the native products" in text
    assert "re-packed" not in doctor.format_findings(FINDINGS)


def test_rounded_q6_k_layers_are_named_on_the_model_line():
    text = doctor.format_findings(dict(FINDINGS, rounded={"Q6_K": 9}))
    assert "9 Q6_K layers rounded to 8 bits, groups of 32" in text
    assert "rounded to 8 bits" not in doctor.format_findings(FINDINGS)


def test_the_blocks_that_run_natively_are_counted_on_the_model_line():
    whole = doctor.format_findings(dict(FINDINGS, native_blocks=FINDINGS["layers"]))
    assert f"({FINDINGS['layers']} as the native block)" in whole
    part = doctor.format_findings(dict(FINDINGS, native_blocks=0))
    assert "(0 as the native block; the others take the module path" in part
    assert "as the native block" not in doctor.format_findings(FINDINGS)
