"""Every kind of evaluation record, defined once: its file under WORKDIR/eval/, what identifies one
record (evaluations merge by it, sweeps check for it, reports draw series by it) and how files merge.

Every record carries what produced it (the header, experiment/evals/common.py): `scheme`,
`train_length`, the checkpoint `step`, `data` (dataset), `tokenizer` (the unit), and `overrides`
(eval-time options that took effect) where there are any. Then, per kind:
- perplexity (eval/extrapolation.json): `split`, `eval_length`, `stride`, `max_tokens` (0 = the
  whole split), `tokens`, `nll`, `ppl`, `tokens_per_s`, `position_nll`, and `words`, `word_ppl`
  where the unit is not the word;
- passkey (eval/passkey.json): `task`, `eval_length`, `depth`, `digits`, `accuracy`,
  `token_accuracy`, `count`, `seed`, `chance`, `passkey_fraction`;
- attention (eval/attention.json): `split`, `eval_length`, `windows`, `block`, `layers`, `heads`,
  `positions` (bins of query positions), `mean_distance` and `entropy` (layers x heads x bins).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Callable


def series_key(record: dict) -> tuple:
    """The curve a record belongs to: (split, stride kind, max_tokens, overrides); the stride kind is
    'nonoverlapping' where stride == eval_length, else the stride."""
    kind = "nonoverlapping" if record["stride"] == record["eval_length"] else int(record["stride"])
    return (record.get("split", "valid"), kind, int(record.get("max_tokens", 0)),
            json.dumps(record.get("overrides", {}), sort_keys=True))


def record_key(record: dict) -> tuple:
    """One record per (series, eval_length): a newer evaluation replaces the older."""
    return series_key(record) + (int(record["eval_length"]),)


def passkey_key(record: dict) -> tuple:
    """One passkey record per (eval_length, depth, digits, overrides)."""
    return (int(record["eval_length"]), float(record["depth"]), int(record.get("digits", 4)),
            json.dumps(record.get("overrides", {}), sort_keys=True))


def attention_key(record: dict) -> tuple:
    """One attention record per (split, eval_length, overrides)."""
    return (record.get("split"), int(record["eval_length"]), json.dumps(record.get("overrides", {}), sort_keys=True))


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of evaluation record: its file under WORKDIR/eval/ and the key a newer record replaces by."""
    name: str
    file: str
    key: Callable[[dict], tuple]


KINDS = {kind.name: kind for kind in (Kind("perplexity", "extrapolation.json", record_key),
                                      Kind("passkey", "passkey.json", passkey_key),
                                      Kind("attention", "attention.json", attention_key))}


def record_kind(name: str) -> Kind:
    if name not in KINDS:
        raise ValueError(f"unknown record kind {name!r}; valid: {', '.join(KINDS)}")
    return KINDS[name]


def series_label(key: tuple) -> str:
    """'nonoverlapping', 'stride 64, first 32,768 tokens, yarn_scale=4', ... (the split is shown apart)."""
    _, kind, max_tokens, overrides = key
    label = "nonoverlapping" if kind == "nonoverlapping" else f"stride {kind}"
    if max_tokens:
        label += f", first {max_tokens:,} tokens"
    for name, value in sorted(json.loads(overrides).items()):
        label += f", {name.split('.')[-1]}={value}"
    return label


def tensorboard_tag(record: dict) -> str:
    """'eval/valid/ppl_L256', with '_S64', '_first32768', '_yarn_scale=4' where they apply."""
    _, kind, max_tokens, overrides = series_key(record)
    tag = f"eval/{record.get('split', 'valid')}/ppl_L{record['eval_length']}"
    tag += "" if kind == "nonoverlapping" else f"_S{kind}"
    tag += f"_first{max_tokens}" if max_tokens else ""
    return tag + "".join(f"_{k.split('.')[-1]}={v}" for k, v in sorted(json.loads(overrides).items()))


def merge(old: list[dict], new: list[dict], key=record_key) -> tuple[list[dict], list[dict]]:
    """(merged records, dropped stale records). A new record replaces the one with its `key`;
    records from a checkpoint older than the newest one merged are dropped (stale: the run trained
    on since), so every record kept comes from one checkpoint. Every kind of record (perplexity,
    passkey, attention) merges here, each with its own key."""
    merged = {key(r): r for r in old}
    merged.update({key(r): r for r in new})
    newest = max((int(r.get("step", 0)) for r in new), default=None)
    kept, stale = [], []
    for r in merged.values():
        (stale if newest is not None and int(r.get("step", 0)) < newest else kept).append(r)
    kept.sort(key=lambda r: tuple(str(x) for x in key(r)))
    return kept, stale
