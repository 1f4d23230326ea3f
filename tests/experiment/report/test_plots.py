"""What every report figure shares (experiment/report/plots.py, ticks.py): exact, distinct tick labels,
at least four per axis; a style per series (colour and marker per series, line style per run);
nothing cut off in the saved images; a file per run even where two runs share a folder name."""
import json

import pytest

from experiment.report import passkey, perplexity, plots, write_report
from tests.experiment.report.readable import check_axis, check_figure, check_png, tick_labels
from tests.experiment.report.synthetic import fake_run, full_run, passkey_records

# (what, y values of a curve at L_valid = 64 ... 1024)
RANGES = [("ALiBi's flat curve", [12.52, 12.44, 12.37, 12.31, 12.29]),
          ("flatter", [17.43, 17.41, 17.38, 17.40, 17.42]),
          ("flat, large", [906.2, 905.8, 906.5, 906.1, 905.9]),
          ("a third of a decade", [8.75, 9.4, 10.2, 11.0, 11.74]),
          ("rising", [7.8, 9.0, 11.0, 15.0, 20.0]),
          ("three decades", [5.0, 40.0, 300.0, 2000.0, 5000.0])]


def test_log_axes_get_at_least_four_exact_distinct_labels_whatever_the_range():
    fig, axes = plots.panels([what for what, _ in RANGES])
    for what, ys in RANGES:
        axes[what].plot([64, 128, 256, 512, 1024], ys, marker="o")
        plots.format_length_axis(axes[what])
        plots.format_ppl_axis(axes[what])
    short, _ = plots.panels(["two lengths"], height=3)
    short.axes[0].plot([64, 128], [5.0, 5.5])
    plots.format_length_axis(short.axes[0])
    plots.format_ppl_axis(short.axes[0])
    check_figure(fig, "log axes")
    check_figure(short, "two lengths")
    texts = lambda ax, axis: [text for _, text, _ in tick_labels(getattr(ax, axis))]
    assert texts(axes["ALiBi's flat curve"], "yaxis") == ["12.30", "12.35", "12.40", "12.45", "12.50"]
    assert texts(axes["ALiBi's flat curve"], "xaxis") == ["64", "128", "256", "512", "1024"]
    assert texts(short.axes[0], "xaxis") == ["64", "80", "96", "112", "128"]
    assert {"10", "100", "1000"} <= set(texts(axes["three decades"], "yaxis"))


def _styles(ax) -> dict[str, tuple]:
    """{legend label: (colour, marker, line style)} of the curves in a panel."""
    return {line.get_label(): (line.get_color(), line.get_marker(), line.get_linestyle())
            for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_every_series_has_its_own_colour_and_marker_and_every_run_its_line_style(tmp_path):
    """The context-extension workflow of docs/usage.md: a base run evaluated plain, with pi_factor and with
    yarn_scale set at evaluation, beside two fine-tuned runs."""
    base = fake_run(tmp_path, "rope", 64, "/data/mycorpus", {64: 4.4, 256: 7.8, 1024: 20.9}, tokenizer="byte",
                    name="base")
    records = json.loads((base / "eval" / "extrapolation.json").read_text())
    for option, value, ppl in (("posenc.rope.pi_factor", 0.25, 25.7), ("posenc.rope.yarn_scale", 4, 4.9)):
        records += [{**r, "overrides": {option: value}, "ppl": ppl} for r in records[:3]]
    (base / "eval" / "extrapolation.json").write_text(json.dumps(records))
    tuned = [fake_run(tmp_path, "rope", 256, "/data/mycorpus", {64: 4.6, 256: 4.4, 1024: 5.6}, tokenizer="byte",
                      name=name) for name in ("pi", "yarn")]
    runs = perplexity.load_runs([base, *tuned])
    (ax,) = perplexity.perplexity_figure(runs).axes
    styles = _styles(ax)
    assert len(styles) == 5 and len({(c, m) for c, m, _ in styles.values()}) == 5
    base_styles = {ls for label, (_, _, ls) in styles.items() if label.startswith("rope (L=64)")}
    run_styles = [{ls for label, (_, _, ls) in styles.items() if label.startswith(f"rope (L=256) [{name}]")}
                  for name in ("pi", "yarn")]
    assert len(base_styles) == 1 and all(len(s) == 1 for s in run_styles)
    assert len(base_styles | run_styles[0] | run_styles[1]) == 3

    records = passkey_records(lengths=(64, 128)) + [{**r, "digits": 2} for r in passkey_records(lengths=(64, 128))]
    fig = passkey.passkey_figure([("alibi", records), ("rope", passkey_records(lengths=(64, 128)))])
    styles = {label: style for label, style in _styles(fig.axes[0]).items() if not label.startswith("chance")}
    assert len(styles) == len({(c, m) for c, m, _ in styles.values()}) == 3
    assert styles["alibi, 4 digits"][2] == styles["alibi, 2 digits"][2] != styles["rope"][2]


def test_passkey_records_of_two_checkpoints_are_two_series():
    records = passkey_records(step=4, lengths=(64,)) + passkey_records(step=2, lengths=(128,))
    table = passkey.passkey_table([("alibi", records)])
    assert "| length | alibi, step 4 | alibi, step 2 |" in table
    assert "| 64 | 0.84 |  |" in table and "| 128 |  | 0.74 |" in table


def test_saved_images_hold_everything_and_every_run_its_own_files(tmp_path, monkeypatch):
    """Two sweeps compared (runs/A/alibi_L64 and runs/B/alibi_L64) and runs with long names: a
    heat map and an attention figure per run, labels that tell them apart, and every saved figure
    readable (check_figure) and whole (check_png: nothing cut at the edges)."""
    saved = []
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: saved.append((fig, save(fig, path))) or saved[-1][1])
    long_name = "rope_L256_original_length_64_pi_factor_0.25_from_base_at_step_600_steps_{}"
    workdirs = [full_run(tmp_path, f"{sweep}/alibi_L64") for sweep in ("A", "B")]
    workdirs += [full_run(tmp_path, long_name.format(n), ppl={64: 4.5 + n / 10, 128: 4.6, 256: 4.7, 512: 4.8},
                          attention=False) for n in (25, 100)]
    paths = write_report(workdirs, tmp_path / "report")

    assert [p.split("/")[-1] for p in paths["passkey"]["heatmaps"]] == [
        "passkey_heatmap_A_alibi_L64.png", "passkey_heatmap_B_alibi_L64.png",
        f"passkey_heatmap_{long_name.format(25)}.png", f"passkey_heatmap_{long_name.format(100)}.png"]
    assert [p.split("/")[-1] for p in paths["attention_pngs"]] == ["attention_A_alibi_L64.png",
                                                                  "attention_B_alibi_L64.png"]
    text = (tmp_path / "report" / "ppl_vs_length.md").read_text()
    assert "alibi (L=64) [A/alibi_L64] (byte ppl" in text and "alibi (L=64) [B/alibi_L64] (byte ppl" in text
    assert "| length | alibi (L=64) [A/alibi_L64] | alibi (L=64) [B/alibi_L64] |" \
        in (tmp_path / "report" / "passkey.md").read_text()

    assert len(saved) == 2 + 1 + 4 + 2  # perplexity, positions; passkey; heat maps; attention
    for fig, path in saved:
        check_figure(fig, path.name)
        check_png(tmp_path / "report" / path.name)  # written aside, then swapped in whole
    with pytest.raises(ValueError, match="same run directory"):
        write_report([workdirs[0], workdirs[0].parent / "." / "alibi_L64"], tmp_path / "again")


def test_runs_named_in_any_script_are_told_apart_by_drawn_labels_and_file_names(tmp_path, monkeypatch):
    """Labels render in any script: without a font for CJK (this machine: matplotlib's own fonts),
    two runs whose folder names differ only in Chinese characters had labels that differed only in
    empty boxes; their labels now differ in characters the font draws, their files by name."""
    monkeypatch.setattr(plots, "cjk_fallback", lambda: None)
    saved = []
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: saved.append((fig, save(fig, path))) or saved[-1][1])
    workdirs = [full_run(tmp_path, name, attention=False) for name in ("实验一", "实验二")]
    paths = write_report(workdirs, tmp_path / "report")
    assert [p.split("/")[-1] for p in paths["passkey"]["heatmaps"]] == ["passkey_heatmap_实验一.png",
                                                                        "passkey_heatmap_实验二.png"]
    drawn = plots._drawn_characters(tuple(plots.font_families()))
    legend = [t.get_text() for t in saved[0][0].axes[0].get_legend().get_texts()]
    assert len(set(legend)) == 2 and all(ord(c) in drawn or c.isspace() for text in legend for c in text), legend
    assert legend[0].endswith("[\\u5b9e\\u9a8c\\u4e00]")  # the name's characters, by their codes
    assert "alibi (L=64) [实验一]" in (tmp_path / "report" / "ppl_vs_length.md").read_text()  # text files keep them


def test_a_font_with_cjk_glyphs_is_the_fallback_where_one_is_installed(monkeypatch):
    monkeypatch.setattr(plots, "cjk_fallback", lambda: "Noto Sans CJK JP")
    monkeypatch.setattr(plots, "_drawn_characters", lambda families: frozenset(map(ord, "alibi 实验一")))
    assert plots.font_families() == ["sans-serif", "Noto Sans CJK JP"]
    assert plots.drawable("alibi 实验一") == "alibi 实验一" and plots.drawable("é") == "\\u00e9"


def test_check_png_finds_a_legend_cut_at_the_edge(tmp_path):
    """The check itself: the legend of a long label, saved without room for it, reaches the edge."""
    fig = plots.figure((4, 3))
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([1, 2], [1, 2], label="a label far longer than the figure is wide " * 2)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(tmp_path / "cut.png", dpi=plots.DPI)
    with pytest.raises(AssertionError, match="right edge"):
        check_png(tmp_path / "cut.png")
    ax.set_yticks([1.0, 2.0])
    fig.canvas.draw()
    with pytest.raises(AssertionError, match="only"):
        check_axis(ax.yaxis, "two ticks")
