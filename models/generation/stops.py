"""Where each generated row ends: at a stop token (not kept), or once its text holds a stop string
(the tokens from the one in which the string begins are dropped, so the returned ids decode to
text before it; a string that begins inside a token loses that token's text before it too)."""
from __future__ import annotations

from typing import Sequence

import numpy as np


class Stops:
    """The new tokens of `rows` rows, and which rows have ended (`add` one token per row at a time)."""

    def __init__(self, stop: Sequence[int | str] | None, tokenizer, rows: int):
        items = [stop] if isinstance(stop, (int, str)) else list(stop or [])
        self.ids = {int(s) for s in items if not isinstance(s, str)}
        self.strings = [s for s in items if isinstance(s, str) and s]
        if self.strings and tokenizer is None:
            raise ValueError(f"stop strings {self.strings} need the model's tokenizer (tokenizer=...)")
        self.tokenizer = tokenizer
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.done = np.zeros(rows, bool)

    def add(self, ids_B: np.ndarray, active: Sequence[bool] | None = None) -> None:
        """One token per row; rows where `active` is False take none (a row still reading its prompt)."""
        for row, token in enumerate(np.asarray(ids_B).tolist()):
            if self.done[row] or (active is not None and not active[row]):
                continue
            if token in self.ids:
                self.done[row] = True
                continue
            self.tokens[row].append(int(token))
            if self.strings:
                self._cut_at_string(row)

    def _cut_at_string(self, row: int) -> None:
        tokens = self.tokens[row]
        text = self.tokenizer.decode(tokens)
        found = [text.find(s) for s in self.strings if s in text]
        if not found:
            return
        begin = min(found)
        keep = len(tokens)
        while keep > 0 and len(self.tokenizer.decode(tokens[:keep])) > begin:
            keep -= 1
        del tokens[keep:]
        self.done[row] = True

    def all_done(self) -> bool:
        return bool(self.done.all())

    def outputs(self) -> list[list[int]]:
        return [list(t) for t in self.tokens]
