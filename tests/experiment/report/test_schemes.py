"""The table of every scheme from synthetic records: each row reads only its own overrides at each
length, rows sort by perplexity at the longest length, cells a scheme cannot have say why, and
unevaluated rows show as such (experiment/report/schemes.py)."""
import json
import pathlib

import pytest

from experiment.report import schemes, seeds
from experiment.store.run import RunDir, RunError

LENGTHS = [64, 128, 256]
PROTOCOL = {"train_length": 64, "lengths": LENGTHS, "split": "valid", "max_tokens": 0, "steps": 10,
            "batch_size": 4, "description": "synthetic",
            "passkey": {"depths": [0.0, 1.0], "per_cell": 2, "seed": 1, "digits": 4}}


def ppl_record(length, ppl, overrides=None):
    r = {"scheme": "x", "train_length": 64, "step": 10, "eval_length": length, "stride": length, "split": "valid",
         "max_tokens": 0, "tokens": 1000, "nll": 0.0, "ppl": ppl}
    return {**r, "overrides": overrides} if overrides else r


def passkey_records(length, accuracies, overrides=None):
    """One record per depth (0 and 1), 2 keys each."""
    out = []
    for depth, acc in zip((0.0, 1.0), accuracies):
        r = {"task": "passkey", "eval_length": length, "depth": depth, "digits": 4, "accuracy": acc, "count": 2,
             "step": 10}
        out.append({**r, "overrides": overrides} if overrides else r)
    return out


def write_run(root: pathlib.Path, name: str, ppl: list[dict], passkey: list[dict]) -> None:
    run = RunDir(root / name)
    run.eval_dir.mkdir(parents=True)
    run.records_path("perplexity").write_text(json.dumps(ppl))
    run.records_path("passkey").write_text(json.dumps(passkey))


def row(name, run, family, overrides=None, cannot=None):
    return {"name": name, "run": run, "scheme": run, "family": family, "citation": f"{name} et al.", "rule": "",
            "overrides": {str(n): (overrides or {}).get(n, {}) for n in LENGTHS}, "cannot": cannot or {}}


def test_the_table_sorts_reads_each_rows_overrides_and_says_why_a_cell_is_empty(tmp_path):
    yarn = {n: {"posenc.rope.yarn_scale": f"{n // 64}"} for n in LENGTHS}
    write_run(tmp_path, "alibi", [ppl_record(64, 5.0), ppl_record(128, 5.0), ppl_record(256, 5.1)],
              passkey_records(64, (1, 1)) + passkey_records(128, (0.5, 1)) + passkey_records(256, (0, 0.5)))
    write_run(tmp_path, "rope",
              [ppl_record(64, 4.0), ppl_record(128, 6.0), ppl_record(256, 9.0)]
              + [ppl_record(n, p, yarn[n]) for n, p in zip(LENGTHS, (4.4, 4.8, 5.5))]
              + [ppl_record(256, 99.0, {"posenc.rope.yarn_scale": "8"})],  # another factor: not the row's
              passkey_records(64, (1, 1)) + [passkey_records(128, (0, 0))[0]]  # 128: one depth of two only
              + passkey_records(64, (0.5, 0.5), yarn[64]))
    write_run(tmp_path, "learned", [ppl_record(64, 3.0)], passkey_records(64, (1, 0)))
    why = "positional scheme 'learned' has a table of 64 positions but length 128 was requested"
    manifest = {"protocol": PROTOCOL, "rows": [
        row("alibi", "alibi", "relative"), row("rope", "rope", "relative"),
        row("rope + YaRN", "rope", "relative", overrides=yarn),
        row("learned", "learned", "absolute", cannot={"128": why, "256": why}),
        row("fox", "fox", "data-dependent")]}  # never evaluated: no run folder at all
    (tmp_path / schemes.MANIFEST).write_text(json.dumps(manifest))

    paths = schemes.write(tmp_path, tmp_path / "out")
    data = json.loads(pathlib.Path(paths["json"]).read_text())
    by_name = {r["name"]: r for r in data["rows"]}
    assert [r["name"] for r in data["rows"]] == ["alibi", "rope + YaRN", "rope", "fox", "learned"]
    assert by_name["rope + YaRN"]["ppl"] == {"64": 4.4, "128": 4.8, "256": 5.5}
    assert abs(by_name["rope + YaRN"]["ratio"]["256"] - 5.5 / 4.4) < 1e-12
    assert by_name["rope + YaRN"]["passkey"] == {"64": 0.5}
    assert by_name["rope"]["passkey"] == {"64": 1.0}  # 128 lacks a depth: no cell
    assert by_name["alibi"]["passkey"] == {"64": 1.0, "128": 0.75, "256": 0.25}
    assert by_name["learned"]["missing"] == {"128": why, "256": why}
    assert by_name["fox"]["ppl"] == {} and by_name["fox"]["missing"]["64"] == schemes.NOT_YET

    text = pathlib.Path(paths["md"]).read_text()
    lines = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| ") and " | " in line}
    assert lines["learned"].startswith("| 5 | learned | absolute | learned et al. | 3.00 | n/a [1] |")
    assert f"[1] learned: {why}" in text
    assert lines["fox"].count("| – ") == 2 + 2 + 3  # ppl at L and 16L, 2 ratios, 3 passkey cells
    assert "| 2 | rope + YaRN | relative | rope + YaRN et al. | 4.40 | 5.50 | 1.09 | 1.25 | 0.50 |" in text
    assert pathlib.Path(paths["png"]).stat().st_size > 10_000


def test_a_damaged_manifest_or_timings_file_is_named_with_what_to_do(tmp_path):
    """Issue 32: a truncated rows.json gave `Expecting value: line 16 column 4`, naming no file."""
    (tmp_path / schemes.MANIFEST).write_text(json.dumps({"protocol": PROTOCOL, "rows": []}, indent=1)[:40])
    with pytest.raises(RunError, match=rf"^{tmp_path / 'rows.json'} is damaged \(Expecting .*\); the table's command "
                                       rf"writes it again .*: python sweep.py --config configs/all_schemes.py "
                                       rf"--table --workdir {tmp_path}$"):
        schemes.write(tmp_path, tmp_path / "out")
    (tmp_path / schemes.MANIFEST).write_text(json.dumps({"protocol": PROTOCOL, "rows": []}))
    (tmp_path / schemes.TIMINGS).write_text('{"alibi": ')
    with pytest.raises(RunError, match=rf"^{tmp_path / 'timings.json'} is damaged .*: delete it \(rm "):
        schemes.write(tmp_path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_rows_of_several_seeds_show_mean_std_n_and_share_a_rank_where_their_intervals_overlap(tmp_path):
    """sweep.py --table --seeds: a row's run in RUN and RUN_seed<N>; ranks tie where a row has several
    seeds and the intervals (mean ± std) at the longest length overlap."""
    def seeds_of(run, last_ppls, passkey_at_64):
        for seed, (ppl, acc) in enumerate(zip(last_ppls, passkey_at_64)):
            write_run(tmp_path, run + (f"_seed{seed}" if seed else ""),
                      [ppl_record(64, 5.0), ppl_record(128, 5.0), ppl_record(256, ppl)], passkey_records(64, acc))
    seeds_of("alibi", (5.0, 5.2, 5.4), ((1, 1), (1, 0.5), (0.5, 0.5)))   # 5.20 ± 0.20 at 256
    seeds_of("fox", (5.5, 5.3, 5.4), ((1, 1), (1, 1), (1, 1)))          # 5.40 ± 0.10: overlaps alibi's
    seeds_of("rope", (9.0,), ((1, 1),))                                  # one seed: as before, its own rank
    seeds_of("kerple", (5.31,), ((1, 1),))                                 # one seed inside both intervals
    write_run(tmp_path, "alibi_seedx", [ppl_record(256, 99.0)], [])      # not a seed folder: ignored
    manifest = {"protocol": PROTOCOL, "rows": [row(n, n, "relative") for n in ("alibi", "fox", "rope", "kerple")]}
    (tmp_path / schemes.MANIFEST).write_text(json.dumps(manifest))
    paths = schemes.write(tmp_path, tmp_path / "out")
    text = pathlib.Path(paths["md"]).read_text()
    assert "| 1= | alibi | relative | alibi et al. | 5.00 ± 0.00 (3) | 5.20 ± 0.20 (3) | 1.00 | 1.04 |" in text
    assert "| 1= | kerple | relative | kerple et al. | 5.00 | 5.31 | 1.00 | 1.06 | 1.00 |" in text
    assert "| 1= | fox | relative | fox et al. | 5.00 ± 0.00 (3) | 5.40 ± 0.10 (3) |" in text
    assert "| 4 | rope | relative | rope et al. | 5.00 | 9.00 | 1.00 | 1.80 | 1.00 |" in text  # single: as before
    low, high = seeds.wilson(4 + 3 + 2, 12)  # alibi at 64: every key (2 depths x 2 keys) of every seed (3)
    assert f"| 0.75 [{low:.2f}, {high:.2f}] |" in text and "Rows trained with several seeds (alibi, fox;" in text
    data = {r["name"]: r for r in json.loads(pathlib.Path(paths["json"]).read_text())["rows"]}
    assert data["alibi"]["seed_runs"] == ["alibi", "alibi_seed1", "alibi_seed2"] and data["alibi"]["tied"]
    assert data["alibi"]["ppl_spread"]["256"]["std"] == pytest.approx(0.2) and "seed_runs" not in data["rope"]
    assert "tied" not in data["rope"] and data["rope"]["rank"] == 4


def test_keep_takes_the_rows_not_rerun_from_an_earlier_table_under_the_same_protocol_only(tmp_path):
    """Issue 35: a few rows re-run alone (configs/studies/all_schemes.py with --param only=...) beside the committed
    table's others: rows with a run folder are read from it, the others keep the earlier numbers and
    times, the table says which are which, and an earlier table of another protocol is refused."""
    first = tmp_path / "first"
    write_run(first, "alibi", [ppl_record(n, p) for n, p in zip(LENGTHS, (5.0, 5.0, 5.1))],
              passkey_records(64, (1, 1)))
    write_run(first, "rope", [ppl_record(n, p) for n, p in zip(LENGTHS, (4.0, 6.0, 9.0))],
              passkey_records(64, (1, 0)))
    manifest = {"protocol": PROTOCOL, "rows": [row("alibi", "alibi", "relative"), row("rope", "rope", "relative")]}
    (first / schemes.MANIFEST).write_text(json.dumps(manifest))
    (first / schemes.TIMINGS).write_text(json.dumps({"alibi": {"train_wall_s": 60.0}, "rope": {"train_wall_s": 120.0}}))
    earlier = schemes.write(first, tmp_path / "earlier")["json"]

    again = tmp_path / "again"  # rope re-run alone, faster and with other numbers
    write_run(again, "rope", [ppl_record(n, p) for n, p in zip(LENGTHS, (4.0, 5.0, 6.0))], passkey_records(64, (1, 1)))
    (again / schemes.MANIFEST).write_text(json.dumps(manifest))
    (again / schemes.TIMINGS).write_text(json.dumps({"rope": {"train_wall_s": 30.0}}))
    paths = schemes.write(again, tmp_path / "out", keep=earlier)
    data = json.loads(pathlib.Path(paths["json"]).read_text())
    by_name = {r["name"]: r for r in data["rows"]}
    assert by_name["alibi"]["ppl"] == {"64": 5.0, "128": 5.0, "256": 5.1} and by_name["alibi"]["kept"]
    assert by_name["rope"]["ppl"] == {"64": 4.0, "128": 5.0, "256": 6.0} and "kept" not in by_name["rope"]
    assert by_name["rope"]["passkey"] == {"64": 1.0} and by_name["alibi"]["passkey"] == {"64": 1.0}
    assert data["timings"] == {"alibi": {"train_wall_s": 60.0}, "rope": {"train_wall_s": 30.0}}
    assert [r["name"] for r in data["rows"]] == ["alibi", "rope"]  # ranked together: 5.1 < 6.0
    text = pathlib.Path(paths["md"]).read_text()
    assert f"1 rows are those of an earlier table measured under the same protocol ({earlier}); measured again " \
           f"this time: rope." in text
    assert schemes.write(again, tmp_path / "plain")["md"]  # without keep: alibi is "not evaluated yet"
    plain = json.loads(pathlib.Path(tmp_path / "plain" / "all_schemes.json").read_text())
    assert {r["name"]: r["ppl"] for r in plain["rows"]}["alibi"] == {}

    other = {**manifest, "protocol": {**PROTOCOL, "steps": 20}}
    (again / schemes.MANIFEST).write_text(json.dumps(other))
    with pytest.raises(ValueError, match=r"was measured under another protocol \(steps differ\)"):
        schemes.write(again, tmp_path / "out2", keep=earlier)
