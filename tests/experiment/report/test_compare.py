"""A report against a committed one (experiment/report/compare.py, report.py --compare_with): cells
matched by table, row and column, perplexities compared relatively and accuracies absolutely, the
largest difference named; and results/NAME/run.sh --check, which re-runs one scheme of a committed
result and compares (slow: minutes of training)."""
import pathlib
import subprocess
import sys

import pytest

from experiment.report import compare
from tests.conftest import REPO, SHARED_WIKITEXT, run_entry
from tests.experiment.report.synthetic import fake_run
from tests.experiment.test_cli import assert_clean_error

COMMITTED_PPL = """# Perplexity vs. evaluation length

Runs: `runs/passkey/alibi` (python_docs, byte), `runs/passkey/rope` (python_docs, byte)

### byte-level perplexity on python_docs, valid, nonoverlapping

| L_valid | alibi (L=64) (byte ppl, step 1500) | rope (L=64) (byte ppl, step 1500) |
|---:|---:|---:|
| 64 | 4.69 | 4.29 |
| 1024 | 4.49 | 28.40 |

Bytes scored per cell: 74,086.
"""
COMMITTED_PASSKEY = """# Passkey retrieval vs. evaluation length

### Passkey accuracy (exact match, mean over depths)

| length | alibi (L=64, passkey 0.5) | rope (L=64, passkey 0.5) |
|---:|---:|---:|
| 64 | 1.00 | 1.00 |
| 1024 | 0.33 | 0.00 |
"""


def _report(folder: pathlib.Path, ppl: str, passkey: str) -> pathlib.Path:
    folder.mkdir(parents=True)
    (folder / "ppl_vs_length.md").write_text(ppl)
    (folder / "passkey.md").write_text(passkey)
    return folder


def test_a_re_run_of_one_scheme_is_compared_on_its_cells_and_the_largest_difference_named(tmp_path):
    committed = _report(tmp_path / "committed", COMMITTED_PPL, COMMITTED_PASSKEY)
    only_alibi = lambda text: "\n".join(  # the re-run's report: the alibi column alone
        line.rsplit(" |", 2)[0] + " |" if line.startswith("|") else line for line in text.splitlines())
    new = _report(tmp_path / "new", only_alibi(COMMITTED_PPL).replace("| 1024 | 4.49 |", "| 1024 | 4.51 |"),
                  only_alibi(COMMITTED_PASSKEY).replace("| 1024 | 0.33 |", "| 1024 | 0.17 |"))
    assert compare.cells(COMMITTED_PPL)[("byte-level perplexity on python_docs, valid, nonoverlapping", "1024",
                                         "rope (L=64) (byte ppl, step 1500)")] == "28.40"
    found = compare.compare(committed, new)
    assert [(d.file, d.row, d.difference) for d in found] == [
        ("ppl_vs_length.md", "1024", pytest.approx(0.02 / 4.49)), ("ppl_vs_length.md", "64", 0.0),
        ("passkey.md", "1024", pytest.approx(0.16)), ("passkey.md", "64", 0.0)]  # rope's cells: not re-run
    text, same = compare.summary(found, committed)
    assert not same and "ppl_vs_length.md: 2 cells compared with" in text
    assert "1 differ by more than 0 (relative)" in text
    assert ("largest difference 0.45% (ppl_vs_length.md, byte-level perplexity on python_docs, valid, nonoverlapping, "
            "alibi (L=64) (byte ppl, step 1500) at 1024: 4.49 committed, 4.51 now)") in text
    assert "passkey.md: 2 cells compared" in text and "largest difference 0.16 (" in text
    assert compare.summary(found, committed, tolerance=0.2)[1]
    assert compare.summary(compare.compare(committed, committed), committed)[1]  # itself: every cell the same
    assert compare._number("4.69 ± 0.02 (3)") == 4.69 and compare._number("0.85 [0.62, 0.95]") == 0.85
    with pytest.raises(ValueError, match=r"--compare_with .*: no cell of its tables .* is in this report; give runs of "
                                         r"that result \(.* the column headers match\)$"):
        compare.summary([], committed)  # no study of that name: none advised (issue 45, item 8)
    with pytest.raises(ValueError, match=r"headers match\), e.g. python study.py configs/studies/passkey.py --check$"):
        compare.summary([], REPO / "results" / "passkey" / "seed0")


def test_a_missing_folder_or_one_without_tables_is_refused_naming_it(tmp_path):
    """Issue 45, item 8: `--compare_with results/nosuch` was never called missing, and its advice named
    results/nosuch's study."""
    with pytest.raises(ValueError, match=rf"^--compare_with {tmp_path / 'nosuch'} does not exist; give a committed "
                                         r"result's folder holding ppl_vs_length.md or passkey.md"):
        compare.check_folder(tmp_path / "nosuch")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty holds neither ppl_vs_length.md nor passkey.md; give"):
        compare.check_folder(tmp_path / "empty")
    compare.check_folder(_report(tmp_path / "committed", COMMITTED_PPL, COMMITTED_PASSKEY))


def test_reports_measured_otherwise_are_refused_saying_what_differs(tmp_path):
    """Results are compared only under one protocol: the same samples per cell and checkpoint step."""
    counts = COMMITTED_PASSKEY + "\nExamples per (length, depth) cell: 20; chance (guessing a 4-digit number): 1e-04.\n"
    steps = "\n### alibi (L=64, passkey 0.5): accuracy by length and depth (step 1500)\n"
    committed = _report(tmp_path / "committed", COMMITTED_PPL, counts + steps)
    fewer = _report(tmp_path / "fewer", COMMITTED_PPL, counts.replace("cell: 20;", "cell: 5;") + steps)
    with pytest.raises(ValueError, match=r"passkey.md was measured otherwise \(examples per \(length, depth\) cell "
                                         r"under 'Passkey accuracy \(exact match, mean over depths\)': 20 committed, "
                                         r"5 now\); results are compared only under the same protocol"):
        compare.compare(committed, fewer)
    later = _report(tmp_path / "later", COMMITTED_PPL, counts + steps.replace("1500", "1000"))
    with pytest.raises(ValueError, match=r"the checkpoint step of alibi \(L=64, passkey 0.5\): 1500 committed, 1000 now"):
        compare.compare(committed, later)
    other_text = _report(tmp_path / "text", COMMITTED_PPL.replace("74,086", "80,000"), counts + steps)
    with pytest.raises(ValueError, match=r"ppl_vs_length.md was measured otherwise \(bytes scored per cell"):
        compare.compare(committed, other_text)
    assert compare.compare(committed, committed)  # the same protocol: compared


def test_report_py_compares_with_a_committed_result_and_fails_beyond_the_tolerance(tmp_path):
    run = fake_run(tmp_path, "alibi", 64, "/data/mycorpus", {64: 5.0, 128: 5.1}, tokenizer="byte")
    first = run_entry("report.py", str(run), "--out", str(tmp_path / "committed"))
    assert first.returncode == 0, first.stderr[-2000:]
    same = run_entry("report.py", str(run), "--out", str(tmp_path / "again"), "--compare_with",
                     str(tmp_path / "committed"))
    assert same.returncode == 0 and "ppl_vs_length.md: 2 cells compared" in same.stdout, same.stderr[-2000:]
    assert "largest difference 0.00%" in same.stdout
    committed = tmp_path / "committed" / "ppl_vs_length.md"
    committed.write_text(committed.read_text().replace("| 128 | 5.10 |", "| 128 | 5.00 |"))
    moved = run_entry("report.py", str(run), "--out", str(tmp_path / "again"), "--compare_with",
                      str(tmp_path / "committed"))
    assert_clean_error(moved, "the report differs by more than --compare_tolerance=0", "--compare_tolerance=0.05")
    assert "largest difference 2.00% (" in moved.stdout
    loose = run_entry("report.py", str(run), "--out", str(tmp_path / "again"), "--compare_with",
                      str(tmp_path / "committed"), "--compare_tolerance=0.05")
    assert loose.returncode == 0, loose.stderr[-2000:]
    missing = run_entry("report.py", str(run), "--out", str(tmp_path / "third"), "--compare_with",
                        str(tmp_path / "nosuch"))
    assert_clean_error(missing, f"--compare_with {tmp_path / 'nosuch'} does not exist")
    assert not (tmp_path / "third").exists()  # refused before the report is written


@pytest.mark.slow  # minutes of CPU: one scheme trained as the committed result was, then compared
@pytest.mark.parametrize("result", ["passkey", "wikitext_small"])
def test_a_committed_result_reproduces_with_its_study_check(result, tmp_path):
    """python study.py configs/studies/NAME.py --check: one scheme re-run with seed 0 in a fresh folder,
    its report compared with the committed seed-0 tables (results/NAME/seed0/); every compared cell must
    print the same digits (on this machine type: elsewhere, see the results' READMEs)."""
    if result == "wikitext_small" and not (SHARED_WIKITEXT / "wikitext-103-raw").exists():
        pytest.skip("../shared/data/wikitext is not present")
    done = subprocess.run([sys.executable, "study.py", f"configs/studies/{result}.py", "--check", "--workdir",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert "cells compared with results/" in done.stdout, done.stderr[-3000:]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
