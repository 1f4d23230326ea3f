"""corpora/ruler/: RULER's tasks built to a target length in a model's tokens, with RULER's text,
question placement and score (the tiny Llama fixture's byte-level BPE tokenizer stands in for a
model's; a made-up book stands in for corpora/books.py's)."""
import itertools
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from corpora import ruler
from corpora.ruler import aggregation, haystacks, words
from corpora.ruler.prompt import Example, Prompter, RulerError, fit

FIXTURE = Path(__file__).parents[1] / "fixtures" / "hf_tiny" / "llama" / "tokenizer.json"
LENGTH = 8192
CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def prompter():
    tokenizer = Tokenizer.from_file(str(FIXTURE))
    return Prompter(lambda text, special: tokenizer.encode(text, add_special_tokens=special).ids)


@pytest.fixture(scope="module")
def book():
    """A made-up prose 'book': sentences of varied words, capitalised, as a novel's."""
    vocabulary = words.vocabulary()
    sentences = [" ".join(vocabulary[(7 * i + 3 * j) % len(vocabulary)] for j in range(5 + i % 9)).capitalize() + "."
                 for i in range(3000)]
    return tuple(" ".join(sentences).split())


@pytest.mark.parametrize("name", list(ruler.TASKS))
def test_each_task_prompt_is_within_2_percent_of_its_length_less_the_answer_budget(name, prompter, book):
    task = ruler.task(name)
    budget = LENGTH - task.tokens_to_generate  # RULER's max_seq_length counts the answer's tokens
    (built,) = ruler.build(name, LENGTH, 1, 42, prompter, book=book)
    assert 0.98 * budget <= len(built.ids) <= budget, (name, len(built.ids), budget)
    assert built.ids == prompter.ids(built.example)
    text = prompter.text(built.example)  # the context, then the question on its own line, the answer prefix last
    assert text.endswith(built.example.answer_prefix)
    context, question = text[:-len(built.example.answer_prefix)].rsplit("\n", 1)
    assert re.fullmatch(r"(Question: .*|What (are all|is) the special magic .*)[?.]", question)
    assert all(reference in context for reference in built.example.references)


def test_examples_repeat_for_a_seed_and_do_not_depend_on_how_many_are_asked(prompter):
    one = ruler.build("niah_single_1", 2048, 1, 7, prompter)
    three = ruler.build("niah_single_1", 2048, 3, 7, prompter)
    assert one[0].ids == three[0].ids
    assert ruler.build("niah_single_1", 2048, 1, 8, prompter)[0].ids != one[0].ids
    assert len({b.example.references for b in three}) == 3  # each example draws its own


def test_needles_hold_the_answers_and_single_value_wording_is_rulers(prompter):
    example = ruler.build("niah_single_1", 2048, 1, 1, prompter)[0].example
    (value,) = example.references
    assert re.fullmatch(r"\d{7}", value)
    needles = re.findall(r"One of the special magic numbers for (\S+) is: (\d{7})\.", example.text)
    assert len(needles) == 1 and needles[0][1] == value
    assert example.text.startswith("A special magic number is hidden within the following text.")
    assert example.text.count("The grass is green. The sky is blue.") > 10
    assert example.answer_prefix == f" The special magic number for {needles[0][0]} mentioned in the provided text is"


def test_needle_distances_point_at_each_value_in_the_prompts_tokens(prompter, book):
    tokenizer = Tokenizer.from_file(str(FIXTURE))
    for built in ruler.build("niah_single_1", 2048, 3, 5, prompter):
        (distance,) = ruler.needle_distances(built, prompter)
        (value,) = built.example.references
        assert 0 < distance < len(built.ids)
        assert tokenizer.decode(built.ids[len(built.ids) - distance:]).strip().startswith(value[:4])
    built = ruler.build("niah_multivalue", 4096, 1, 5, prompter, book)[0]
    distances = ruler.needle_distances(built, prompter)
    assert len(distances) == len(built.example.references) == 4
    for distance, value in zip(distances, built.example.references):
        assert tokenizer.decode(built.ids[len(built.ids) - distance:]).strip().startswith(value[:4])
    with pytest.raises(RulerError, match="only the needle tasks"):
        ruler.needle_distances(ruler.build("vt", 2048, 1, 5, prompter)[0], prompter)


def test_multikey_haystacks_are_distractor_needles_with_uuids(prompter):
    example = ruler.build("niah_multikey_3", 4096, 1, 1, prompter)[0].example
    uuid = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
    lines = example.text.split("\n")[1:-1]
    assert len(lines) > 10 and all(re.fullmatch(f"One of the special magic uuids for {uuid} is: {uuid}\\.", line)
                                   for line in lines)
    key = re.search(f"for ({uuid}) mentioned", example.answer_prefix).group(1)
    assert f"for {key} is: {example.references[0]}." in example.text


def test_multivalue_and_multiquery_ask_four_values_in_a_book(prompter, book):
    for name in ("niah_multivalue", "niah_multiquery"):
        example = ruler.build(name, 4096, 1, 3, prompter, book=book)[0].example
        assert len(example.references) == 4 and all(v in example.text for v in example.references)
        assert example.text.startswith("Some special magic numbers are hidden")
        assert example.answer_prefix.endswith("mentioned in the provided text are")
    assert ruler.task("niah_multiquery").label == "niah_multiquery (book haystack)"


def test_vt_chain_with_its_one_shot_example(prompter):
    example = ruler.build("vt", 4096, 1, 5, prompter)[0].example
    names = example.references
    assert len(names) == 5 and all(re.fullmatch("[A-Z]{5}", n) for n in names)
    value = re.search(rf"VAR {names[0]} = (\d{{5}})", example.text).group(1)
    for a, b in zip(names, names[1:]):
        assert f"VAR {b} = VAR {a} " in example.text
    assert f"assigned the value {value}, they are: " in example.answer_prefix
    shot = example.shot
    shot_tokens = len(prompter.encode(shot.text + shot.answer_prefix, True))  # RULER's 500, or the least noise
    assert shot is not None and not shot.turn and (shot_tokens <= 500 or shot.text.count("The grass") == 5)
    shot_names = shot.answer.split()
    assert len(shot_names) == 5 and all(re.fullmatch("[A-Z]{3}", n) for n in shot_names)
    assert prompter.text(example).index(shot.answer) < prompter.text(example).index(example.text)


def test_cwe_lists_ten_words_thirty_times_and_the_others_three(prompter):
    example = ruler.build("cwe", 8192, 1, 2, prompter)[0].example
    listed = Counter(re.findall(r"\d+\. (\w+)", example.text))
    assert {listed[w] for w in example.references} == {30} and len(example.references) == 10
    assert set(listed[w] for w in listed if w not in example.references) == {3}
    assert example.shot.turn and example.shot.answer.startswith("1. ")
    small = ruler.build("cwe", 2048, 1, 2, prompter)[0].example  # below 4k: RULER's shorter lists
    assert {Counter(re.findall(r"\d+\. (\w+)", small.text))[w] for w in small.references} == {6}


def test_fwe_asks_the_three_most_frequent_coded_words_after_the_dots(prompter):
    example = ruler.build("fwe", 4096, 1, 4, prompter)[0].example
    coded = Counter(example.text.split("coded words. ")[1].split("\nQuestion")[0].split())
    ranked = [w for w, _ in coded.most_common()]
    assert ranked[0] == "..." and set(ranked[1:4]) == set(example.references)
    assert all(re.fullmatch("[a-z]{6}", w) for w in example.references)
    assert abs(aggregation.zeta(2.0) - math.pi ** 2 / 6) < 1e-9


def test_chat_prompt_puts_the_answer_prefix_in_the_assistants_turn():
    from models.generation.chat import render
    chat = Prompter(lambda text, special: list(text.encode()), lambda m: render(CHAT, m), "chat")
    example = Example("t", "Read this. Question?", " Answer:", ("x",), 1)
    assert chat.text(example) == "<|user|>Read this. Question?<|end|>\n<|assistant|> Answer:"
    cwe = ruler.build("cwe", 2048, 1, 2, chat)[0].example
    text = chat.text(cwe)  # the one-shot example is a solved turn of its own, as RULER repeats its template
    assert text.count("<|user|>") == 2 and text.index(cwe.shot.answer) < text.rindex("<|user|>")
    with pytest.raises(ValueError, match="needs the model's chat template"):
        Prompter(lambda t, s: [], None, "chat")


def test_fit_takes_the_largest_haystack_that_fits(prompter):
    make = lambda size: Example("t", "x" * size, "", ("x",), size)  # noqa: E731
    plain = Prompter(lambda text, special: list(text))
    for guess in (1, 50, 400, 5000):
        example, ids = fit(make, plain, 300, guess)
        assert example.size == 300 and len(ids) == 300
    with pytest.raises(RulerError, match="evaluate a longer length"):
        ruler.build("niah_single_1", 200, 1, 1, prompter)


def test_score_is_rulers_fraction_of_references_found():
    assert ruler.score(" 1234567.", ["1234567"]) == 1.0
    assert ruler.score("ABC and def\x00", ["abc", "DEF", "ghi", "jkl"]) == 0.5
    assert ruler.score("", ["a"]) == 0.0


def test_kept_words_are_the_books_derivation():
    kept = words.vocabulary()
    assert len(kept) == words.KEEP and list(kept) == sorted(set(kept))
    assert all(w.isalpha() and w.islower() and 4 <= len(w) <= 10 for w in kept)
    made_up = ["".join(letters) for letters in itertools.product("abcde", repeat=4)][:110]
    text = " ".join(w for i, w in enumerate(made_up) for _ in range(200 - i)) + " Berry" * 50 + " berry" * 5
    assert words.derive([text]) == sorted(made_up[100:])  # the 100 most frequent skipped; 'berry' mostly capitalised
    assert haystacks.sentences('He said "Go." Then she left! 3 men came.') == ['He said "Go."', "Then she left!",
                                                                              "3 men came."]
    assert json.dumps(list(haystacks.DEPTHS[:3])) == "[0, 3, 5]" and haystacks.DEPTHS[-1] == 100


DESIGNED_LENGTH = 4096


@pytest.mark.parametrize("name", ["niah_single_1", "niah_single_2", "niah_multikey_1", "niah_multikey_3"])
def test_needles_placed_by_design_sit_at_the_distances_asked_in_the_models_tokens(name, prompter, book):
    """--needle_distances: context j holds k = 3 needles, each asked in a question of its own, at
    distances (tokens from each question's prompt end, measured as corpora.ruler.needle_distances
    measures them) within two haystack units of those asked; every distance asked equally often;
    the questions of a context differ only in their end; the same contexts whatever else is asked."""
    from corpora.ruler import designed
    targets = [400, 1500, 2600, 3400]
    contexts = designed.build(name, DESIGNED_LENGTH, 4, 7, prompter, targets, questions=3, book=book)
    assert [c.targets for c in contexts] == [[400, 1500, 2600], [3400, 400, 1500], [2600, 3400, 400],
                                             [1500, 2600, 3400]]
    for c in contexts:
        assert c.distances == [ruler.needle_distances(b, prompter)[0] for b in c.examples]
        assert c.grain < 0.04 * DESIGNED_LENGTH  # a line or a sentence (of this byte-level tokenizer's tokens)
        assert all(abs(got - asked) <= 1.5 * c.grain for got, asked in zip(c.distances, c.targets)), (c.distances, c.targets)
        assert all(len(b.ids) <= DESIGNED_LENGTH - ruler.task(name).tokens_to_generate for b in c.examples)
        texts = [prompter.text(b.example) for b in c.examples]
        question = texts[0].rindex("What is")
        assert all(t[:question] == texts[0][:question] for t in texts)  # one context, k questions
        values = [b.example.references[0] for b in c.examples]
        assert len(set(values)) == 3 and all(texts[0].count(v) == 1 for v in values)
        if ruler.task(name).book:  # the stretch of the book the context holds (contexts can share text)
            start, count = c.span
            assert count == c.examples[0].example.size and c.haystack_words == len(book)
            assert " ".join(book[start:start + 4]) in texts[0] and book[start - 1].endswith(".")
        else:
            assert c.span is None and c.haystack_words is None
    again = designed.build(name, DESIGNED_LENGTH, 2, 7, prompter, targets, questions=3, book=book)
    assert [b.ids for c in again for b in c.examples] == [b.ids for c in contexts[:2] for b in c.examples]


def test_needles_by_design_refuse_what_they_cannot_place(prompter, book):
    from corpora.ruler import designed
    with pytest.raises(RulerError, match="niah_multivalue: needles by distance take"):
        designed.build("niah_multivalue", DESIGNED_LENGTH, 1, 7, prompter, [1000], book=book)
    with pytest.raises(RulerError, match="3 questions per context need as many distinct distances"):
        designed.build("niah_single_1", DESIGNED_LENGTH, 1, 7, prompter, [1000, 2000], questions=3)
    with pytest.raises(RulerError, match="must lie in"):
        designed.build("niah_single_1", DESIGNED_LENGTH, 1, 7, prompter, [5000])
    assert "vt" not in designed.DESIGNED_TASKS and "niah_single_2" in designed.DESIGNED_TASKS


def test_book_stretches_drawn_apart_share_no_text(prompter, book):
    """--haystack_stretches disjoint: each context's stretch of the book in a slot of its own (no two
    share a word, so each is a group of its own in the pairs' test), the same contexts whatever else is
    asked; past the slots the book holds, contexts start at random again (and the report groups them)."""
    from corpora.ruler import designed
    from experiment.report.pairs import shared_text_groups
    targets = [1000, 3000]
    apart = designed.build("niah_single_2", DESIGNED_LENGTH, 4, 7, prompter, targets, book=book, disjoint=True)
    spans = [c.span for c in apart]
    assert shared_text_groups(range(4), spans, len(book)).tolist() == [0, 1, 2, 3]
    for c in apart:
        start, count = c.span
        assert " ".join(book[start:start + 4]) in prompter.text(c.examples[0].example)
        assert all(abs(got - asked) <= 1.5 * c.grain for got, asked in zip(c.distances, c.targets))
    at_random = designed.build("niah_single_2", DESIGNED_LENGTH, 4, 7, prompter, targets, book=book)
    assert [c.span for c in at_random] != spans  # the default draws them as before
    small = book[:int(6.7 * apart[0].span[1])]  # a book with room for 6 such stretches
    more = designed.build("niah_single_2", DESIGNED_LENGTH, 8, 7, prompter, targets, book=small, disjoint=True)
    two = designed.build("niah_single_2", DESIGNED_LENGTH, 2, 7, prompter, targets, book=small, disjoint=True)
    assert [b.ids for c in two for b in c.examples] == [b.ids for c in more[:2] for b in c.examples]
    first_six = shared_text_groups(range(6), [c.span for c in more[:6]], len(small))
    assert len(set(first_six.tolist())) >= 5  # a stretch longer than its slot can touch the next one
    assert len(set(shared_text_groups(range(8), [c.span for c in more], len(small)).tolist())) < 8  # 8 > 6 slots
