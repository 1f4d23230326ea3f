"""experiment/report/pairs.py: paired comparisons of methods on the same questions (exact McNemar;
a bootstrap over contexts where one prefill served several questions)."""
import numpy as np
import pytest

from experiment.report import pairs


def test_the_exact_mcnemar_p_value():
    assert pairs.mcnemar_p(0, 0) == 1.0
    assert pairs.mcnemar_p(6, 0) == pytest.approx(2 / 64)           # 6 discordant, all one way
    assert pairs.mcnemar_p(1, 5) == pytest.approx(2 * 7 / 64)       # 2 * P(X <= 1), X ~ Bin(6, 1/2)
    assert pairs.mcnemar_p(5, 5) == 1.0
    d = pairs.paired([1] * 10 + [0] * 10, [0] * 10 + [0] * 10)      # 10 vs 0 discordant: p = 2 / 1024
    assert d.test == "mcnemar" and d.separated and d.estimate == pytest.approx(0.5) and (d.a_only, d.b_only) == (10, 0)
    d = pairs.paired([1, 1, 1, 0, 0], [0, 0, 1, 0, 1])              # 2 vs 1: not separated
    assert not d.separated and d.p == pytest.approx(1.0)


def test_questions_of_one_context_move_together_in_the_interval_and_the_test():
    """Eight contexts of four questions, each context all right or all wrong for A (B always wrong):
    as independent questions the difference would look sure; resampling contexts shows 8 draws' worth,
    and the test counts contexts: 5 to 0 is the exact sign test's p = 2 / 32, not separated (a
    bootstrap over 8 clusters would have called it so), where 6 to 0 (p = 2 / 64) is."""
    a = np.repeat([1, 1, 1, 1, 1, 0, 0, 0], 4).astype(float)
    b = np.zeros(32)
    clusters = np.repeat(np.arange(8), 4)
    d = pairs.paired(a, b, clusters)
    assert d.test == "sign" and d.clusters == 8 and d.estimate == pytest.approx(5 / 8)
    assert (d.a_only, d.b_only, d.a_groups, d.b_groups) == (20, 0, 5, 0)
    independent = pairs.paired(a, b)
    assert independent.test == "mcnemar" and independent.p == pytest.approx(2 / 2 ** 20)
    assert (d.high - d.low) > 1.5 * (independent.high - independent.low)
    assert d.low > 0 and d.p == pytest.approx(2 / 32) and not d.separated
    six = pairs.paired(np.repeat([1, 1, 1, 1, 1, 1, 0, 0], 4).astype(float), b, clusters)
    assert six.p == pytest.approx(2 / 64) and six.separated
    tied = pairs.paired(np.repeat([1, 0, 1, 0], 4), np.repeat([0, 1, 1, 0], 4), np.repeat(np.arange(4), 4))
    assert not tied.separated and tied.low < 0 < tied.high and (tied.a_groups, tied.b_groups) == (1, 1)


def test_prompts_whose_book_stretches_share_text_are_one_group():
    """Stretches [first word, words] of a 1,000-word book: 0-99 and 50-149 share words, 140-239 shares
    with the second (a chain: all three one group), 900-99 wraps round the end into the first; 500-599
    stands alone. The k questions of a context share its stretch; without spans the groups are the
    contexts."""
    spans = [[0, 100], [50, 100], [140, 100], [500, 100], [950, 100], [600, 100]]
    assert pairs.shared_text_groups(range(6), spans, 1000).tolist() == [0, 0, 0, 1, 0, 2]
    assert pairs.shared_text_groups(range(3), [[0, 100], [100, 100], [200, 100]], 1000).tolist() == [0, 1, 2]
    two_a_context = pairs.shared_text_groups([0, 0, 1, 1, 2, 2], [[0, 9], [0, 9], [5, 9], [5, 9], [300, 9], [300, 9]], 1000)
    assert two_a_context.tolist() == [0, 0, 0, 0, 1, 1]
    assert pairs.shared_text_groups([3, 3, 1, 1]).tolist() == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="one per question"):
        pairs.shared_text_groups(range(3), [[0, 9]], 1000)
    # four methods' worth of one pair: 8 prompts in 4 groups, A right and B wrong on every one: McNemar over
    # prompts would say p = 2 / 256; over the groups it is 4 to 0, p = 2 / 16 = 0.125 (issue 65, Gemma 3)
    groups = pairs.shared_text_groups(range(8), [[0, 50], [30, 50], [200, 50], [220, 50], [400, 50], [420, 50],
                                                 [600, 50], [640, 50]], 1000)
    d = pairs.paired([1.0] * 8, [0.0] * 8, groups)
    assert d.clusters == 4 and d.p == pytest.approx(0.125) and not d.separated
    text = pairs.pairs_table({"self_extend": [1.0] * 8, "direct": [0.0] * 8}, groups)
    assert "| self_extend | direct | +100.0 [+100.0, +100.0] | 8 / 0 | sign test over 4 groups, 4 / 0: p = 0.125 | not separated |  |" in text


def test_the_pairs_table_says_which_pairs_are_separated():
    text = pairs.pairs_table({"self_extend": [1] * 12 + [0] * 4, "yarn": [1] * 10 + [0] * 6,
                              "lm_infinite": [0] * 16})
    rows = text.strip().splitlines()[2:]
    assert len(rows) == 3
    assert rows[0].startswith("| self_extend | yarn |") and rows[0].endswith("| not separated |  |")
    assert rows[1].startswith("| self_extend | lm_infinite |") and "**separated**" in rows[1]
    with pytest.raises(ValueError, match="same questions"):
        pairs.paired([1, 0], [1, 0, 1])


def test_a_column_asked_with_more_questions_is_compared_on_the_questions_both_have():
    """A cell extended from 8 to 16 questions beside one of 8 (its first 8 are the same prompts): the pair
    is taken on those 8 and says so; the by-distance table shows each column at its own count."""
    from experiment.report import distances
    text = pairs.pairs_table({"long": [1.0] * 16, "short": [0.0] * 8}, list(range(16)))
    assert "| long | short | +100.0 [+100.0, +100.0] | 8 / 0 | McNemar p = 0.00781, the first 8 questions | **separated** | kept |" in text
    base = {"task": "niah_single_2", "eval_length": 1024, "placement": "designed", "needle_distances": ["300", "700"],
            "window": 256}
    long = {**base, "scores": [1.0] * 16, "targets": [300, 700] * 8, "distances": [301, 699] * 8,
            "contexts": list(range(16))}
    short = {**base, **{k: v[:8] for k, v in long.items() if isinstance(v, list) and k != "needle_distances"},
             "scores": [0.0] * 8}
    table = distances.cell_tables(distances.cell_key(long), {"short": short, "long": long})
    assert "16 contexts, 8/16 questions" in table and "| short | 0 [0, 49] (4) | 0 [0, 49] (4) | 0 [0, 32] (8) |" in table
    assert "| long | 100 [68, 100] (8) | 100 [68, 100] (8) | 100 [81, 100] (16) |" in table
    with pytest.raises(ValueError, match="not the first column's"):
        distances.cell_tables(distances.cell_key(long), {"long": long, "other": {**short, "distances": [5] * 8}})


def test_holms_step_down_correction():
    """Holm over m p-values: the i-th smallest (from 0) against 0.05 / (m - i), stopping at the first
    that fails; a p that would pass its own threshold after a failure is kept out too."""
    assert pairs.holm([0.01, 0.04, 0.03, 0.005]) == [True, False, False, True]  # 0.005<0.0125, 0.01<0.0167, 0.03>=0.025
    assert pairs.holm([0.001, 0.02, 0.04]) == [True, True, True]  # 0.001<0.0167, 0.02<0.025, 0.04<0.05
    assert pairs.holm([0.2, 0.001, 0.04]) == [False, True, False]  # 0.04 >= 0.025 stops it: 0.2 kept out as well
    assert pairs.holm([]) == []
    assert pairs.holm_threshold([0.2, 0.001, 0.04], 2) == pytest.approx(0.025)
    # the far-needle table's case (issue 65): 21 pairs, p = 0.039 passes alone but not at its rank
    p_values = [1e-8] * 16 + [0.039, 0.18, 0.375, 0.5, 1.0]
    assert pairs.holm(p_values)[:16] == [True] * 16 and not pairs.holm(p_values)[16]
    assert pairs.holm_threshold(p_values, 16) == pytest.approx(0.05 / 5)


def test_the_pairs_table_keeps_only_the_separations_that_survive_holm():
    """Four methods, six pairs: a 6-to-0 split (p = 0.031) is separated alone, and after Holm over the
    six pairs only where its rank's threshold allows; a table of contexts of several questions tests
    contexts (the sign test), in Holm's family too."""
    strong, weak, none = [1] * 20 + [0] * 4, [1] * 6 + [0] * 18, [0] * 24
    text = pairs.pairs_table({"a": strong, "b": weak, "c": none, "d": none})
    rows = {tuple(r.split(" | ")[:2]): r for r in text.strip().splitlines()[2:]}
    assert "Holm, 6 pairs |" in text.splitlines()[0]
    assert rows[("| a", "b")].endswith("| **separated** | kept |")       # 14 to 0: p = 1.2e-4, third smallest
    assert rows[("| b", "c")].endswith("| **separated** | not kept (threshold 0.017) |")  # 6 to 0: 0.031 > 0.05 / 3
    assert rows[("| b", "d")].endswith("| **separated** | not kept (threshold 0.025) |")  # the same p, after it
    assert rows[("| c", "d")].endswith("| not separated |  |")
    clustered = pairs.pairs_table({"a": [1.0] * 8, "b": [0.0] * 8}, [0, 0, 1, 1, 2, 2, 3, 3])
    assert clustered.splitlines()[0].endswith("Holm, 1 pairs |") and "4 / 0: p = 0.125 | not separated |" in clustered


def test_a_scores_interval_counts_prompts_that_share_text_as_one():
    """Eight prompts, one question each, whose stretches form two groups of four: the by-distance
    interval is Wilson's over 2 (8 of 8 right: [34, 100], not the [68, 100] of 8 independent prompts);
    where no two share text it is Wilson's over the prompts."""
    from experiment.report import distances
    base = {"task": "niah_single_2", "eval_length": 1024, "placement": "designed", "needle_distances": ["300"],
            "window": 256, "scores": [1.0] * 8, "targets": [300] * 8, "distances": [301] * 8,
            "contexts": list(range(8)), "haystack_words": 1000}
    shared = {**base, "spans": [[0, 60], [30, 60], [60, 60], [90, 60], [500, 60], [530, 60], [560, 60], [590, 60]]}
    table = distances.cell_tables(distances.cell_key(shared), {"a": shared, "b": {**shared, "scores": [0.0] * 8}})
    assert "share text in 2 groups" in table and "| a | 100 [34, 100] (8) | 100 [34, 100] (8) |" in table
    apart = {**base, "spans": [[100 * i, 60] for i in range(8)]}
    table = distances.cell_tables(distances.cell_key(apart), {"a": apart, "b": {**apart, "scores": [0.0] * 8}})
    assert "| a | 100 [68, 100] (8) | 100 [68, 100] (8) |" in table
