"""Our models in EleutherAI's lm-evaluation-harness (lm_eval 0.4.13; `pip install -e '.[harness]'`): the
model `lengthx`, registered on import, and `python -m experiment.harness`, which is the `lm_eval`
command with `lengthx` known to it (lm_eval finds no model outside its own package by itself).

    python -m experiment.harness --model lengthx \
        --model_args pretrained=smollm2,method=yarn,max_length=16384 --tasks TASK ...
    lm_eval.simple_evaluate(model=LengthxLM(pretrained="runs/rope", method="self_extend", max_length=4096), ...)

Model arguments: `pretrained` (a run folder, a Hugging Face folder, a GGUF file or a packaged model's
name: experiment/generation.py), `method` (a `--methods` name, experiment/evals/methods.py) with its
options at `max_length` (default: the model's window), any eval-time option as a dotted key
(`posenc.rope.yarn_beta_fast=16`, `model.attention=blockwise`), `batch_size`, `max_gen_toks`.

Requests: `loglikelihood` scores each continuation given its context in one forward pass (the
continuation's log-probability and whether greedy decoding gives it); `loglikelihood_rolling` scores
a document in consecutive windows of `max_length` targets, each after the token before it, every
token once (the nonoverlapping protocol of eval_extrapolate.py); `generate_until` decodes greedily (or
samples, as the request's kwargs say) with the key / value cache (models/generate.py) until one of
its `until` strings or the end-of-sequence token, at most `max_gen_toks` tokens. A request longer
than `max_length` is an error naming it, never cut silently.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

NEEDS = "the lm-evaluation-harness is not installed: pip install -e '.[harness]' (lm_eval==0.4.13)"
try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ModuleNotFoundError as e:
    if (e.name or "").split(".")[0] != "lm_eval":
        raise
    if __name__ == "__main__":  # python -m experiment.harness: one line, rc 2, as every entry point's errors
        print(f"error: {NEEDS}", file=sys.stderr)
        sys.exit(2)
    raise ModuleNotFoundError(f"experiment.harness: {NEEDS}", name="lm_eval") from None

from experiment.generation import open_source
from models.generate import generate
from models.generation.chat import render
from models.generation.session import padded_length

DEFAULT_MAX_GEN_TOKS = 256
SCORE_BUCKET = 8  # continuations are padded to a multiple of this many tokens (few compilations)


@functools.lru_cache(maxsize=8)
def _scorer(graphdef):
    def score(state, tokens_BxT, positions_BxT, targets_BxC, first_B):
        """Log-probabilities of `targets_BxC` at positions first .. first + C - 1 of each row, and
        whether each is the most likely token there (B x C each)."""
        model = nnx.merge(graphdef, state)
        hidden = model.hidden(tokens_BxT, positions_BxT)
        at = first_B[:, None] + jnp.arange(targets_BxC.shape[1])[None, :]
        rows = jnp.take_along_axis(hidden, jnp.clip(at, 0, tokens_BxT.shape[1] - 1)[..., None], axis=1)
        log_probs = jax.nn.log_softmax(model.head(rows), axis=-1)
        picked = jnp.take_along_axis(log_probs, targets_BxC[..., None], axis=-1)[..., 0]
        return picked, jnp.argmax(log_probs, axis=-1) == targets_BxC
    return jax.jit(score)


def _count(name: str, value) -> int:
    """A model argument that counts something (lm_eval passes them as text): a whole number >= 1."""
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"lengthx model_args: {name}={value}: give a whole number >= 1")
    return int(text)


@register_model("lengthx")
class LengthxLM(TemplateLM):
    """lm_eval's model of a lengthx checkpoint (module docstring)."""

    def __init__(self, pretrained: str, method: str | None = None, max_length: int | None = None,
                 batch_size: int | str = 1, max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, **options: Any):
        super().__init__()
        overrides = {key: str(value) for key, value in options.items() if key.startswith(("posenc.", "model."))}
        ignored = sorted(set(options) - set(overrides) - {"device", "max_batch_size", "dtype"})
        if ignored:
            raise ValueError(f"lengthx model_args: unknown {', '.join(ignored)}; valid: pretrained, method, max_length, "
                             f"batch_size, max_gen_toks and eval-time options as posenc.<scheme>.<option>=VALUE")
        self.source = open_source(str(pretrained), "pretrained=")
        self.max_length = _count("max_length", max_length) if max_length else self.source.window
        self.method = method or None
        self.model = self.source.model(self.method, self.max_length, overrides)
        self.batch_size = 1 if str(batch_size).startswith("auto") else _count("batch_size", batch_size)
        self.max_gen_toks = _count("max_gen_toks", max_gen_toks)
        self.tokenizer = self.source.tokenizer  # lm_eval reads `tokenizer` to know that chat templates apply

    # --- tokens ----------------------------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return int(self.source.tokenizer.eos_id)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        special = True if add_special_tokens is None else bool(add_special_tokens)
        bos = self.source.bos_token
        if add_special_tokens is None and bos and string.startswith(bos):  # already there (a chat template's)
            special = False
        return self.source.encode(string, special=special)

    def tok_decode(self, tokens, **kwargs) -> str:
        return self.source.decode(tokens)

    def _checked_length(self, length: int, what: str) -> None:
        if length > self.max_length:
            raise ValueError(f"lengthx: {what} needs {length:,} tokens, more than max_length={self.max_length:,}; "
                             f"raise max_length= in --model_args (the method's options follow it), or shorten the "
                             f"task's inputs (nothing is cut silently)")

    # --- scoring ---------------------------------------------------------------------------------

    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(log P(continuation | context), greedy?) of each (context ids, continuation ids)."""
        out: list[tuple[float, bool] | None] = [None] * len(pairs)
        order = sorted(range(len(pairs)), key=lambda i: -len(pairs[i][0]) - len(pairs[i][1]))
        graphdef, state = nnx.split(self.model)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            inputs = [(pairs[i][0] + pairs[i][1])[:-1] for i in chunk]
            for i, ids in zip(chunk, inputs):
                self._checked_length(len(ids), f"request {i} (context and continuation)")
            width = padded_length(max(len(x) for x in inputs))
            span = -(-max(len(pairs[i][1]) for i in chunk) // SCORE_BUCKET) * SCORE_BUCKET
            tokens = np.zeros((len(chunk), width), np.int32)
            targets = np.zeros((len(chunk), span), np.int32)
            first = np.zeros(len(chunk), np.int32)
            for row, (i, ids) in enumerate(zip(chunk, inputs)):
                context, continuation = pairs[i]
                tokens[row, :len(ids)] = ids
                targets[row, :len(continuation)] = continuation
                first[row] = len(context) - 1
            # right-padded; a pad at its row's last position (a length-dependent scaling sees the row's own)
            lengths = np.array([len(x) for x in inputs])[:, None]
            positions = np.minimum(np.arange(width)[None, :], lengths - 1).astype(np.int32)
            picked, greedy = _scorer(graphdef)(state, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(targets),
                                               jnp.asarray(first))
            picked, greedy = np.asarray(picked), np.asarray(greedy)
            for row, i in enumerate(chunk):
                n = len(pairs[i][1])
                out[i] = (float(picked[row, :n].sum()), bool(greedy[row, :n].all()))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        return self._score([(list(context), list(continuation)) for _, context, continuation in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        results = []
        for request in requests:
            ids = self.tok_encode(request.args[0], add_special_tokens=False)
            windows = []
            for start in range(0, len(ids), self.max_length):  # max_length targets, each after the token before
                context = [self.prefix_token_id] if start == 0 else [ids[start - 1]]
                windows.append((context, ids[start:start + self.max_length]))
            total = sum(score for score, _ in self._score(windows))
            results.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return results

    # --- generation ------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for index, request in enumerate(requests):
            context, kwargs = request.args
            kwargs = dict(kwargs or {})
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            sampling = bool(kwargs.pop("do_sample", False))
            temperature = float(kwargs.pop("temperature", 0.0) or 0.0) if sampling else 0.0
            top_p = float(kwargs.pop("top_p", 1.0) or 1.0) if sampling else 1.0
            ids = self.tok_encode(context)
            self._checked_length(len(ids) + new, f"generation request {index} ({len(ids):,} prompt tokens + "
                                                  f"max_gen_toks {new})")
            tokens = generate(self.model, [ids], new, temperature=temperature, top_p=top_p,
                              stop=[self.eot_token_id, *until], tokenizer=self.source.tokenizer)[0]
            text = self.tok_decode(tokens)
            for stop in until:  # exactly at the string, as the harness's own models cut
                text = text.split(stop)[0] if stop else text
            out.append(text)
            self.cache_hook.add_partial("generate_until", request.args, text)
        return out

    # --- chat ------------------------------------------------------------------------------------

    @property
    def tokenizer_name(self) -> str:
        return self.source.path.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.source.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if not self.source.chat_template:
            raise ValueError(f"lengthx: {self.source.path} has no chat template; run without --apply_chat_template")
        eos = self.tok_decode([self.eot_token_id])
        return render(self.source.chat_template, chat_history, bos_token=self.source.bos_token, eos_token=eos,
                      add_generation_prompt=add_generation_prompt)


def main() -> None:
    """The lm_eval command, with `lengthx` registered (this module's import did it). A bad model argument
    or source (ValueError, FileNotFoundError: ours and lm_eval's own) is one line and rc 2, as every
    entry point's errors (LX_TRACEBACK=1 shows the traceback)."""
    from lm_eval.__main__ import cli_evaluate
    sys.argv[0] = "lm_eval"
    try:
        cli_evaluate()
    except (ValueError, FileNotFoundError) as e:
        if os.environ.get("LX_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
