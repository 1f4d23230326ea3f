"""Runs that differ only in their seed, reported as one (experiment/report/seeds.py): the perplexity
curve their mean with a min-max band, tables mean ± std (n), passkey cells pooled over every key of
every seed with a 95% Wilson interval and the heat map's mark; a run of one seed as before."""
import json
import pathlib

import pytest
from matplotlib.collections import PolyCollection

from experiment.report import passkey, perplexity, seeds, write_report
from tests.experiment.report.synthetic import fake_run, passkey_records

LENGTHS = (64, 128, 256)


def test_spread_and_the_wilson_interval_are_the_textbook_numbers():
    assert seeds.spread([4.0, 5.0, 6.0]) == {"mean": 5.0, "std": 1.0, "min": 4.0, "max": 6.0, "n": 3}
    assert seeds.spread([4.2]) == {"mean": 4.2, "std": 0.0, "min": 4.2, "max": 4.2, "n": 1}
    assert seeds.wilson(17, 20) == pytest.approx((0.6396, 0.9476), abs=1e-4)  # Wilson (1927), 95%
    assert seeds.wilson(0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)     # not empty at 0 hits
    assert seeds.wilson(20, 20) == pytest.approx((0.8389, 1.0), abs=1e-4)
    assert seeds.overlap((1.0, 2.0), (2.0, 3.0)) and not seeds.overlap((1.0, 1.9), (2.0, 3.0))


def _seed_runs(root: pathlib.Path, ppl_by_seed: dict[int, tuple], **kwargs) -> list[pathlib.Path]:
    """alibi at L=64 once per seed (folders alibi_L64, alibi_L64_seed1, ... as sweep.py --seeds names them)."""
    return [fake_run(root, "alibi", 64, "/data/mycorpus", dict(zip(LENGTHS, ppl)), tokenizer="byte",
                     name="alibi_L64" + (f"_seed{seed}" if seed else ""), seed=seed, **kwargs)
            for seed, ppl in ppl_by_seed.items()]


def test_seeds_of_one_config_are_one_curve_with_a_band_and_mean_std_n_in_the_table(tmp_path):
    runs = _seed_runs(tmp_path, {0: (5.0, 5.1, 5.2), 1: (5.2, 5.3, 5.5), 2: (5.1, 5.2, 5.2)})
    single = fake_run(tmp_path, "rope", 64, "/data/mycorpus", dict(zip(LENGTHS, (4.4, 5.0, 7.0))), tokenizer="byte")
    other_lr = fake_run(tmp_path, "alibi", 64, "/data/mycorpus", {64: 9.0}, tokenizer="byte", name="alibi_digits",
                        data={"passkey_digits": 5}, seed=1)  # another config: not one of the seeds
    text = pathlib.Path(write_report([*runs, single, other_lr], tmp_path / "report")["md"]).read_text()
    assert "| L_valid | alibi (L=64), 3 seeds (byte ppl, step 1000) | rope (L=64) (byte ppl, step 1000) |" in text
    assert "| 64 | 5.10 ± 0.10 (3) | 4.40 | 9.00 |" in text        # the single runs as before
    assert "| 256 | 5.30 ± 0.17 (3) | 7.00 |  |" in text
    assert "mean ± std (n): over the n seeds" in text and "band spans the lowest to the highest seed" in text
    assert f"`{runs[0]}`, `{runs[1]}`, `{runs[2]}` (mycorpus, byte, 3 seeds)" in text

    grouped = seeds.grouped(perplexity.load_runs([*runs, single]))
    assert [run["label"] for run in grouped] == ["alibi (L=64), 3 seeds", "rope (L=64)"]
    assert [run["label"] for run in grouped[0]["members"]] == [f"alibi (L=64), seed {s}" for s in (0, 1, 2)]
    (ax,) = perplexity.perplexity_figure(grouped).axes
    labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert labels == ["alibi (L=64), 3 seeds: mean, band min-max", "rope (L=64)"]
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]  # one band: the run of seeds
    ys = sorted({round(float(y), 6) for _, y in band.get_paths()[0].vertices})
    assert ys == [5.0, 5.1, 5.2, 5.3, 5.5]  # min 5.0 / 5.1 / 5.2 and max 5.2 / 5.3 / 5.5
    mean_line = ax.get_lines()[0]
    assert list(mean_line.get_ydata()) == pytest.approx([5.1, 5.2, 5.3])


def test_the_same_seed_in_two_folders_is_compared_not_pooled(tmp_path):
    a = fake_run(tmp_path / "A", "alibi", 64, "/data/mycorpus", {64: 5.0}, tokenizer="byte", name="alibi_L64")
    b = fake_run(tmp_path / "B", "alibi", 64, "/data/mycorpus", {64: 5.2}, tokenizer="byte", name="alibi_L64")
    grouped = seeds.grouped(perplexity.load_runs([a, b]))
    assert [run["label"] for run in grouped] == ["alibi (L=64) [A/alibi_L64]", "alibi (L=64) [B/alibi_L64]"]
    assert "members" not in grouped[0] and "±" not in perplexity.table(grouped)


def _passkey(run: pathlib.Path, accuracies: dict) -> None:
    """Passkey records at depths 0 and 1, 20 keys each, accuracy {length: (depth 0, depth 1)}."""
    recs = [{**r, "accuracy": accuracies[r["eval_length"]][int(r["depth"])]}
            for r in passkey_records(step=1000, lengths=tuple(accuracies), depths=(0.0, 1.0))]
    (run / "eval" / "passkey.json").write_text(json.dumps(recs))


def test_passkey_of_several_seeds_pools_every_key_with_a_wilson_interval_and_marks_the_heat_map(tmp_path):
    runs = _seed_runs(tmp_path, {0: (5.0, 5.1, 5.2), 1: (5.2, 5.3, 5.5)})
    _passkey(runs[0], {64: (1.0, 1.0), 128: (0.9, 0.95), 256: (0.2, 0.5)})
    _passkey(runs[1], {64: (1.0, 0.95), 128: (0.85, 0.95), 256: (0.1, 0.4)})
    single = fake_run(tmp_path, "rope", 64, "/data/mycorpus", {64: 4.4}, tokenizer="byte")
    _passkey(single, {64: (1.0, 1.0), 128: (0.9, 0.0)})
    paths = write_report([*runs, single], tmp_path / "report")
    text = pathlib.Path(paths["passkey"]["md"]).read_text()
    low, high = seeds.wilson(18 + 19 + 17 + 19, 80)  # every key of both seeds and depths at 128
    assert f"| 128 | 0.91 [{low:.2f}, {high:.2f}] | 0.45 |" in text  # the single run as before
    assert "Examples per (length, depth) cell: 20 per seed" in text and "95% Wilson interval" in text
    assert "| 0 | 1.00 [0.91, 1.00] | 0.88 [0.74, 0.95] | 0.15 [0.07, 0.29] |" in text  # depth 0, pooled
    assert sorted(pathlib.Path(p).name for p in paths["passkey"]["heatmaps"]) == [
        "passkey_heatmap_alibi_L64.png", "passkey_heatmap_rope_64.png"]

    pooled = [{**r, "train_seed": seed} for seed, run in enumerate(runs)
              for r in json.loads((run / "eval" / "passkey.json").read_text())]
    # depth 1 at 128: 38 of 40, [0.84, 0.99], holds 64's 0.975; depth 0 at 128: 35 of 40, [0.74, 0.95], not 1.0;
    # 256 lies below 128 at both depths
    assert passkey.same_as_shorter(pooled) == {(128, 1.0)}
    fig = passkey.heatmap_figure("alibi, 2 seeds", pooled)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "0.95≈" in texts and "0.88" in texts
    assert "≈: its 95% Wilson interval (every key of the 2 seeds) holds the value at the next shorter length" in \
        fig.axes[0].get_title().replace("\n", " ")
    plain = passkey.heatmap_figure("rope", json.loads((single / "eval" / "passkey.json").read_text()))
    assert not any("≈" in t.get_text() for t in plain.axes[0].texts) and "≈" not in plain.axes[0].get_title()
