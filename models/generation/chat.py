"""A checkpoint's chat template (the Jinja text that turns a conversation into the prompt the model was
tuned on) and its rendering.

Where it is kept: a GGUF file's metadata `tokenizer.chat_template`; a Hugging Face folder's
`chat_template.jinja`, else `tokenizer_config.json`'s `chat_template` (a string, or a list of named
templates: "default"); a run made by import_hf.py keeps it as `chat_template.jinja` (RunDir). It is
rendered with Jinja's sandboxed environment as transformers renders it (blocks trimmed, `messages`,
`add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception`)."""
from __future__ import annotations

import json
from pathlib import Path

TEMPLATE_FILE = "chat_template.jinja"


class ChatTemplateError(ValueError):
    """A template that cannot be read or rendered; one line naming where it came from."""


def template_of(folder: str | Path) -> str | None:
    """The chat template of a Hugging Face folder or a run folder (None: it has none); a GGUF file's is
    its metadata's, which models/formats/hf.py reads with the rest."""
    path = Path(folder)
    if (path / TEMPLATE_FILE).is_file():
        return (path / TEMPLATE_FILE).read_text()
    config = path / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        template = json.loads(config.read_text()).get("chat_template")
    except ValueError as e:
        raise ChatTemplateError(f"{config}: not JSON ({e})") from None
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def render(template: str, messages: list[dict], *, bos_token: str = "", eos_token: str = "",
           add_generation_prompt: bool = True) -> str:
    """The prompt text of `messages` ([{"role": "user", "content": "..."}, ...]) under `template`."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ChatTemplateError(f"the chat template refuses these messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                bos_token=bos_token, eos_token=eos_token)
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template cannot be rendered ({type(e).__name__}: {e})") from None
