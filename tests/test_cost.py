"""The cost model against docs/design.md section 4's sanity anchors, and preset loading."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from topas_bench.errors import TopasError, UnknownNameError
from topas_bench.runners.sim.cost import (
    CostModel,
    Efficiency,
    is_preset_path,
    load_preset,
    load_preset_file,
    preset_names,
)

PACKAGED = ["a100-qwen32b", "h100-llama8b", "h200-llama8b", "h200-qwen32b"]

#: SGLang's CI decode anchor runs `bench_one_batch --batch-size 1 --input 128 --output 8`
#: (python/sglang/test/test_utils.py), so a decode step sees ~132 tokens of context.
CI_CONTEXT_TOKENS = 132


def cost(name: str) -> CostModel:
    return CostModel(load_preset(name))


@pytest.mark.parametrize(
    ("preset", "target_ms"),
    [("h100-llama8b", 7.4), ("h200-llama8b", 5.5)],
)
def test_batch1_decode_matches_design_anchor(preset: str, target_ms: float) -> None:
    step_ms = cost(preset).decode_step_s(1, CI_CONTEXT_TOKENS) * 1e3
    assert step_ms == pytest.approx(target_ms, rel=0.15)


def test_h100_decode_clears_sglang_ci_floor() -> None:
    # test/srt/test_bench_one_batch.py: assertGreater(output_throughput, 135)
    tokens_per_s = 1.0 / cost("h100-llama8b").decode_step_s(1, CI_CONTEXT_TOKENS)
    assert tokens_per_s > 135


def test_h100_prefill_2048_matches_design_anchor() -> None:
    assert cost("h100-llama8b").prefill_token_s(2048) * 1e3 == pytest.approx(56.0, rel=0.15)


@pytest.mark.parametrize(
    ("preset", "kib"), [("a100-qwen32b", 256), ("h100-llama8b", 128), ("h200-llama8b", 128)]
)
def test_kv_bytes_per_token(preset: str, kib: int) -> None:
    assert load_preset(preset).kv_bytes_per_token == kib * 1024


def test_a100_derived_budget_is_about_20k_tokens() -> None:
    assert 15_000 <= load_preset("a100-qwen32b").derived_kv_budget_tokens <= 25_000


def test_decode_steps_vectorised_matches_scalar() -> None:
    model = cost("a100-qwen32b")
    steps = model.decode_steps_s(8, 10_000, 500)
    assert steps.shape == (500,)
    assert steps[0] == model.decode_step_s(8, 10_000)
    assert steps[123] == pytest.approx(model.decode_step_s(8, 10_000 + 8 * 123), rel=1e-12)
    assert np.all(np.diff(steps) >= 0)
    assert steps[-1] > steps[0]  # the KV read grows with the context


def test_decode_step_is_a_one_token_prefill() -> None:
    model = cost("h100-llama8b")
    contexts = [100, 2_000, 37]
    as_prefill = model.prefill_s([(c - 1, 1) for c in contexts])
    assert model.decode_step_s(3, sum(contexts)) == pytest.approx(as_prefill, rel=1e-12)


def test_cached_prefill_is_cheaper_than_uncached() -> None:
    model = cost("a100-qwen32b")
    cached = model.prefill_s([(4_000, 500)])
    uncached = model.prefill_s([(0, 4_500)])
    assert cached < uncached / 4
    assert model.prefill_s([(0, 500)]) < cached  # attending to the cache is not free


def test_prefill_rejects_empty_batch() -> None:
    with pytest.raises(ValueError, match="at least one"):
        cost("h100-llama8b").prefill_s([])


def test_host_load_uses_link_bandwidth() -> None:
    preset = load_preset("a100-qwen32b")
    expected = 10_000 * 262_144 / 25e9
    assert CostModel(preset).host_load_s(10_000) == pytest.approx(expected, rel=1e-12)


def test_efficiency_is_overridable() -> None:
    preset = load_preset("h100-llama8b")
    faster = dataclasses.replace(
        preset, efficiency=dataclasses.replace(preset.efficiency, eta_c=0.8, c_step_us=0.0)
    )
    assert CostModel(faster).prefill_token_s(2048) < CostModel(preset).prefill_token_s(2048)
    with pytest.raises(TopasError, match=r"efficiency\.eta_w must be in \(0, 1\]"):
        Efficiency(eta_w=1.5)


def test_preset_names_lists_packaged_files() -> None:
    assert preset_names() == PACKAGED


@pytest.mark.parametrize("name", PACKAGED)
def test_every_packaged_preset_loads(name: str) -> None:
    preset = load_preset(name)
    assert preset.name == name
    assert preset.derived_kv_budget_tokens > 0
    model = CostModel(preset)
    assert 0 < model.decode_step_s(1, 1) < model.prefill_token_s(4096)


def test_unknown_preset_lists_known_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_preset("x")
    assert str(info.value) == (
        "unknown preset 'x'; known: a100-qwen32b, h100-llama8b, h200-llama8b, h200-qwen32b "
        "(or a path to a preset .toml file)"
    )


def _packaged_text() -> str:
    path = Path(__file__).parents[1] / "src/topas_bench/runners/sim/presets/h100-llama8b.toml"
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("n_layers = 32", ""), "missing key 'model.n_layers'"),
        (("n_layers = 32", 'n_layers = "32"'), "key 'model.n_layers' must be int"),
        (("eta_c = 0.55", "eta_c = 0.55\neta_x = 1.0"), "unknown key(s) at [efficiency]: eta_x"),
        (("hbm_tbps = 3.35", "hbm_tbps = -3.35"), "gpu.hbm_tbps must be > 0"),
        (("[model]", "[modle]"), "unknown key(s) at top level: modle"),
        (('name = "h100-llama8b"', "name = "), "invalid TOML"),
    ],
)
def test_malformed_preset_file_names_file_and_key(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    text = _packaged_text()
    assert edit[0] in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(edit[0], edit[1], 1), encoding="utf-8")
    with pytest.raises(TopasError) as info:
        load_preset_file(path)
    assert str(path) in str(info.value)
    assert message in str(info.value)


def test_user_preset_file_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(_packaged_text(), encoding="utf-8")
    assert load_preset_file(path) == load_preset("h100-llama8b")


def test_missing_preset_file_is_a_topas_error(tmp_path: Path) -> None:
    with pytest.raises(TopasError, match="cannot read preset file"):
        load_preset_file(tmp_path / "absent.toml")


def test_load_preset_reads_a_path_and_names_it_by_content(tmp_path: Path) -> None:
    text = _packaged_text()
    one, two = tmp_path / "one.toml", tmp_path / "sub" / "h100"
    two.parent.mkdir()
    one.write_text(text, encoding="utf-8")
    two.write_text("# a comment changes nothing\n" + text, encoding="utf-8")  # no .toml: a "/"
    a, b = load_preset(str(one)), load_preset(str(two))
    assert a.name == b.name and re.fullmatch(r"h100-llama8b@[0-9a-f]{8}", a.name)
    assert a.source is not None and Path(a.source).is_absolute() and Path(a.source).samefile(one)
    assert load_preset(a.source).name == a.name
    assert dataclasses.replace(a, name="h100-llama8b") == load_preset("h100-llama8b")
    # the same name with other values: another identity
    two.write_text(text.replace("eta_kv = 0.55", "eta_kv = 0.6"), encoding="utf-8")
    assert load_preset(str(two)).name != a.name
    assert is_preset_path("cal.toml") and is_preset_path("./cal") and not is_preset_path("cal")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read preset file"),
        ("name = ", "invalid TOML"),
        ('name = "a b"', "must be letters, digits"),
    ],
)
def test_bad_preset_path_is_one_line_naming_the_file(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "cal.toml"
    if content is not None:
        text = _packaged_text()
        path.write_text(text.replace('name = "h100-llama8b"', content, 1), encoding="utf-8")
    with pytest.raises(TopasError) as info:
        load_preset(str(path))
    assert str(path) in str(info.value) and message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", PACKAGED)
def test_fast_decode_path_is_bit_identical_to_single_steps(name: str) -> None:
    """`decode_steps_s` (the simulator's closed-form decode runs) equals `decode_step_s` step
    for step, bit for bit, on every preset: the original roofline and the calibrated form."""
    model = cost(name)
    for batch, context, steps in ((1, 1, 300), (8, 10_000, 500), (256, 256 * 513, 64)):
        fast = model.decode_steps_s(batch, context, steps)
        slow = [model.decode_step_s(batch, context + batch * i) for i in range(steps)]
        assert fast.tolist() == slow


def test_original_model_is_unchanged() -> None:
    """a100-qwen32b's iteration times as the model computed them before issue 31's terms (they
    default to 0, the original form), to the last bit."""
    model = cost("a100-qwen32b")
    assert model.prefill_s([(0, 2048)]) == 0.7336732186256409
    assert model.prefill_s([(4000, 500), (0, 100)]) == 0.2271025415384615
    assert model.decode_step_s(8, 10_000) == 0.04916684235786011
    assert model.decode_step_s(1, 132) == 0.04682935281129094


def test_calibrated_form_charges_attention_apart_and_rounds_the_ridge() -> None:
    preset = load_preset("h200-llama8b")
    e = preset.efficiency
    assert e.eta_attn > 0 and e.ridge_frac > 0
    sharp = CostModel(dataclasses.replace(preset, efficiency=dataclasses.replace(e, ridge_frac=0)))
    none = CostModel(dataclasses.replace(preset, efficiency=dataclasses.replace(e, ridge_frac=1)))
    smooth = CostModel(preset)
    for batch in (1, 64, 256):  # the GEMMs' ridge is near 200 requests on an H200
        ctx = batch * 513
        assert sharp.decode_step_s(batch, ctx) < smooth.decode_step_s(batch, ctx)
        assert smooth.decode_step_s(batch, ctx) < none.decode_step_s(batch, ctx)
    # a long cached prefix costs its attention at eta_attn, below eta_c
    assert smooth.prefill_s([(32768, 512)]) > sharp.prefill_s([(0, 512)]) * 2
