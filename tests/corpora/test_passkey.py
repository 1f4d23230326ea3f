"""The passkey retrieval task's data: examples, batches, refusals and the training mix (corpora.passkey).
The fixture `tokenizers` is in tests/conftest.py (tests/test_passkey.py uses it too)."""
import numpy as np
import pytest

import corpora
from corpora import passkey as pk


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
    need = 18  # the shortest byte example: the key sentence and the question with no filler
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


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_instructed_prompt_has_exact_length_an_instruction_first_and_whole_sentences(tokenizers, kind):
    tok = tokenizers[kind]
    instruction = pk._encode(tok, pk.INSTRUCTION)
    for length, depth in ((800, 0.0), (801, 0.2), (900, 0.5), (1000, 0.8), (800, 1.0)):  # spans of >= ~100 tokens
        e = pk.instructed_example(tok, length, depth, seed=4)
        assert len(e.ids) == length and e.key_position >= len(instruction) > 0  # no key at token 0
        np.testing.assert_array_equal(e.ids[:len(instruction)], instruction)
        key = pk._encode(tok, pk.KEY_SENTENCE.format(key=e.answer))
        np.testing.assert_array_equal(e.ids[e.key_position:e.key_position + len(key)], key)
        text = tok.decode(e.ids)
        assert text.endswith(pk.QUESTION) and len(e.answer) == 5 and e.answer[0] != "0"
        filler = text[len(pk.INSTRUCTION):-len(pk.QUESTION)].replace(pk.KEY_SENTENCE.format(key=e.answer), "")
        sentences = {" " + s[0].upper() + s[1:] for s in pk.FILLER}
        assert filler.replace(".", ".|").split("|")[:-1] and all(
            s in sentences for s in filler.replace(".", ".|").split("|")[:-1])  # whole sentences only
        span = length - len(instruction) - len(key) - len(pk._encode(tok, pk.QUESTION))
        assert e.key_position - len(instruction) == round(depth * span)
    same = [pk.instructed_example(tok, n, d, seed=4).answer for n, d in ((300, 0.0), (500, 0.7))]
    assert same[0] == same[1]  # one key per seed, at every length and depth


def test_instructed_prompt_refuses_a_word_vocabulary_and_a_short_length(tokenizers):
    with pytest.raises(pk.PasskeyError, match="--passkey_form compact"):
        pk.instructed_example(tokenizers["word"], 300, 0.5, 1)
    with pytest.raises(pk.PasskeyError, match="prompt needs >= "):
        pk.instructed_example(tokenizers["byte"], 100, 0.5, 1)


def test_the_generated_answer_is_the_first_number():
    assert pk.generated_answer(" 48213. The pass") == "48213"
    assert pk.generated_answer(" is 4821 or 48213") == "4821"
    assert pk.generated_answer(" I do not know") == ""


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_instructed_prompt_in_a_chat_frame_keeps_its_length_key_and_order(tokenizers, kind):
    tok = tokenizers[kind]
    frame = pk.ChatFrame(pk._encode(tok, "<user>"), pk._encode(tok, "</user><bot>"))
    plain = pk.instructed_example(tok, 900, 0.4, seed=7)
    framed = pk.instructed_example(tok, 900, 0.4, seed=7, frame=frame)
    assert len(framed.ids) == 900 and framed.answer == plain.answer  # the same key, the same length
    text = tok.decode(framed.ids)
    assert text.startswith("<user>" + pk.INSTRUCTION)
    assert text.endswith(pk.ASK + "</user><bot>" + pk.ANSWER_PREFIX)
    key = pk._encode(tok, pk.KEY_SENTENCE.format(key=framed.answer))
    np.testing.assert_array_equal(framed.ids[framed.key_position:framed.key_position + len(key)], key)
    head = len(frame.head) + len(pk._encode(tok, pk.INSTRUCTION))
    span = 900 - head - len(key) - (len(pk._encode(tok, pk.ASK)) + len(frame.tail) + len(pk._encode(tok, pk.ANSWER_PREFIX)))
    assert framed.key_position - head == round(0.4 * span)  # the depth measured in the filler, as without a frame
