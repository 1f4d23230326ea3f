"""A checkpoint's text side: its tokenizer (corpora/tokenizers.py) and chat template, as generation
reads them (experiment/generation.py's Source, RULER's prompts in experiment/evals/ruler.py). Light
on purpose: evaluation imports it without the converter or training."""
from __future__ import annotations

import dataclasses

from models.generation.chat import ChatTemplateError, render


@dataclasses.dataclass(frozen=True)
class Text:
    """`tokenizer`: a corpora/tokenizers.py tokenizer; `chat_template`: the Jinja text (None: none);
    `bos_token`: the text the template's `bos_token` stands for (a checkpoint's; "" where unknown)."""
    tokenizer: object
    chat_template: str | None = None
    bos_token: str = ""

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Ids of `text`; `special`: with the tokenizer's own special tokens (a BOS where a pretrained
        tokenizer's post-processor adds one), as transformers' tokenizer(text) encodes it."""
        tok = self.tokenizer
        if tok.kind == "pretrained":
            return list(tok.tokenizer.encode(text, add_special_tokens=special).ids)
        return list(tok.hf_tokenizer().encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def chat(self, messages: list[dict]) -> str:
        """The text of `messages` under the chat template, its generation prompt added (a
        ChatTemplateError where there is no template)."""
        if not self.chat_template:
            raise ChatTemplateError("this checkpoint has no chat template (GGUF tokenizer.chat_template, HF "
                                    "chat_template); give the prompt as the model should read it")
        tok = self.tokenizer
        eos = tok.tokenizer.id_to_token(tok.eos_id) if tok.kind == "pretrained" else ""
        return render(self.chat_template, messages, bos_token=self.bos_token, eos_token=eos or "")

    @property
    def stop_ids(self) -> list[int]:
        """Token ids that end a generated text: a pretrained checkpoint's end of sequence (a run trained
        here ends lines with its end-of-line token, which is no end of text)."""
        return [int(self.tokenizer.eos_id)] if self.tokenizer.kind == "pretrained" else []
