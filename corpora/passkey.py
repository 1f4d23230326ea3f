"""A synthetic retrieval task: a number hidden at a chosen depth in filler text, asked for at the end
(the passkey task of Mohtashami & Jaggi 2023, "Landmark Attention"), in a compact form that a small
byte-level model trained at L = 64 can learn:

     the sky is blue. here we go. key 4821. the grass is green. the sun is yellow. key 4821
     `-- filler ---------------' `- key -'  `-- filler -----------------------------' `query'

The key sentence and the final query share their lead (" key"), so answering is an induction (copy)
task: find the earlier " key", copy the digits after it. The answer digits are the last tokens of
the example; a model answers by predicting them after the final cue.

Every example is built at token level from separately encoded pieces (filler sentences, cue,
digits, end of sentence), so every tokenizer gets exactly `length + 1` tokens and the key at exactly
`round(depth * usable span)` (usable span = the filler tokens there are). The filler on each side
of the key is the tail of a deterministically shuffled stream of whole sentences: the window starts
mid-sentence (as a random training window does) and the key sentence and the query each follow a
complete sentence.

Tokenizers:
- byte, bpe: the text above (pieces begin with a space, GPT-2 style, so BPE gets its usual " the",
  " 4821" pre-tokens). BPE may merge digits: the answer is then however many tokens " 4821"
  encodes to, the same in the key sentence and the query (the same tokens by construction).
- word: whitespace words, the period its own word ("the sky is blue ."), each digit its own word.
  Digits are the words "0" .. "9" where the vocabulary has all ten (WikiText-103 has), else
  "zero" .. "nine" where it has those; the cue word "key" must be in the vocabulary too. Otherwise
  the example is refused with a PasskeyError naming the missing words: an unknown word would become
  `<unk>` and the task unanswerable. Filler sentences with a word the vocabulary lacks are left out
  (the builtin python_docs vocabulary has no "grass"); if none is left, PasskeyError.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Sequence

import numpy as np

# The filler sentences of Mohtashami & Jaggi (2023), lower-cased.
FILLER = ("the grass is green.", "the sky is blue.", "the sun is yellow.", "here we go.", "there and back again.")
CUE = "key"
DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DEFAULT_DIGITS = 4
# Entropy tags for the random streams (so that they do not collide with corpora.train_batch's).
_KEY_STREAM, _FILLER_STREAM, _MIX_STREAM, _BATCH_STREAM = 0x6B6579, 0x66696C, 0x6D6978, 0x626174


class PasskeyError(ValueError):
    """The passkey task cannot be built as asked (length too short, words not in the vocabulary)."""


@dataclasses.dataclass(frozen=True)
class PasskeyExample:
    """One example: `tokens` (length + 1, int32) is a training window: inputs = tokens[:-1],
    targets = tokens[1:]. `answer_positions` index targets (the last ones); `key_position` indexes
    tokens (where the key sentence's cue starts)."""
    tokens: np.ndarray
    answer_positions: np.ndarray
    answer: str
    key_position: int
    depth: float
    distance: str | None = None  # the distance asked (e.g. "1.25w") where the key was placed by design

    @property
    def inputs(self) -> np.ndarray:
        return self.tokens[:-1]

    @property
    def targets(self) -> np.ndarray:
        return self.tokens[1:]


@dataclasses.dataclass(frozen=True)
class PasskeyBatch:
    """N examples of one length, depth-major (all examples of depths[0] first). `answer_mask` marks
    the answer positions of `targets`. Example i of every depth has the same key (paired cells)."""
    inputs: np.ndarray        # N x L int32
    targets: np.ndarray       # N x L int32
    answer_mask: np.ndarray   # N x L bool
    depths: np.ndarray        # N float
    key_positions: np.ndarray  # N int
    answers: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.inputs)


@dataclasses.dataclass(frozen=True)
class _Format:
    """A tokenizer's encoded pieces."""
    sentences: tuple[np.ndarray, ...]
    cue: np.ndarray
    end: np.ndarray
    digit_words: tuple[str, ...] | None  # word tokenizers: how digits are spelled; None: one number
    kind: str


_FORMATS: "weakref.WeakKeyDictionary[object, _Format]" = weakref.WeakKeyDictionary()


def _encode(tokenizer, text: str) -> np.ndarray:
    """The tokens of `text` alone (without the end-of-line token encode_lines appends)."""
    return np.asarray(tokenizer.encode_lines([text])[:-1], dtype=np.int32)


def _format(tokenizer) -> _Format:
    try:
        return _FORMATS[tokenizer]
    except (KeyError, TypeError):
        pass
    kind = getattr(tokenizer, "kind", "")
    if kind == "word":
        fmt = _word_format(tokenizer)
    else:
        fmt = _Format(sentences=tuple(_encode(tokenizer, " " + s) for s in FILLER),
                      cue=_encode(tokenizer, " " + CUE), end=_encode(tokenizer, "."), digit_words=None, kind=kind)
    try:
        _FORMATS[tokenizer] = fmt
    except TypeError:  # not weak-referenceable: encode each time
        pass
    return fmt


def _word_format(tokenizer) -> _Format:
    vocab = tokenizer.index
    missing = lambda words: [w for w in words if w not in vocab]
    digits = next((spelling for spelling in (tuple(map(str, range(10))), DIGIT_WORDS) if not missing(spelling)), None)
    problems = []
    if digits is None:
        problems.append(f"the digits (neither '0'..'9' nor 'zero'..'nine' are all words of it; missing "
                        f"{missing(map(str, range(10)))} and {missing(DIGIT_WORDS)})")
    if missing([CUE, "."]):
        problems.append(f"the cue words {missing([CUE, '.'])}")
    sentences = [s.replace(".", " .") for s in FILLER]
    sentences = [s for s in sentences if not missing(s.split())]
    if not sentences:
        problems.append(f"any of the filler sentences {list(FILLER)}")
    if problems:
        raise PasskeyError(f"the word vocabulary ({tokenizer.vocab_size} words) lacks {'; '.join(problems)}, so the "
                           f"passkey task cannot be written with it (unknown words would become <unk>); use a "
                           f"vocabulary from a corpus that has them (WikiText-103 has all), or a byte / bpe tokenizer")
    return _Format(sentences=tuple(_encode(tokenizer, s) for s in sentences), cue=_encode(tokenizer, CUE),
                   end=_encode(tokenizer, "."), digit_words=digits, kind="word")


def _answer_pieces(fmt: _Format, tokenizer, answer: str) -> tuple[np.ndarray, np.ndarray]:
    """(cue tokens, answer tokens) for this answer: tokens of the digits piece that are only
    whitespace (the byte tokenizer's space after "key") belong to the cue, not to the answer."""
    if fmt.digit_words is not None:
        return fmt.cue, _encode(tokenizer, " ".join(fmt.digit_words[int(c)] for c in answer))
    tokens = _encode(tokenizer, " " + answer)
    lead = 0
    while lead < len(tokens) - 1 and not tokenizer.decode(tokens[lead:lead + 1]).strip():
        lead += 1
    return np.concatenate([fmt.cue, tokens[:lead]]), tokens[lead:]


def _tail(rng: np.random.Generator, sentences: Sequence[np.ndarray], n: int) -> np.ndarray:
    """The last n tokens of a shuffled stream of whole sentences (ends at a sentence boundary)."""
    if n <= 0:
        return np.zeros(0, np.int32)
    parts, total = [], 0
    while total < n:
        for i in rng.permutation(len(sentences)):
            parts.append(sentences[i])
            total += len(sentences[i])
            if total >= n:
                break
    parts.reverse()  # the first drawn sentence sits right before the key / query
    return np.concatenate(parts)[-n:]


def _depth_code(depth: float) -> int:
    return int(round(float(depth) * (1 << 20)))


def passkey_example(tokenizer, length: int, depth: float, seed: int, digits: int = DEFAULT_DIGITS) -> PasskeyExample:
    """One example of exactly `length + 1` tokens with a `digits`-digit key at `depth` (0: the key
    sentence starts at token 0; 1: it ends right before the final query). Deterministic given
    (tokenizer, seed, length, depth, digits); the key itself depends on (seed, digits) only, so
    the same seed asks for the same number at every length and depth."""
    if not 0.0 <= depth <= 1.0:
        raise PasskeyError(f"depth must be in [0, 1], got {depth}")
    if digits < 1:
        raise PasskeyError(f"digits must be >= 1, got {digits}")
    fmt = _format(tokenizer)
    key_rng = np.random.default_rng([_KEY_STREAM, int(seed) & (2**64 - 1), digits])
    answer = "".join(str(d) for d in key_rng.integers(0, 10, size=digits))
    cue, ans = _answer_pieces(fmt, tokenizer, answer)
    key_sentence = np.concatenate([cue, ans, fmt.end])
    query = np.concatenate([cue, ans])
    span = length + 1 - len(key_sentence) - len(query)
    if span < 0:
        raise PasskeyError(f"a passkey example with {digits} digits needs length >= {length - span} "
                           f"{fmt.kind or 'token'} tokens, got {length}; use a longer length or fewer digits "
                           f"(data.passkey_digits)")
    key_position = int(round(depth * span))
    rng = np.random.default_rng([_FILLER_STREAM, int(seed) & (2**64 - 1), length, _depth_code(depth), digits])
    before = _tail(rng, fmt.sentences, key_position)
    after = _tail(rng, fmt.sentences, span - key_position)
    tokens = np.concatenate([before, key_sentence, after, query]).astype(np.int32)
    assert len(tokens) == length + 1, (len(tokens), length)
    answer_positions = np.arange(length - len(ans), length)
    return PasskeyExample(tokens=tokens, answer_positions=answer_positions, answer=answer,
                          key_position=key_position, depth=float(depth))


def example_seed(seed: int, index: int) -> int:
    """The seed of example `index` of an evaluation set drawn with `seed`."""
    return int(np.random.SeedSequence([_BATCH_STREAM, int(seed) & (2**64 - 1), index]).generate_state(1, np.uint64)[0])


def passkey_batch(tokenizer, length: int, depths: float | Sequence[float], count: int, seed: int,
                  digits: int = DEFAULT_DIGITS) -> PasskeyBatch:
    """`count` examples at each depth (depth-major); example i has the same key at every depth and
    length (seed example_seed(seed, i)), so cells differ by where the key is, not which key."""
    depths = [float(d) for d in np.atleast_1d(depths)]
    examples = [passkey_example(tokenizer, length, d, example_seed(seed, i), digits)
                for d in depths for i in range(count)]
    tokens = np.stack([e.tokens for e in examples]) if examples else np.zeros((0, length + 1), np.int32)
    mask = np.zeros((len(examples), length), bool)
    for row, e in enumerate(examples):
        mask[row, e.answer_positions] = True
    return PasskeyBatch(inputs=tokens[:, :-1], targets=tokens[:, 1:], answer_mask=mask,
                        depths=np.array([e.depth for e in examples]),
                        key_positions=np.array([e.key_position for e in examples]),
                        answers=tuple(e.answer for e in examples))


def _global_rows(rows: slice, local: int) -> np.ndarray:
    start, step = rows.start or 0, rows.step or 1
    if start < 0 or step < 1:
        raise ValueError(f"rows must be a forward slice of the global batch with a non-negative start, got {rows}")
    return start + step * np.arange(local)


def passkey_rows(global_rows: np.ndarray, fraction: float, step: int, seed: int) -> list[tuple[int, float, int]]:
    """[(global row, depth, example seed)] for the rows a training batch replaces: each row decides
    alone from (seed, step, row), so the choice does not depend on how the batch is split."""
    chosen = []
    if fraction <= 0:
        return chosen
    for row in global_rows:
        rng = np.random.default_rng([_MIX_STREAM, int(seed) & (2**64 - 1), int(step), int(row)])
        if rng.random() < fraction:
            chosen.append((int(row), float(rng.random()), int(rng.integers(0, 2**63 - 1))))
    return chosen


def mix_passkey(inputs_BxL: np.ndarray, targets_BxL: np.ndarray, tokenizer, fraction: float, step: int, seed: int,
                digits: int = DEFAULT_DIGITS, rows: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
    """A training batch (corpora.train_batch's output for `rows` of the global batch) with about
    `fraction` of its rows replaced by passkey examples of the same length at uniform random depths.
    Which rows, and what each holds, is a function of (seed, step, global row index) alone, so a
    resumed run sees the same batches and every host agrees however the batch is split. Returns
    new arrays; the inputs are not modified."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"data.passkey_fraction must be in [0, 1], got {fraction}")
    if fraction == 0:
        return inputs_BxL, targets_BxL
    inputs, targets = np.array(inputs_BxL, copy=True), np.array(targets_BxL, copy=True)
    length = inputs.shape[1]
    global_rows = _global_rows(rows, len(inputs))
    first = int(global_rows[0]) if len(global_rows) else 0
    stride = rows.step or 1
    for row, depth, example_seed_ in passkey_rows(global_rows, fraction, step, seed):
        tokens = passkey_example(tokenizer, length, depth, example_seed_, digits).tokens
        local = (row - first) // stride
        inputs[local], targets[local] = tokens[:-1], tokens[1:]
    return inputs, targets


# --- the instructed form: a real model's prompt, its answer generated ------------------------------------

INSTRUCTION = ("Somewhere in the long text below, among sentences that repeat, there is a passkey: a number. "
               "Read all of the text and remember the passkey, because you will be asked for it at the end.")
KEY_SENTENCE = " The passkey is {key}. Remember it: {key} is the passkey."
QUESTION = " What is the passkey? The passkey is"
ASK, ANSWER_PREFIX = " What is the passkey?", "The passkey is"  # the question split by a chat frame
INSTRUCTED_DIGITS = 5


@dataclasses.dataclass(frozen=True)
class ChatFrame:
    """A chat template's tokens around one user message: `head` (up to the message), `tail` (from its
    end to where the assistant's answer begins). A prompt in the frame is head, the instruction,
    filler and key, the question (ASK), tail, then ANSWER_PREFIX, which the answer continues."""
    head: np.ndarray
    tail: np.ndarray


@dataclasses.dataclass(frozen=True)
class PromptedExample:
    """One prompt of the instructed form: `ids` (its tokens), the `answer` the model should generate,
    `key_position` (the token where the key sentence starts: never 0, the instruction comes first)."""
    ids: np.ndarray
    answer: str
    key_position: int
    depth: float
    distance: str | None = None  # the distance asked (e.g. "1.25w") where the key was placed by design


def _instructed_pieces(tokenizer, frame: ChatFrame | None = None
                       ) -> tuple[np.ndarray, tuple[np.ndarray, ...], np.ndarray]:
    """(what comes before the filler, the filler sentences, what comes after it): the instruction and
    the question, in `frame` where one is given."""
    if getattr(tokenizer, "kind", "") == "word":
        raise PasskeyError("the instructed passkey is written for a byte, BPE or pretrained tokenizer (a word "
                           "vocabulary would turn its words into <unk>); use --passkey_form compact for this run")
    sentences = tuple(_encode(tokenizer, " " + s[0].upper() + s[1:]) for s in FILLER)
    if frame is None:
        return _encode(tokenizer, INSTRUCTION), sentences, _encode(tokenizer, QUESTION)
    before = np.concatenate([np.asarray(frame.head, np.int32), _encode(tokenizer, INSTRUCTION)])
    after = np.concatenate([_encode(tokenizer, ASK), np.asarray(frame.tail, np.int32),
                            _encode(tokenizer, ANSWER_PREFIX)])
    return before, sentences, after


def _whole(rng: np.random.Generator, sentences: Sequence[np.ndarray], n: int) -> np.ndarray:
    """n tokens of whole filler sentences in a random order, where their lengths can sum to n (two
    sentences of coprime lengths reach every n past a small bound); else the tail of a shuffled
    stream (`_tail`: its first sentence cut)."""
    lengths = [len(s) for s in sentences]
    parts, left, bound = [], n, max(lengths) ** 2
    while left > bound:
        for i in rng.permutation(len(sentences)):
            if left <= bound:
                break
            parts.append(int(i))
            left -= lengths[i]
    ends = {0: -1}  # a sum reachable with whole sentences -> the last sentence of one way to reach it
    for total in range(1, left + 1):
        last = next((int(i) for i in rng.permutation(len(sentences)) if total - lengths[i] in ends), None)
        if last is not None:
            ends[total] = last
    if left not in ends:
        return _tail(rng, sentences, n)
    while left:
        parts.append(ends[left])
        left -= lengths[ends[left]]
    order = rng.permutation(len(parts))
    return np.concatenate([sentences[parts[i]] for i in order]) if parts else np.zeros(0, np.int32)


def instructed_example(tokenizer, length: int, depth: float, seed: int,
                       digits: int = INSTRUCTED_DIGITS, frame: ChatFrame | None = None) -> PromptedExample:
    """A prompt of exactly `length` tokens: the instruction, filler sentences with the key sentence at
    `depth` of the filler (0: right after the instruction; 1: right before the question), then the
    question, which the model answers by generating the key ("The passkey is" -> " 48213."). The
    prompts of Mohtashami & Jaggi (2023) and LongLM (Jin et al. 2024) are of this shape; the words are
    ours. The key depends on (seed, digits) alone, as the compact form's does. With a chat `frame` the
    instruction, filler and question are the user's message and the answer prefix follows the
    assistant's turn (ChatFrame); the key is the frameless prompt's."""
    if not 0.0 <= depth <= 1.0 or digits < 1:
        raise PasskeyError(f"depth must be in [0, 1] and digits >= 1, got {depth} and {digits}")
    instruction, sentences, question = _instructed_pieces(tokenizer, frame)
    answer, key_sentence = _instructed_key(tokenizer, seed, digits)
    span = length - len(instruction) - len(key_sentence) - len(question)
    if span < 0:
        raise PasskeyError(f"an instructed passkey prompt needs >= {length - span} tokens, got {length}")
    at = int(round(depth * span))
    rng = np.random.default_rng([_FILLER_STREAM, int(seed) & (2**64 - 1), length, _depth_code(depth), digits, 1])
    before, after = _whole(rng, sentences, at), _whole(rng, sentences, span - at)
    ids = np.concatenate([instruction, before, key_sentence, after, question]).astype(np.int32)
    assert len(ids) == length, (len(ids), length)
    return PromptedExample(ids, answer, len(instruction) + at, float(depth))


def _instructed_key(tokenizer, seed: int, digits: int) -> tuple[str, np.ndarray]:
    """(the key of (seed, digits), the key sentence's ids)."""
    key_rng = np.random.default_rng([_KEY_STREAM, int(seed) & (2**64 - 1), digits])
    answer = str(key_rng.integers(1, 10)) + "".join(str(d) for d in key_rng.integers(0, 10, size=digits - 1))
    return answer, _encode(tokenizer, KEY_SENTENCE.format(key=answer))


def instructed_minimum(tokenizer, seed: int, digits: int = INSTRUCTED_DIGITS, frame: ChatFrame | None = None) -> int:
    """The fewest tokens an instructed prompt of (seed, digits) takes: its instruction, key sentence and
    question, with no filler."""
    instruction, _, question = _instructed_pieces(tokenizer, frame)
    return len(instruction) + len(_instructed_key(tokenizer, seed, digits)[1]) + len(question)


def instructed_at_distance(tokenizer, length: int, distance: int, seed: int, digits: int = INSTRUCTED_DIGITS,
                           frame: ChatFrame | None = None) -> PromptedExample:
    """`instructed_example` with its key sentence beginning `distance` tokens before the prompt's end
    (`length` - key_position == distance): the needle placed by design, not by a fraction of the filler.
    Its `depth` is the fraction of the filler before the key that this gives."""
    instruction, _, question = _instructed_pieces(tokenizer, frame)
    _, key_sentence = _instructed_key(tokenizer, seed, digits)
    span = length - len(instruction) - len(key_sentence) - len(question)
    at = length - distance - len(instruction)  # filler tokens before the key sentence
    nearest, farthest = len(key_sentence) + len(question), length - len(instruction)
    if span < 0 or not 0 <= at <= span:
        raise PasskeyError(f"a key {distance:,} tokens from the end of a {length:,}-token prompt: it can sit "
                           f"{nearest:,} to {farthest:,} tokens from the end")
    return instructed_example(tokenizer, length, at / span if span else 0.0, seed, digits, frame)


def instructed_batch(tokenizer, length: int, depths: float | Sequence[float], count: int, seed: int,
                     digits: int = INSTRUCTED_DIGITS, frame: ChatFrame | None = None) -> list[PromptedExample]:
    """`count` prompts at each depth (depth-major); prompt i has the same key at every depth and length."""
    return [instructed_example(tokenizer, length, float(d), example_seed(seed, i), digits, frame)
            for d in np.atleast_1d(depths) for i in range(count)]


def answer_tokens(digits: int) -> int:
    """The new tokens a generated answer may take (an evaluation length holds the prompt and these): a
    space, the digits, a period, and slack."""
    return digits + 4


def generated_answer(text: str) -> str:
    """The number a generated text gives: its first run of digits ('' where it has none)."""
    digits = ""
    for char in text:
        if char.isdigit():
            digits += char
        elif digits:
            break
    return digits
