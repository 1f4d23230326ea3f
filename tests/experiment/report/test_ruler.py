"""experiment/report/ruler.py: RULER's tables (scores with Wilson intervals, the average over the
tasks every column has, effective lengths by RULER's threshold and the model's own) and figures,
from records as experiment/evals/ruler.py writes them."""
import json

from experiment.report import ruler as report
from experiment.report.seeds import wilson
from experiment.store.run import RunDir
from tests.experiment.report.synthetic import fake_run


def _rec(task, length, score, count=10, method=None, haystack="noise", **extra):
    return {"task": task, "eval_length": length, "score": score, "count": count, "scheme": "rope",
            "train_length": 8192, "step": 0, "template": "base", "seed": 42, "haystack": haystack,
            **({"method": method} if method else {}), **extra}


RECORDS = [
    _rec("niah_single_1", 4096, 1.0, method="direct"), _rec("vt", 4096, 0.8, method="direct"),
    _rec("niah_single_1", 8192, 0.9, method="direct"), _rec("vt", 8192, 0.6, method="direct"),
    _rec("niah_single_1", 16384, 0.0, method="direct"), _rec("vt", 16384, 0.0, method="direct"),
    _rec("niah_single_1", 4096, 1.0, method="yarn", same_as="direct"), _rec("vt", 4096, 0.8, method="yarn"),
    _rec("niah_single_1", 16384, 0.9, method="yarn"), _rec("vt", 16384, 0.7, method="yarn"),
    _rec("niah_single_2", 4096, 0.5, method="yarn", haystack="book"),  # yarn only: not averaged
]


def test_average_pools_the_examples_of_the_tasks_every_column_has():
    by_column = report.columns([("run", RECORDS)])
    assert list(by_column) == ["direct", "yarn"]
    assert report.averaged_tasks(by_column) == ["niah_single_1", "vt"]
    avg = report.average(by_column["yarn"], ["niah_single_1", "vt"])
    assert list(avg) == [4096, 16384]
    value, interval, count = avg[16384]
    assert abs(value - 0.8) < 1e-12 and count == 20 and interval == wilson(16.0, 20)


def test_effective_length_is_the_longest_length_up_to_which_every_average_reaches_the_threshold():
    assert report.effective_length({4096: 0.9, 8192: 0.86, 16384: 0.5, 32768: 0.9}, 0.856) == 8192
    assert report.effective_length({4096: 0.5}, 0.856) is None
    by_column = report.columns([("run", RECORDS)])
    low, where = report.own_threshold(by_column, ["niah_single_1", "vt"])
    assert low == wilson(18.0, 20)[0] and where == "direct at 4,096"  # the model as trained at its shortest length


def test_tables_give_intervals_counts_effective_lengths_and_mark_book_haystacks():
    text = report.tables(report.columns([("run", RECORDS)]), {"niah_single_2"})
    assert "### Average score (percent) over the tasks niah_single_1, vt" in text
    lo, hi = wilson(16.0, 20)
    assert f"| 16,384 | 0.0 [0, {100 * wilson(0, 20)[1]:.0f}] | 80.0 [{100 * lo:.0f}, {100 * hi:.0f}] |" in text
    assert "| direct | 4,096 | 8,192 |" in text  # 90 at 4k, 75 at 8k: RULER's 85.6 to 4k, the model's own to 8k
    assert "### niah_single_2 (book haystack): score (percent)" in text and "50.0 [" in text and "(n=10)" in text
    # yarn has no 8,192: its count stops there (80 at 16k is above the model's own bound, but 8k is unknown)
    assert "| yarn | 4,096 * | 4,096 * |" in text and "(yarn has no 8,192)" in text


def _section(text, heading):
    start = text.index(heading)
    end = text.find("\n###", start + len(heading))
    return text[start:end if end != -1 else None]


def test_each_task_run_at_several_lengths_has_its_own_effective_length():
    text = report.tables(report.columns([("run", RECORDS)]), {"niah_single_2"})
    single = _section(text, "#### niah_single_1: effective length")
    assert f"the model's own ({100 * wilson(10.0, 10)[0]:.1f}: the 95% lower bound of direct at 4,096)" in single
    assert "| direct | 8,192 | 8,192 |" in single  # 100 and 90 to 8k, 0 at 16k: over this task alone
    assert "| yarn | 4,096 * | 4,096 * |" in single and "(yarn has no 8,192)" in single
    vt = _section(text, "#### vt: effective length")
    assert "| direct | < 4,096 | 8,192 |" in vt and "| yarn | < 4,096 | 4,096 * |" in vt
    assert "niah_single_2 (book haystack): effective length" not in text  # one length: nothing to count
    one = [r for r in RECORDS if r["task"] == "niah_single_1"]
    assert "#### niah_single_1: effective length" not in report.tables(report.columns([("run", one)]), set())


def test_a_column_that_stops_short_of_the_longest_length_is_marked():
    short = [r for r in RECORDS if r.get("method") == "direct" and r["eval_length"] < 16384]
    text = report.tables(report.columns([("run", short + RECORDS[6:10])]), set())
    assert "| direct | 4,096 | 8,192 + |" in text and "longer ones were not run, not failed" in text
    assert "| yarn | 4,096 * | 4,096 * |" in text


def test_a_length_a_column_did_not_run_ends_its_effective_length():
    means = {4096: 0.9, 16384: 0.9}
    assert report.effective_length(means, 0.856) == 16384  # on its own lengths
    assert report.effective_length(means, 0.856, [4096, 8192, 16384]) == 4096
    assert report.effective_length(means, 0.856, [4096, 8192, 16384, 32768]) == 4096
    assert report.effective_length({8192: 0.9}, 0.856, [4096, 8192]) is None
    assert report.gap(means, [4096, 8192, 16384, 32768]) == 8192  # 32k: past its longest, not a gap
    assert report.gap({4096: 0.9, 8192: 0.5}, [4096, 8192, 16384]) is None


def test_write_draws_a_heat_map_per_column_and_the_average(tmp_path):
    run = fake_run(tmp_path, "rope", 8192, str(tmp_path), {4096: 10.0})
    path = RunDir(run).records_path("ruler")
    path.write_text(json.dumps(RECORDS))
    paths = report.write([run], tmp_path / "out")
    assert [p.split("/")[-1] for p in paths["heatmaps"]] == ["ruler_heatmap_direct.png", "ruler_heatmap_yarn.png"]
    assert (tmp_path / "out" / "ruler_average.png").stat().st_size > 10_000
    assert (tmp_path / "out" / "ruler.md").read_text().startswith("# RULER by task, length and method")


def test_compare_matches_cells_by_column_task_and_length():
    same, ok = report.compare(RECORDS, RECORDS[:3])
    assert ok and "largest difference: 0.0 points" in same
    moved = [{**RECORDS[0], "score": 0.9}]
    text, ok = report.compare(RECORDS, moved, tolerance=0.05)
    assert not ok and "niah_single_1 L=4096: 90.0 (committed 100.0" in text
    assert report.compare(RECORDS, moved, tolerance=0.1)[1]
    assert not report.compare(RECORDS, [{**RECORDS[0], "eval_length": 65536}])[1]  # not committed: not the same


def test_each_task_has_its_pairs_of_methods_on_the_same_prompts_and_designed_cells_apart():
    """Two methods on the same 10 prompts: their pairs table (McNemar); a designed cell (needles by
    distance) is left out of RULER's tables and reported by distance band with its own pairs."""
    direct = _rec("niah_single_1", 16384, 0.0, method="direct", scores=[0.0] * 10)
    yarn = _rec("niah_single_1", 16384, 0.9, method="yarn", scores=[1.0] * 9 + [0.0])
    designed = {"placement": "designed", "needle_distances": ["1.5w"], "needle_distance_tokens": [12288],
                "window": 8192, "questions_per_prefill": 1, "contexts": list(range(4)), "targets": [12288] * 4,
                "distances": [12290, 12270, 12301, 12280]}
    far = [_rec("niah_single_2", 16384, 0.75, count=4, method="yarn", scores=[1.0, 1.0, 1.0, 0.0], **designed),
           _rec("niah_single_2", 16384, 0.0, count=4, method="lm_infinite", scores=[0.0] * 4, **designed)]
    text = report.tables(report.columns([("run", [direct, yarn])]), set())
    assert "niah_single_1 at 16,384: pairs on the same 10 prompts" in text
    row = next(line for line in text.splitlines() if line.startswith("| direct | yarn |"))
    assert "0 / 9" in row and "McNemar p = 0.00391" in row and row.endswith("| **separated** | kept |")
    from experiment.report import distances
    by_column = report.columns([("run", [direct, yarn] + far)])
    band = distances.tables(by_column)
    assert "niah_single_2, L = 16,384, needles at 1.5w" in band and "12,288 back (past the window)" in band
    assert "| yarn | lm_infinite |" in band and "niah_single_1" not in band
