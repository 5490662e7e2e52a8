"""Every figure `topas-bench figures` writes is readable at page width: no text overlaps
another or leaves the figure, none is under 8 pt, no figure is wider than the page
(`plotting.layout_problems`); a panel draws at most `MAX_SERIES` series in distinct colours;
the lever chart draws paired margins around zero."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from results_fixture import JCTS, write_fixture, write_one
from topas_bench.analysis.collect import collect
from topas_bench.analysis.figures import write_figures
from topas_bench.analysis.plotting import (
    COLOURS,
    MAX_SERIES,
    OTHERS,
    layout_problems,
    pyplot,
    styles,
)
from topas_bench.analysis.report import Report, build_report
from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import BASELINES, PEERS

#: A crowd: the paper's other baselines and a dozen peers, each slower than TOPAS by its own
#: factor, so leaders and the left-out are known.
CROWD = {s: 1.05 + 0.04 * i for i, s in enumerate([*BASELINES[2:], *PEERS[:12]])}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture (chain3 at loads 0.8 and 0.6; fcfs, lpm, topas, topas-base), a crowd of
    17 schedulers at load 0.8, topas-no-pins, and a second KV budget at both loads (a grid)."""
    root = write_fixture(tmp_path_factory.mktemp("tree"))
    for name, factor in CROWD.items():
        for seed, jcts in enumerate(JCTS["topas"]):
            write_one(root, name, seed, [factor * j for j in jcts])
    for seed, jcts in enumerate(JCTS["topas"]):
        write_one(root, "topas-no-pins", seed, [1.1 * j + seed for j in jcts])
    for at in (0.8, 0.6):
        for name in ("fcfs", "lpm", "topas", "topas-no-pins"):
            for seed, jcts in enumerate(JCTS["topas" if name == "topas-no-pins" else name]):
                write_one(root, name, seed, [0.9 * j for j in jcts], load=at, kv=28_000)
    return root


@pytest.fixture(scope="module")
def drawn(tree: Path) -> tuple[Path, list[Path], Report]:
    """Every figure of `tree`, drawn in strict mode (which raises on a layout problem)."""
    coll = collect(tree)
    rep = build_report(coll)
    return tree / "figures", write_figures(coll, rep, tree / "figures", strict=True), rep


def test_every_figure_fits_the_page(drawn: tuple[Path, list[Path], Report]) -> None:
    _, files, _ = drawn
    stems = {f.stem for f in files if f.suffix == ".png"}
    assert {"jct_relative", "jct_relative_all", "jct_vs_load", "ablation", "requests",
            "jct_cdf_chain3", "regime_chain3", "regime_margin_chain3",
            "stage_latency_chain3", "timeline_chain3"} <= stems  # fmt: skip
    from PIL import Image

    for f in files:
        if f.suffix == ".png":
            with Image.open(f) as im:
                assert im.width <= 1_600, f.name


def test_a_crowd_is_cut_to_the_leaders(drawn: tuple[Path, list[Path], Report]) -> None:
    text = svg(drawn[0], "jct_relative_all")
    slowest = max(CROWD, key=CROWD.__getitem__)
    assert "not drawn" in text and slowest in text.split("not drawn")[1]
    drawn = text.split("not drawn")[0]
    assert "topas" in drawn and slowest not in drawn


def test_panel_colours_are_distinct_and_topas_keeps_its_own() -> None:
    names = ["topas", *CROWD]
    palette = {n: OTHERS[0] for n in names} | {"topas": COLOURS["topas"]}  # all clash
    st = styles(names[:MAX_SERIES], palette)
    colours = [s["color"] for s in st.values()]
    assert len(set(colours)) == len(colours) and st["topas"]["color"] == COLOURS["topas"]
    lab = np.array([_lab(c) for c in (*COLOURS.values(), *OTHERS)])
    gaps = np.linalg.norm(lab[:, None] - lab[None, :], axis=-1)
    assert gaps[np.triu_indices(len(lab), 1)].min() > 20  # CIE76: clearly different colours


def test_layout_problems_catches_overlap_clipping_width_and_small_text() -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(12, 3))
    ax.set_xticks(range(40), [f"scheduler-{i}" for i in range(40)])
    ax.set_title("a title", fontsize=6)
    ax.text(1.5, 0.5, "clipped", transform=ax.transAxes)
    found = " | ".join(layout_problems(fig))
    plt.close(fig)
    assert "12.0 in wide" in found and "overlaps" in found
    assert "'clipped' outside the figure" in found and "'a title' at 6 pt" in found
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([0, 1], [0, 1], label="one")
    ax.legend()
    ax.set_title("fine")
    assert layout_problems(fig) == []
    plt.close(fig)


def test_strict_mode_names_the_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import topas_bench.analysis.figures as figures

    monkeypatch.setattr(figures, "layout_problems", lambda fig: ["text 'x' overlaps 'y'"])
    root = tmp_path / "tree"
    for seed, jcts in enumerate(JCTS["topas"]):  # the smallest tree: two runs, one figure
        write_one(root, "topas", seed, [float(j) for j in jcts])
    coll = collect(root)
    with pytest.raises(TopasError, match=r"^figures unreadable .*jct_relative: text 'x' overl"):
        write_figures(coll, build_report(coll), tmp_path / "out", strict=True)


def test_lever_chart_draws_paired_margins(drawn: tuple[Path, list[Path], Report]) -> None:
    out, _, rep = drawn
    text = svg(out, "ablation")
    lever = rep.levers[
        (rep.levers["other_name"] == "topas-base") & (rep.levers["metric"] == "mean")
    ]
    assert "no-pins" in text and "base" in text and "lever helps" in text
    # topas 20 s vs topas-base 24 s mean on both seeds: the lever saves 1 - 20/24 = 16.7%
    assert lever["margin"].round(4).tolist()[0] == pytest.approx(0.1667, abs=1e-4)
    assert "+16.7%" in text


def svg(out: Path, name: str) -> str:
    found = re.findall(r"<text[^>]*>([^<]*)</text>", (out / f"{name}.svg").read_text())
    return " ".join(" ".join(found).split())


def _lab(colour: str) -> tuple[float, float, float]:
    """CIELAB (D65) of an sRGB colour."""
    from matplotlib.colors import to_rgb

    rgb = np.array(to_rgb(colour))
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = m @ lin / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return (116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2]))


def test_the_nightly_trend_fits_the_page(
    drawn: tuple[Path, list[Path], Report], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import topas_bench.analysis.plotting as plotting
    from topas_bench.analysis.history import append, load, plot

    found: list[str] = []
    real = plotting.save

    def checked(plt, fig, *args, **kwargs):  # type: ignore[no-untyped-def]
        found.extend(layout_problems(fig))
        return real(plt, fig, *args, **kwargs)

    monkeypatch.setattr(plotting, "save", checked)
    for night in ("2026-12-01", "2026-12-02"):  # chain3 has four settings: two rows of two
        append(drawn[2], tmp_path / "series", night, "a1")
    assert [f.name for f in plot(load(tmp_path / "series"), tmp_path, ("png",))] == ["chain3.png"]
    assert found == []
