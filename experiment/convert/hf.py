"""Pretrained Hugging Face checkpoints as run directories, and runs back as checkpoints.

`import_hf(src, workdir)` makes WORKDIR a run like one train.py leaves (experiment/store/run.py): its
config.json is the typed config with the checkpoint's model section, its rope as our `rope`
options (posenc), `train.seq_len` = max_position_embeddings (the window it was trained at) and
`data.tokenizer="pretrained"`, the other sections at their defaults (the demo's built-in corpus
unless `data` says otherwise); tokenizer.json is the checkpoint's tokenizer (the `pretrained`
kind, corpora/tokenizers.py), with the checkpoint's chat template (chat_template.jinja) and special
tokens (special_tokens_map.json) beside it where it has them; checkpoints/ holds step 0: the
parameters, a fresh optimizer state and meta {"step": 0, "data_position": 0, "seed"}. Evaluation,
passkey, reports and a fine-tune from it (`train.init_from=WORKDIR`) then work on it as on any run.

`export_hf(workdir, out, overrides)` writes the run's newest checkpoint in HF's format
(models/formats/hf.py), its rope options (with any eval-time overrides) as HF's rope_parameters, and its
tokenizer as tokenizer.json beside it (with the chat template and special tokens import kept): an
imported run, a fine-tune of one, or a run trained here with a Llama-family or GPT-NeoX block (any
tokenizer kind). experiment/convert/gguf.py writes the same as a GGUF file.
"""
from __future__ import annotations

import json
import logging
import math
import os
import pathlib
import shutil

import ml_collections
from flax import nnx

import corpora
import posenc
from experiment import config as config_lib
from experiment.config import Config
from experiment.convert.read_back import read_back
from experiment.evals.common import apply_overrides, load_checkpoint
from experiment.store import checkpoints, files, output
from experiment.store.files import first_line
from experiment.store.run import RunDir, RunError
from experiment.train.optimizer import make_optimizer
from models.formats import hf
from models.formats.hf_mapping import HFError, rope_options
from models.generation.chat import TEMPLATE_FILE

log = logging.getLogger(__name__)

DATA_KEYS = ("source", "path", "name", "hf_config", "text_column")  # what `data` may set
SPECIAL_TOKENS_FILE = "special_tokens_map.json"  # a run's, as HF names it: {"bos_token": "<s>", ...}


# --- the checkpoint's tokenizer ----------------------------------------------------------------

def eos_id_of(folder: pathlib.Path, config: dict, tokenizer, config_path: pathlib.Path | None = None) -> int:
    """The end-of-sequence id: config.json's eos_token_id (the first of a list), else
    tokenizer_config.json's eos_token, else the tokenizer's </s> or <|endoftext|>. `folder`: the
    tokenizer's; `config_path`: the file `config` was read from (the checkpoint's config.json, which
    may lie elsewhere: import_hf.py --tokenizer; a GGUF file), named where it lacks the id."""
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is not None:
        return int(eos)
    names = list(corpora.PretrainedTokenizer.EOS_NAMES)
    extra = folder / "tokenizer_config.json"
    if extra.exists():
        token = json.loads(extra.read_text()).get("eos_token")
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str):
            names.insert(0, token)
    for name in names:
        found = tokenizer.token_to_id(name)
        if found is not None:
            return int(found)
    config_path = config_path or folder / "config.json"
    fix = (f"set eos_token_id in {config_path}" if config_path.suffix == ".json" else
           f"give --tokenizer a tokenizer.json that has one of those tokens")
    raise HFError(f"no end-of-sequence token: {config_path} has no eos_token_id, and the tokenizer "
                  f"({folder}) has no {' or '.join(names)}; {fix}")


def pretrained_tokenizer(folder: pathlib.Path, config: dict, tokenizer=None, line_end: str = "newline",
                         config_path: pathlib.Path | None = None) -> corpora.PretrainedTokenizer:
    """The checkpoint's tokenizer.json (or `tokenizer`, the one loaded with it: a GGUF file's) as the
    `pretrained` kind, sized by the model's vocabulary; text encoded as a file holds it, with its
    newlines (`line_end`, corpora/tokenizers.py). `config_path`: as for `eos_id_of`."""
    tokenizer = tokenizer if tokenizer is not None else hf.tokenizer(folder)
    if tokenizer is None:
        raise HFError(f"{folder}: no tokenizer.json; the run needs the checkpoint's tokenizer to encode text: give "
                      f"it with --tokenizer PATH (its tokenizer.json, or a folder holding one)")
    vocab = int(config["vocab_size"])
    if tokenizer.get_vocab_size() > vocab:
        log.warning("the tokenizer has %d tokens, the model's vocabulary %d: text that encodes to an id past it "
                    "is refused when it is encoded (experiment/store/run.py: stream)",
                    tokenizer.get_vocab_size(), vocab)
    eos = eos_id_of(folder, config, tokenizer, config_path)
    try:
        return corpora.PretrainedTokenizer(tokenizer, vocab, eos, line_end)
    except ValueError as e:  # blame the file the id came from
        where = (config_path or folder / "config.json") if config.get("eos_token_id") is not None else folder
        raise HFError(f"{where}: {e}") from None


# --- import ------------------------------------------------------------------------------------

def run_config(config: dict, rope_parameters: dict | None = None, dtype: str = "float32",
               data: dict | None = None) -> Config:
    """The typed config of a run holding the checkpoint whose config.json is `config`."""
    model_cfg = hf.model_config(config, dtype)
    c = config_lib.defaults("rope")
    for key in c.model.keys():
        c.model[key] = getattr(model_cfg, key)
    c.posenc = hf.posenc_config(config, rope_parameters)
    c.train.seq_len = int(config["max_position_embeddings"])
    c.data.tokenizer = "pretrained"
    for key, value in (data or {}).items():
        if key not in DATA_KEYS:
            raise config_lib.ConfigError(f"data.{key} cannot be set at import; valid: {', '.join(DATA_KEYS)}")
        c.data[key] = value
    return config_lib.resolve(c)


def given_tokenizer(path: str | pathlib.Path) -> tuple[object, pathlib.Path]:
    """(the `tokenizers.Tokenizer`, its folder) of import_hf.py --tokenizer PATH: a tokenizer.json, or
    a folder holding one (for checkpoints that keep their tokenizer apart)."""
    path = pathlib.Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise HFError(f"--tokenizer {path}: no such file{' in it' if path.is_dir() else ''}; give the checkpoint's "
                      f"tokenizer.json, or a folder holding one")
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(file)), file.parent
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises its own kinds
        raise HFError(f"--tokenizer {file} is not a tokenizer.json of the tokenizers library "
                      f"({first_line(e)})") from None


SPECIAL_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
SPARE_ROWS = 0.05  # embedding rows past the tokenizer's last id that a checkpoint may pad (Phi-2: 1.8%)


def check_given_tokenizer(path, given, own, hf_cfg: dict, rows: int, src) -> None:
    """import_hf.py --tokenizer PATH checked against the checkpoint `src` (HFError on a mismatch, a
    warning that names both where it replaces the checkpoint's own tokenizer): it must fit the model's
    `rows` embedding rows (at most `SPARE_ROWS` of them unused, as checkpoints pad their embeddings),
    hold the config's special ids, and where the checkpoint carries a tokenizer (`own`), have its
    vocabulary size and give the special ids the same tokens."""
    size = given.get_vocab_size(with_added_tokens=True)
    fix = f"drop --tokenizer (or give {src}'s own tokenizer.json)"
    if own is not None:
        theirs = own.get_vocab_size(with_added_tokens=True)
        if size != theirs:
            raise HFError(f"--tokenizer {path}: {size:,} tokens, but {src} carries a tokenizer of {theirs:,}; {fix}")
    if not rows * (1 - SPARE_ROWS) <= size <= rows:
        raise HFError(f"--tokenizer {path}: {size:,} tokens for a model of {rows:,} embedding rows: every id would "
                      f"score the wrong row; {fix}")
    for key in SPECIAL_IDS:
        index = hf_cfg.get(key)
        if not isinstance(index, int):
            continue
        token = given.id_to_token(index)
        if token is None:
            raise HFError(f"--tokenizer {path}: no token of id {index}, the checkpoint's {key}; {fix}")
        if own is not None and own.id_to_token(index) != token:
            raise HFError(f"--tokenizer {path}: id {index} ({key}) is {token!r}, the checkpoint's own tokenizer "
                          f"has {own.id_to_token(index)!r} there; {fix}")
    if own is not None:
        log.warning("--tokenizer %s replaces the tokenizer %s carries (the same %d tokens and special ids)",
                    path, src, size)


IMPORT_DATA_FLAGS = {"--config.data.source": "--data_source", "--config.data.path": "--data_path",
                     "--config.data.name": "--data_name"}


def check_data(config: Config) -> None:
    """The run's data can be read where it says (its folder and a split's files; a hub name is not
    contacted): a bad --data_path is refused at import, not at the first evaluation. One of the
    splits an evaluation or fine-tune reads is enough; the error names import_hf.py's flags."""
    splits = list(dict.fromkeys((config.eval.split, config.data.train_split, "test")))
    errors = []
    for split in splits:
        try:
            corpora.check_splits(config.data, [split])
            return
        except corpora.DataError as e:
            errors.append(str(e))
    message = errors[0]
    for theirs, ours in IMPORT_DATA_FLAGS.items():
        message = message.replace(theirs, ours)
    raise corpora.DataError(message.replace("--config.data.", "data."))


def special_tokens(config: dict, tokenizer, folder: pathlib.Path) -> dict[str, str]:
    """The checkpoint's BOS, unknown and padding tokens as HF's special_tokens_map.json names them
    (`bos_token`: its text, ...): from config.json's ids (a GGUF file's tokenizer.ggml.*_token_id), else
    from `folder`'s tokenizer_config.json."""
    named = {}
    extra = pathlib.Path(folder) / "tokenizer_config.json"
    try:
        named = json.loads(extra.read_text()) if extra.is_file() else {}
    except (OSError, ValueError):
        pass
    kept = {}
    for key in ("bos", "unk", "pad"):
        index = config.get(f"{key}_token_id")
        index = (index[0] if index else None) if isinstance(index, list) else index
        token = tokenizer.id_to_token(int(index)) if isinstance(index, int) else None
        if token is None and isinstance(named, dict):
            token = named.get(f"{key}_token")
            token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and tokenizer.token_to_id(token) is not None:
            kept[f"{key}_token"] = token
    return kept


def keep_tokenizer_files(staging: pathlib.Path, config: dict, tokenizer, folder: pathlib.Path,
                         chat_template: str | None) -> None:
    """Beside the run's tokenizer.json, what a GGUF export of it needs and the tokenizer does not hold:
    the chat template (chat_template.jinja, as models/generation/chat.py reads a run's) and the special
    tokens (special_tokens_map.json, `special_tokens`), each only where the checkpoint has one."""
    if chat_template:
        files.write_atomically(staging / TEMPLATE_FILE, chat_template)
    kept = special_tokens(config, tokenizer, folder)
    if kept:
        files.write_atomically(staging / SPECIAL_TOKENS_FILE, json.dumps(kept, indent=1) + "\n")


def kept_special_tokens(run: RunDir) -> dict[str, str]:
    """The run's special_tokens_map.json (`keep_tokenizer_files`), {} where it has none; a damaged one
    is refused naming it."""
    path = run.path / SPECIAL_TOKENS_FILE
    if not path.is_file():
        return {}
    try:
        kept = json.loads(path.read_text())
    except ValueError as e:
        raise RunError(f"{path}: not JSON ({e}); delete it to export without its special tokens") from None
    if not isinstance(kept, dict) or not all(isinstance(v, str) for v in kept.values()):
        raise RunError(f"{path}: expected {{\"bos_token\": \"<s>\", ...}}; delete it to export without its special "
                       f"tokens")
    return kept


def _refuse_existing(workdir: pathlib.Path) -> None:
    if RunDir(workdir).exists():
        raise RunError(f"{workdir} already holds a run; import into a new --workdir (or delete this one)")
    if workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        raise RunError(f"{workdir} exists and is not an empty folder; import into a new --workdir")


def import_hf(src: str | pathlib.Path, workdir: str | pathlib.Path, rope_parameters: dict | None = None,
              dtype: str = "float32", data: dict | None = None, tokenizer: str | pathlib.Path | None = None) -> RunDir:
    """Make `workdir` a run holding the checkpoint `src` (a local folder, a hub id or a GGUF file) at
    step 0 (module docstring). `rope_parameters`: HF's rope dict in place of the checkpoint's; `data`:
    data-section values (source, path, name, hf_config, text_column), checked to be readable;
    `tokenizer`: a tokenizer.json (or a folder holding one) in place of the checkpoint's, for
    checkpoints that keep it apart. On any failure nothing is left in `workdir`: the run is written
    into a hidden sibling folder, renamed at the end."""
    workdir = pathlib.Path(workdir)
    _refuse_existing(workdir)
    given = given_tokenizer(tokenizer) if tokenizer is not None else None
    # HFError on any bad checkpoint; a GGUF file's metadata comes as config.json's dict
    model, hf_tokenizer, hf_cfg, folder, chat_template = hf.load_checkpoint(src, rope_parameters=rope_parameters,
                                                                            dtype=dtype)
    config = run_config(hf_cfg, rope_parameters, dtype, data)
    check_data(config)
    if given is not None:
        check_given_tokenizer(tokenizer, given[0], hf_tokenizer, hf_cfg, int(model.cfg.vocab_size), src)
    hf_tokenizer, tokenizer_folder = given if given is not None else (hf_tokenizer, folder)
    tokenizer = pretrained_tokenizer(tokenizer_folder, hf_cfg, hf_tokenizer,
                                     config_path=folder / "config.json" if folder.is_dir() else folder)
    _, params = nnx.split(model)
    opt_state = make_optimizer(config.train).init(params)

    workdir.parent.mkdir(parents=True, exist_ok=True)
    staging = workdir.parent / f".{workdir.name}.importing-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        run = RunDir(staging, writer=True)
        staging.mkdir()
        corpora.save_tokenizer(tokenizer, run.tokenizer_path)
        keep_tokenizer_files(staging, hf_cfg, hf_tokenizer, tokenizer_folder, chat_template)
        mngr = checkpoints.manager(staging)
        checkpoints.save(mngr, 0, params, opt_state, {"step": 0, "data_position": 0, "seed": int(config.seed)})
        mngr.close()
        run.save_config(config)  # last: its presence means "a run lives here"
        _refuse_existing(workdir)
        if workdir.exists():
            workdir.rmdir()  # empty (checked)
        staging.rename(workdir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return RunDir(workdir)


# --- export ------------------------------------------------------------------------------------

def _close(a, b) -> bool:
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)
    return a == b


def _candidate(o, max_length: int) -> dict:
    """HF's rope dict for the one scaling our options use (the inverse of hf_mapping's table)."""
    original = int(o.original_length or max_length)
    if tuple(o.longrope_short_factor) or tuple(o.longrope_long_factor):
        params = {"rope_type": "longrope", "short_factor": list(o.longrope_short_factor),
                  "long_factor": list(o.longrope_long_factor), "factor": float(o.longrope_factor),
                  "original_max_position_embeddings": original}
        return {**params, **({"attention_factor": o.longrope_attention_factor} if o.longrope_attention_factor else {})}
    if o.llama3_factor != 1.0:
        return {"rope_type": "llama3", "factor": float(o.llama3_factor), "low_freq_factor": o.llama3_low_freq_factor,
                "high_freq_factor": o.llama3_high_freq_factor, "original_max_position_embeddings": original}
    if o.yarn_scale != 1.0:
        return {"rope_type": "yarn", "factor": float(o.yarn_scale), "beta_fast": o.yarn_beta_fast,
                "beta_slow": o.yarn_beta_slow, "original_max_position_embeddings": original,
                **({} if o.yarn_temperature else {"attention_factor": 1.0})}
    if o.dynamic_ntk:
        return {"rope_type": "dynamic", "factor": float(o.dynamic_ntk_factor)}
    if o.pi_factor != 1.0:
        return {"rope_type": "linear", "factor": 1.0 / o.pi_factor}
    return {"rope_type": "default"}


def hf_rope_parameters(posenc_cfg: ml_collections.ConfigDict, max_length: int) -> dict:
    """HF's rope_parameters for a run's `rope` options, checked by reading them back (hf_mapping's
    `rope_options`): options that HF cannot express (Self-Extend, ReRoPE, xPos, NTK alpha, two
    scalings at once, ...) raise HFError naming them."""
    if posenc_cfg.name != "rope":
        raise HFError(f"positional scheme {posenc_cfg.name!r} has no Hugging Face form; only rope exports")
    options = posenc_cfg.rope
    params = _candidate(options, max_length)
    full = {**params, "rope_theta": float(options.base), "partial_rotary_factor": float(options.fraction)}
    expressed = rope_options({"max_position_embeddings": max_length}, full)
    as_read = {**posenc.default_config("rope").rope.to_dict(), **expressed}
    # original_length matters only to the scalings that scale from it (not to default and linear)
    differ = sorted(k for k in options.keys() if k in as_read and not _close(options[k], as_read[k])
                    and not (k == "original_length" and (not options[k] or k not in expressed)))
    if differ:
        raise HFError(f"rope option(s) {', '.join(f'{k}={options[k]}' for k in differ)} have no Hugging Face "
                      f"rope_parameters form (closest: {params['rope_type']}); export a run without them")
    return params


def export_hf(workdir: str | pathlib.Path, out: str | pathlib.Path, overrides: dict | None = None) -> pathlib.Path:
    """The run's newest checkpoint in HF's format in `out`: config.json with rope_parameters from the
    run's rope options (with `overrides`, eval-time options as eval_extrapolate.py's --set takes
    them: a run trained with plain RoPE exported with YaRN switched on), model.safetensors, and the
    run's tokenizer as tokenizer.json with its end-of-sequence id as eos_token_id (every tokenizer
    kind has a `tokenizers` form, corpora/tokenizers.py) and a tokenizer_config.json naming it, so
    that import_hf.py and transformers' AutoTokenizer take the export back. `out` is new, empty or an
    earlier export, never a run folder or an unmarked folder of other files; the export's files take
    the place of the earlier export's, and other files there stay (experiment/store/output.py). A full
    device names the file and the size it needs."""
    out = pathlib.Path(out)
    output.claim(out, "export_hf.py")  # before anything is loaded
    run = RunDir(workdir)
    run.require_checkpoint()
    overrides = dict(overrides or {})
    held = [key for key in overrides if not key.startswith("posenc.")]
    if held:  # the attention path, sinks, ...: chosen where the export is loaded, not written into it
        raise HFError(f"--set {held[0]}={overrides[held[0]]}: a Hugging Face checkpoint holds no {held[0]}, so the "
                      f"export would ignore it; drop it (export takes the rope options, posenc.rope.*)")
    config = run.load_config()
    rope = hf_rope_parameters(apply_overrides(config, overrides).posenc, int(config.train.seq_len))
    scoring = load_checkpoint(run, config, [], overrides)
    with output.replacing(out, "export_hf.py") as staging:
        model = scoring.model()
        weights = sum(int(x.nbytes) for x in hf.params_by_path(model).values())
        with files.space_for(staging / "model.safetensors", weights):  # checked first, named if it fills up
            hf.export(model, staging, rope_parameters=rope)
        tokenizer = scoring.tokenizer
        hf_tokenizer = tokenizer.hf_tokenizer()
        files.write_atomically(staging / "tokenizer.json", hf_tokenizer.to_str())
        special = kept_special_tokens(run)
        # the generic fast tokenizer, so that transformers' AutoTokenizer takes tokenizer.json as it is
        files.write_atomically(staging / "tokenizer_config.json", json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": hf_tokenizer.id_to_token(tokenizer.eos_id),
             **special}))
        if (run.path / TEMPLATE_FILE).is_file():
            files.write_atomically(staging / TEMPLATE_FILE, (run.path / TEMPLATE_FILE).read_text())
        exported = json.loads((staging / "config.json").read_text())
        exported["eos_token_id"] = tokenizer.eos_id
        for key, token in special.items():  # bos_token -> bos_token_id, ...
            exported[f"{key}_id"] = hf_tokenizer.token_to_id(token)
        files.write_atomically(staging / "config.json", json.dumps(exported, indent=2) + "\n")
        read_back(staging, out, model, hf_tokenizer)
    log.info("exported %s at step %d to %s", run.path, scoring.step, out)
    return out
