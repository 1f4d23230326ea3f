"""The RULER tasks (Hsieh et al. 2024, NVIDIA/RULER's scripts/synthetic.yaml and
scripts/data/synthetic/constants.py): their settings, templates and answer budgets, one row each.

Each task's text is RULER's (`template`: the instruction, the context and the question after it;
`answer_prefix`: the start of the answer, placed after the model's turn begins, as RULER places it),
and `tokens_to_generate` is RULER's budget for the answer, counted in the target length: a prompt
built for length L has at most L - tokens_to_generate tokens. A task whose haystack is RULER's Paul
Graham essays takes one of the four public-domain books of corpora/books.py instead (`book`): those
rows are marked "book haystack" wherever they are reported.
"""
from __future__ import annotations

import dataclasses

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {kind} for {key} is: {value}."

NIAH_TEMPLATE = ("Some special magic {kind} are hidden within the following text. Make sure to memorize it. I will "
                 "quiz you about the {kind} afterwards.\n{context}\nWhat are all the special magic {kind} for {query} "
                 "mentioned in the provided text?")
NIAH_PREFIX = " The special magic {kind} for {query} mentioned in the provided text are"
VT_TEMPLATE = ("Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
               "Question: Find all variables that are assigned the value {query} in the text above.")
VT_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {count} variables are "
             "assigned the value {query}, they are: ")
CWE_TEMPLATE = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
                "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above "
                "list?")
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = ("Read the following coded text and track the frequency of each coded word. Find the three most "
                "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
                "the dots '....'. What are the three most frequently appeared words in the above coded text?")
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"


@dataclasses.dataclass(frozen=True)
class Task:
    """One task: its `family` (niah, vt, cwe, fwe: the module that builds it), RULER's answer budget,
    its `haystack` (what fills the context: noise, needle, book, words, coded words) and its settings
    (RULER's arguments of synthetic.yaml, by their names there)."""
    name: str
    family: str
    tokens_to_generate: int
    haystack: str
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def book(self) -> bool:
        """Whether a book stands in for RULER's essays (reports mark such a task)."""
        return self.haystack == "book"

    @property
    def label(self) -> str:
        return f"{self.name} (book haystack)" if self.book else self.name


def _niah(name: str, haystack: str, key: str = "words", value: str = "numbers", keys: int = 1, values: int = 1,
          queries: int = 1) -> Task:
    return Task(name, "niah", 128, haystack, {"type_needle_k": key, "type_needle_v": value, "num_needle_k": keys,
                                              "num_needle_v": values, "num_needle_q": queries})


TASKS: dict[str, Task] = {t.name: t for t in (
    _niah("niah_single_1", "noise"),
    _niah("niah_single_2", "book"),
    _niah("niah_single_3", "book", value="uuids"),
    _niah("niah_multikey_1", "book", keys=4),
    _niah("niah_multikey_2", "needle"),
    _niah("niah_multikey_3", "needle", key="uuids", value="uuids"),
    _niah("niah_multivalue", "book", values=4),
    _niah("niah_multiquery", "book", queries=4),
    Task("vt", "vt", 30, "noise", {"num_chains": 1, "num_hops": 4}),
    Task("cwe", "cwe", 120, "words", {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10}),
    Task("fwe", "fwe", 50, "coded words", {"alpha": 2.0}),
)}

# The six tasks of the issue that need no book, then the four with a book haystack.
CORE = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe")
DEFAULT = CORE + ("niah_single_2", "niah_single_3", "niah_multivalue", "niah_multiquery")


def task(name: str) -> Task:
    if name not in TASKS:
        raise ValueError(f"unknown RULER task {name!r}; valid: {', '.join(TASKS)}")
    return TASKS[name]
