"""The passkey retrieval task: its examples, the training mix, the scorer, evaluation and report."""
import json

import numpy as np
import pytest

import corpora
from corpora import passkey as pk

WORDS = ["the grass is green . the sky is blue . the sun is yellow . here we go . there and back again .",
         "key 0 1 2 3 4 5 6 7 8 9"]


@pytest.fixture(scope="module")
def tokenizers():
    lines = [" ".join(WORDS).replace(" .", "."), "a key 1234 and 98 of 7650 words", "the quick brown fox"] * 20
    return {"byte": corpora.ByteTokenizer(),
            "word": corpora.WordTokenizer.from_lines(WORDS),
            "bpe": corpora.BPETokenizer.train(lines, 300)}


def cue_starts(tokenizer, tokens):
    """Where the cue's tokens occur in `tokens`."""
    cue = pk._format(tokenizer).cue
    return [i for i in range(len(tokens) - len(cue) + 1) if (tokens[i:i + len(cue)] == cue).all()]


@pytest.mark.parametrize("kind", ["byte", "word", "bpe"])
@pytest.mark.parametrize("length", [64, 150])
def test_key_sits_at_the_requested_depth_in_exactly_length_plus_one_tokens(tokenizers, kind, length):
    tok = tokenizers[kind]
    sentence = max(len(s) for s in pk._format(tok).sentences)
    for depth in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0):
        e = pk.passkey_example(tok, length, depth, seed=3)
        assert e.tokens.shape == (length + 1,) and e.tokens.dtype == np.int32
        assert e.answer_positions[-1] == length - 1  # the answer ends the example
        first, last = cue_starts(tok, e.tokens)  # the cue appears exactly twice: key sentence and question
        query = e.tokens[last:]
        text = tok.decode(e.targets[e.answer_positions]).replace(" ", "")
        assert text == e.answer
        assert len(e.answer) == 4 and e.answer.isdigit()
        # the key sentence (the question's tokens, then the end of sentence) starts at key_position
        end = pk._format(tok).end
        assert first == e.key_position
        np.testing.assert_array_equal(e.tokens[e.key_position:e.key_position + len(query)], query)
        np.testing.assert_array_equal(e.tokens[e.key_position + len(query):e.key_position + len(query) + len(end)], end)
        span = length + 1 - (2 * len(query) + len(end))
        assert abs(e.key_position - depth * span) <= sentence
        assert abs(e.key_position - depth * span) <= 0.5  # in fact token-exact
    assert pk.passkey_example(tok, length, 0.0, 3).key_position == 0
    last = pk.passkey_example(tok, length, 1.0, 3)
    assert last.key_position + 2 * len(query) + len(end) == length + 1  # right before the question


def test_same_seed_same_tokens_other_seed_other_key(tokenizers):
    tok = tokenizers["byte"]
    a, b = pk.passkey_example(tok, 128, 0.4, 11), pk.passkey_example(tok, 128, 0.4, 11)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert a.answer == b.answer and a.key_position == b.key_position
    keys = {pk.passkey_example(tok, 128, 0.4, s).answer for s in range(20)}
    assert len(keys) >= 18
    assert pk.passkey_example(tok, 128, 0.4, 11, digits=6).answer != a.answer and len(
        pk.passkey_example(tok, 128, 0.4, 11, digits=6).answer) == 6
    # the key depends on the seed only: the same number at another length and depth
    assert pk.passkey_example(tok, 512, 0.9, 11).answer == a.answer


def test_batch_is_depth_major_with_paired_keys(tokenizers):
    batch = pk.passkey_batch(tokenizers["byte"], 96, (0.0, 0.5, 1.0), 4, seed=5)
    assert batch.inputs.shape == batch.targets.shape == batch.answer_mask.shape == (12, 96)
    assert batch.depths.tolist() == [0.0] * 4 + [0.5] * 4 + [1.0] * 4
    assert batch.answers[:4] == batch.answers[4:8] == batch.answers[8:]
    assert len(set(batch.answers[:4])) == 4
    assert (batch.answer_mask.sum(1) == 4).all() and batch.answer_mask[:, -4:].all()
    np.testing.assert_array_equal(batch.inputs[:, 1:], batch.targets[:, :-1])


def test_refusals_are_clear(tokenizers):
    tok = tokenizers["byte"]
    need = pk.min_length(tok)
    assert need == 18
    pk.passkey_example(tok, need, 0.5, 0)
    with pytest.raises(pk.PasskeyError, match="length >= 18.*passkey_digits"):
        pk.passkey_example(tok, need - 1, 0.5, 0)
    with pytest.raises(pk.PasskeyError, match="depth"):
        pk.passkey_example(tok, 64, 1.5, 0)
    no_digits = corpora.WordTokenizer.from_lines(["the sky is blue . key here we go ."])
    with pytest.raises(pk.PasskeyError, match="lacks the digits.*byte / bpe"):
        pk.passkey_example(no_digits, 64, 0.5, 0)
    spelled = corpora.WordTokenizer.from_lines(["here we go . key " + " ".join(pk.DIGIT_WORDS)])
    e = pk.passkey_example(spelled, 40, 0.5, 0)  # digits as words; filler from the sentences it can write
    assert spelled.decode(e.targets[e.answer_positions]).split() == [pk.DIGIT_WORDS[int(c)] for c in e.answer]
    assert set(spelled.decode(e.tokens).split()) <= {"here", "we", "go", ".", "key", *pk.DIGIT_WORDS}


def test_mix_replaces_about_fraction_of_rows_however_the_batch_is_split(tokenizers):
    tok = tokenizers["byte"]
    stream = tok.encode_lines(["some ordinary training text, with no cue word in it at all."] * 200)
    B, L = 400, 64
    inputs, targets = corpora.train_batch(stream, 7, B, L, seed=0)
    mixed_in, mixed_tg = pk.mix_passkey(inputs, targets, tok, 0.25, step=7, seed=0)
    replaced = (mixed_in != inputs).any(1)
    assert 0.18 < replaced.mean() < 0.32
    assert (inputs == corpora.train_batch(stream, 7, B, L, seed=0)[0]).all()  # not modified in place
    for row in np.flatnonzero(replaced):
        assert tok.decode(mixed_in[row]).count("key") == 2  # the key sentence and the question
        np.testing.assert_array_equal(mixed_in[row, 1:], mixed_tg[row, :-1])
    halves = [pk.mix_passkey(*corpora.train_batch(stream, 7, B, L, seed=0, rows=r), tok, 0.25, step=7, seed=0, rows=r)
              for r in (slice(0, 150), slice(150, B))]
    np.testing.assert_array_equal(np.concatenate([h[0] for h in halves]), mixed_in)
    np.testing.assert_array_equal(np.concatenate([h[1] for h in halves]), mixed_tg)
    other = pk.mix_passkey(inputs, targets, tok, 0.25, step=8, seed=0)[0]
    assert ((other != inputs).any(1) != replaced).any()  # another step, other rows
    assert pk.mix_passkey(inputs, targets, tok, 0.0, step=7, seed=0)[0] is inputs


def test_scorer_gives_an_oracle_one_and_a_context_blind_model_chance(tokenizers):
    from experiment.passkey import cell_records, score_examples
    tok = tokenizers["byte"]
    batch = pk.passkey_batch(tok, 80, (0.0, 0.5, 1.0), 10, seed=1)
    eye = np.eye(tok.vocab_size, dtype=np.float32)
    oracle = lambda inputs, rows: eye[batch.targets[rows]]
    for size in (None, 7):  # padded last call included
        scores = score_examples(oracle, batch, size)
        assert scores.exact.all() and (scores.token_accuracy == 1).all()
    digit = eye[ord("5")]
    blind = lambda inputs, rows: np.broadcast_to(digit, (*inputs.shape, tok.vocab_size))
    scores = score_examples(blind, batch, 4)
    assert scores.exact.mean() == 0.0  # chance for 4 digits is 1e-4
    # argmax ids are accepted as well; one wrong answer digit makes the example wrong
    wrong_last = lambda inputs, rows: np.where(np.arange(80) == 79, 0, batch.targets[rows])
    scores = score_examples(wrong_last, batch)
    assert not scores.exact.any() and np.allclose(scores.token_accuracy, 0.75)
    records = cell_records(batch, score_examples(oracle, batch), 80, step=3)
    assert [(r["depth"], r["accuracy"], r["count"], r["step"]) for r in records] == [
        (0.0, 1.0, 10, 3), (0.5, 1.0, 10, 3), (1.0, 1.0, 10, 3)]


def test_evaluate_passkey_end_to_end_and_report(tmp_path):
    from experiment import train
    from experiment.passkey import evaluate_passkey, load_passkey_results
    from experiment.passkey_report import passkey_table, write_passkey_report
    from tests.conftest import tiny_config
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid"):  # a local folder loads faster than the built-in corpus
        (data / f"{split}.txt").write_text("the grass is green. the sky is blue. here we go.\n" * 100)
    config = tiny_config("alibi")
    config.data.update(dict(source="local", path=str(data)))
    config.train.steps = 2
    run = tmp_path / "run"
    train(config, run)
    records = evaluate_passkey(run, [32, 64], depths=(0.0, 1.0), per_cell=3)
    assert [(r["eval_length"], r["depth"]) for r in records] == [(32, 0.0), (32, 1.0), (64, 0.0), (64, 1.0)]
    for r in records:
        assert r["task"] == "passkey" and 0.0 <= r["accuracy"] <= 1.0 and r["count"] == 3
        assert r["step"] == 2 and r["digits"] == 4 and r["scheme"] == "alibi" and r["train_length"] == 16
    assert load_passkey_results(run) == records
    again = evaluate_passkey(run, [64], depths=(0.5,), per_cell=2, digits=2)  # merged beside the others
    saved = load_passkey_results(run)
    assert len(saved) == 5 and again[0] in saved
    json.loads((run / "eval" / "passkey.json").read_text())
    with pytest.raises(pk.PasskeyError, match="length >= 18"):
        evaluate_passkey(run, [16])
    out = write_passkey_report([run], tmp_path / "report")
    assert all((tmp_path / "report" / name).stat().st_size > 0 for name in ("passkey_vs_length.png", "passkey.md"))
    assert len(out["heatmaps"]) == 2  # 4 and 2 digits
    table = passkey_table([("alibi", records)])
    assert "| 32 |" in table and "| depth | 32 | 64 |" in table
