"""Every export is read back before its command says it succeeded: the file or folder written is
loaded as import_hf.py and generate.py load it (models.formats.hf.load_checkpoint), and must hold the
model's parameters in their shapes and a tokenizer that encodes a probe text to the run's ids. A
file our own reader refuses is one llama.cpp or transformers would refuse too (a GGUF tokenizer
without its merges key, say): the export stops with the reason, and nothing takes the place of `out`."""
from __future__ import annotations

import pathlib

from models.formats import HFError, hf
from models.formats.gguf_tokenizer_writer import PROBE


def read_back(written: str | pathlib.Path, out: str | pathlib.Path, model, tokenizer) -> None:
    """HFError unless `written` (the staged export of `out`) loads with `model`'s parameter shapes and
    a tokenizer that encodes PROBE as `tokenizer` (a `tokenizers.Tokenizer`) does."""
    def refuse(why: str) -> None:
        raise HFError(f"{out}: the export does not read back ({why}); nothing was written there. This is a fault "
                      f"of the exporter: please report it with the run's config.json")
    try:
        loaded = hf.load_checkpoint(written)
    except HFError as e:
        refuse(str(e).replace(str(written), "the file"))
    shapes = {k: tuple(v.shape) for k, v in hf.params_by_path(model).items()}
    back = {k: tuple(v.shape) for k, v in hf.params_by_path(loaded.model).items()}
    if back != shapes:
        differ = sorted(set(shapes.items()) ^ set(back.items()))
        refuse(f"parameters differ, first {differ[0]}")
    if loaded.tokenizer is None:
        refuse("no tokenizer")
    expected = tokenizer.encode(PROBE, add_special_tokens=False).ids
    if loaded.tokenizer.encode(PROBE, add_special_tokens=False).ids != expected:
        refuse("its tokenizer encodes a probe text otherwise")
