"""The report: panels and tables per unit, paper overlay only where it matches, a curve and a
column per checkpoint, per-position plot (what every figure shares: test_plots.py)."""
import json
import pathlib

import pytest

from experiment.report import paper, perplexity as reporting, write_report
from experiment.store.lock import WorkdirBusy
from experiment.store.run import RunError
from tests.experiment.report.synthetic import fake_run, full_run


def tables(markdown: str) -> list[str]:
    return markdown.split("### ")[1:]


def legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_paper_numbers_are_shipped_and_match_the_reference():
    assert dict(paper.curve("alibi", 512, sliding=False))[512] == 19.73
    assert dict(paper.curve("rope", 512, sliding=False))[15512] == 79.25
    assert dict(paper.curve("sinusoidal", 512, sliding=True))[1024] == 204.42
    assert 15512 not in dict(paper.curve("t5", 512, sliding=False))  # OOM in the paper
    assert paper.curve("nope", 512, sliding=False) == []


def test_report_overlays_the_paper_only_where_it_matches(tmp_path):
    wiki = fake_run(tmp_path, "alibi", 512, "/data/wikitext-103", {512: 20.5, 1012: 19.9})
    demo = fake_run(tmp_path, "rope", 64, "/data/mycorpus", {64: 5.0, 128: 6.0})
    paths = write_report([wiki, demo], tmp_path / "report")
    text = pathlib.Path(paths["md"]).read_text()
    assert "| 512 | 20.50 | 19.73 |" in text and "| 1012 | 19.90 | 18.73 |" in text
    assert text.count("Press et al. 2022 (word ppl) |") == 1  # only the WikiText alibi run has one
    for key in ("png", "positions_png"):
        assert pathlib.Path(paths[key]).stat().st_size > 10_000
    never = pathlib.Path(write_report([wiki], tmp_path / "r2", paper_mode="never")["md"]).read_text()
    assert "19.73" not in never
    forced = pathlib.Path(write_report([demo], tmp_path / "r3", paper_mode="always")["md"]).read_text()
    assert "Press et al. 2022" not in forced  # the paper has no rope row at L=64
    with pytest.raises(ValueError, match="paper mode"):
        write_report([wiki], tmp_path / "r4", paper_mode="sometimes")


def test_report_uses_word_level_perplexity_for_subword_runs(tmp_path):
    run = fake_run(tmp_path, "alibi", 512, "/data/wikitext-103-raw", {512: 3.0}, tokenizer="byte")
    records = json.loads((run / "eval" / "extrapolation.json").read_text())
    records[0].update(words=217646, word_ppl=25.0)
    (run / "eval" / "extrapolation.json").write_text(json.dumps(records))
    text = pathlib.Path(write_report([run], tmp_path / "report")["md"]).read_text()
    # word-level perplexity beside the byte-level one; no paper column: its L_valid counts words
    assert "(word ppl)" in text and "| 512 | 3.00 | 25.00 |" in text and "Press" not in text
    forced = pathlib.Path(write_report([run], tmp_path / "r2", paper_mode="always")["md"]).read_text()
    assert "| 512 | 3.00 | 25.00 | 19.73 |" in forced


def test_each_unit_gets_its_own_panel_and_tables(tmp_path):
    byte = fake_run(tmp_path, "alibi", 512, "/data/wikitext-103", {512: 3.0, 1024: 3.1}, tokenizer="byte",
                    name="byte")
    word = fake_run(tmp_path, "alibi", 512, "/data/wikitext-103", {512: 20.5, 1024: 19.9}, name="word")
    runs = reporting.load_runs([byte, word])
    fig = reporting.perplexity_figure(runs)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 2 and titles[0].startswith("byte-level perplexity") \
        and titles[1].startswith("word-level perplexity")
    assert all("on wikitext-103" in t for t in titles)  # one dataset: named in the title
    assert [len(legend_texts(ax)) for ax in fig.axes] == [1, 2]  # the paper's alibi curve: word panel only
    assert len(reporting.positions_figure(runs).axes) == 2
    blocks = tables(reporting.table(runs))
    assert len(blocks) == 2 and blocks[0].startswith("byte-level") and blocks[1].startswith("word-level")
    assert "(byte ppl" in blocks[0] and "(word ppl" not in blocks[0] and "(byte ppl" not in blocks[1]


def test_runs_on_different_datasets_are_labelled_with_them(tmp_path):
    wiki = fake_run(tmp_path, "alibi", 512, "/data/wikitext-103", {512: 20.5})
    other = fake_run(tmp_path, "rope", 512, "/data/mycorpus", {512: 30.0})
    runs = reporting.load_runs([wiki, other])
    assert [r["label"] for r in runs] == ["alibi (L=512, wikitext-103)", "rope (L=512, mycorpus)"]
    (ax,) = reporting.perplexity_figure(runs).axes
    assert "datasets differ" in ax.get_title()
    assert any("mycorpus" in t for t in legend_texts(ax)) and any("wikitext-103" in t for t in legend_texts(ax))
    assert "datasets differ" in reporting.table(runs)


@pytest.mark.parametrize("corpus, split, tokenizer, data, expected", [
    ("/data/wikitext-2", "test", "word", None, False),  # another dataset and split
    ("/data/wikitext-2", "valid", "word", None, False),
    ("/data/wikitext-103", "test", "word", None, False),  # the paper's numbers are validation
    ("/data/wikitext-103", "valid", "bpe", None, False),  # BPE lengths are not the paper's words
    ("/data/wikitext-103", "valid", "word", None, True),
    ("", "valid", "word", dict(source="hf", name="Salesforce/wikitext", hf_config="wikitext-2-raw-v1"), False),
    ("", "valid", "word", dict(source="hf", name="Salesforce/wikitext", hf_config="wikitext-103-v1"), True),
])
def test_paper_overlay_needs_dataset_split_unit_and_length_to_match(tmp_path, corpus, split, tokenizer,
                                                                    data, expected):
    run = fake_run(tmp_path, "alibi", 512, corpus, {512: 20.5, 1012: 19.9}, tokenizer=tokenizer,
                   split=split, data=data)
    runs = reporting.load_runs([run])
    assert ("Press et al. 2022" in reporting.table(runs)) == expected
    (ax,) = reporting.perplexity_figure(runs).axes
    assert any(t.startswith("Press et al. 2022") for t in legend_texts(ax)) == expected
    assert "| 512 | 20.50 | 19.73 |" in reporting.table(runs, paper_mode="always")  # forced: shown anyway


def test_records_of_two_checkpoints_are_two_curves_and_two_columns(tmp_path):
    """An evaluation that fell back past a damaged checkpoint (4) wrote records of step 2 beside
    those of step 4: a curve and a column per checkpoint, each naming its step; nothing joins them."""
    fell_back = fake_run(tmp_path, "alibi", 64, "/data/mycorpus", {64: 5.0, 128: 6.0, 256: 7.0}, steps=[4, 2, 2])
    single = fake_run(tmp_path, "rope", 64, "/data/mycorpus", {64: 5.0, 128: 6.0})
    runs = reporting.load_runs([fell_back, single])
    (ax,) = reporting.perplexity_figure(runs).axes
    assert legend_texts(ax) == ["alibi (L=64), step 4", "alibi (L=64), step 2", "rope (L=64)"]
    curves = {line.get_label(): list(line.get_xdata()) for line in ax.get_lines()
              if not line.get_label().startswith("_")}
    assert curves == {"alibi (L=64), step 4": [64], "alibi (L=64), step 2": [128, 256], "rope (L=64)": [64, 128]}
    text = reporting.table(runs)
    assert ("| L_valid | alibi (L=64) (word ppl, step 4) | alibi (L=64) (word ppl, step 2) "
            "| rope (L=64) (word ppl, step 1000) |") in text
    assert "| 64 | 5.00 |  | 5.00 |" in text and "| 256 |  | 7.00 |  |" in text
    assert "mixed" not in text


def test_out_that_is_a_file_is_a_one_line_error(tmp_path):
    run = fake_run(tmp_path, "alibi", 64, "/data/mycorpus", {64: 5.0})
    (tmp_path / "taken").write_text("not a folder")
    with pytest.raises(ValueError, match=r"^--out .*taken is a file; give a new or empty folder, e.g. --out "
                                         r".*taken_report$"):
        write_report([run], tmp_path / "taken")


def test_a_report_folder_holds_what_the_last_report_wrote_beside_the_users_own_files(tmp_path):
    """Issue 32: the perplexity report of one set of runs sat beside the passkey report of another."""
    with_passkey, plain = full_run(tmp_path, "with_passkey"), fake_run(tmp_path, "rope", 64, "/data/c", {64: 5.0})
    first = write_report([with_passkey], tmp_path / "report")
    assert pathlib.Path(first["passkey"]["md"]).exists()
    (tmp_path / "report" / "notes.txt").write_text("mine")  # issue 45: a user's file there stays
    second = write_report([plain], tmp_path / "report")
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == [
        ".written_by", "loss_by_position.png", "notes.txt", "ppl_vs_length.md", "ppl_vs_length.png"]
    assert pathlib.Path(second["md"]).parent == tmp_path / "report" and "passkey" not in second


def test_a_second_report_into_the_same_out_at_once_is_refused(tmp_path):
    from experiment.store import output
    run = fake_run(tmp_path, "alibi", 64, "/data/mycorpus", {64: 5.0})
    with output.replacing(tmp_path / "report", "report.py"):  # a report.py writing there now
        with pytest.raises(WorkdirBusy, match=r"--out .*report is in use by report.py \(pid"):
            write_report([run], tmp_path / "report")


def test_a_report_never_writes_into_a_run_or_a_folder_of_other_files(tmp_path):
    run = fake_run(tmp_path, "alibi", 64, "/data/mycorpus", {64: 5.0})
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    for out, what in ((run, "is a run folder"), (tmp_path / "notes", r"holds files that report.py did not write")):
        with pytest.raises(RunError, match=rf"^--out {out} {what}"):
            write_report([run], out)
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine" and not (run / "ppl_vs_length.png").exists()


def test_one_run_s_methods_share_a_table_and_a_panel_each_named_by_its_method(tmp_path):
    """eval_extrapolate.py --methods: one column and one curve per method, headed and labelled by the
    method alone ('direct' first, then by name, each before its log-n form, which shares its colour
    dashed), the run named once in the heading and the title; word-level perplexity in a table below."""
    path = fake_run(tmp_path, "rope", 64, "/data/wikitext-103-raw", {64: 5.0, 128: 9.0}, tokenizer="byte")
    records_path = path / "eval" / "extrapolation.json"
    base = json.loads(records_path.read_text())
    recs = []
    for method, factor in (("yarn", 0.5), ("direct", 1.0), ("yarn+logn", 0.6), ("pi", 0.9)):
        for r in base:
            same = r["eval_length"] == 64 and method != "direct"
            recs.append({**r, "method": method, "ppl": r["ppl"] * (1 if r["eval_length"] == 64 else factor),
                         "word_ppl": 2 * r["ppl"], **({"same_as": "direct"} if same else {})})
    records_path.write_text(json.dumps(recs))
    runs = reporting.load_runs([path])
    text = reporting.table(runs)
    assert "| L_valid | direct | pi | yarn | yarn+logn |" in text
    assert "| 64 | 5.00 | 5.00* | 5.00* | 5.00* |" in text and "| 128 | 9.00 | 8.10 | 4.50 | 5.40 |" in text
    assert text.count("| L_valid | direct | pi | yarn | yarn+logn |") == 2  # and the word-level table
    assert "Word-level perplexity of the same evaluations" in text and "(byte ppl" not in text
    ax = reporting.perplexity_figure(runs).axes[0]
    assert legend_texts(ax) == ["direct", "pi", "yarn", "yarn+logn"]
    assert "rope (L=64)" in ax.get_title()
    yarn, logn = ax.get_lines()[2:4]
    assert yarn.get_color() == logn.get_color() and yarn.get_linestyle() != logn.get_linestyle()


def test_a_full_device_while_a_report_is_written_names_its_file_and_the_size_needed(tmp_path, monkeypatch):
    """Issue 45, item 9: `no space left on device: a file`, where import and training name the file."""
    import shutil
    from experiment.store import files
    run = fake_run(tmp_path, "alibi", 64, "/data/mycorpus", {64: 5.0})
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 100, 100))
    with pytest.raises(files.NoSpace, match=rf"^no space left on device: {tmp_path / 'report' / 'ppl_vs_length.png'} "
                                            r"\(1 MB needed\)$"):
        write_report([run], tmp_path / "report")
    assert not (tmp_path / "report").exists()


def test_a_max_tokens_beyond_the_split_is_the_whole_split_s_series(tmp_path):
    """Issue 45, item 2: `--max_tokens 100000000` on a split of 217,646 tokens scored the whole split, and
    the report showed a second, identical series labelled "first 100,000,000 tokens"."""
    run = fake_run(tmp_path, "alibi", 64, "/data/mycorpus", {64: 5.0, 128: 5.5})
    path = tmp_path / "alibi_64" / "eval" / "extrapolation.json"
    recs = json.loads(path.read_text())
    path.write_text(json.dumps(recs + [{**r, "max_tokens": 100_000_000} for r in recs]))  # as recorded before
    runs = reporting.load_runs([run])
    assert len(reporting.series(runs[0])) == 1 and len(runs[0]["records"]) == 2
    assert "first 100,000,000" not in reporting.table(runs)
    truncated = [{**r, "max_tokens": 1000, "tokens": 1000} for r in recs]  # a real slice: its own series
    path.write_text(json.dumps(recs + truncated))
    assert len(reporting.series(reporting.load_runs([run])[0])) == 2
