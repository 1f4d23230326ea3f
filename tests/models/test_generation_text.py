"""The text side that generation and RULER share (models/generation/text.py): a checkpoint opened for
generation (experiment/generation.py) and RULER's prompts (experiment/evals/ruler.py) encode, render
the chat template and stop alike, over the tiny Llama checkpoint's real tokenizer."""
import json
import shutil

import pytest

from corpora import ruler as task_lib
from experiment.evals import ruler
from experiment.generation import open_source
from models.generation.chat import ChatTemplateError, render
from models.generation.text import Text
from tests.gguf_files import HF_TINY

TEMPLATE = "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
MESSAGES = [{"role": "user", "content": "Where is the key?"}]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text") / "llama"
    shutil.copytree(HF_TINY / "llama", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": 2, "bos_token_id": 1}))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return open_source(folder)


def test_a_source_encodes_chats_and_stops_as_its_text_side(source):
    text = source.text
    bos, eos = (source.tokenizer.tokenizer.id_to_token(i) for i in (1, 2))
    assert text.chat(MESSAGES) == render(TEMPLATE, MESSAGES, bos_token=bos, eos_token=eos)
    assert source.chat(MESSAGES) == text.encode(text.chat(MESSAGES), special=False)
    assert source.encode("The key is") == text.encode("The key is")  # (this tokenizer adds no BOS)
    assert source.decode(source.encode("The key is", special=False)) == "The key is"
    assert source.stop_ids == text.stop_ids == [2]


def test_ruler_prompts_in_the_chat_template_hold_the_answer_prefix_in_the_assistants_turn(source):
    text = Text(source.tokenizer, "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                                  "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (built,) = task_lib.build("niah_single_1", 512, 1, 3, ruler.prompter(text, "chat"))
    prompt = text.decode(built.ids)
    assert prompt.startswith("<|user|>") and "<|assistant|>" in prompt
    assert prompt.rstrip().endswith(built.example.answer_prefix.strip())


def test_no_chat_template_is_a_clear_error(source):
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Text(source.tokenizer).chat(MESSAGES)
    with pytest.raises(ValueError, match="no chat template .* drop --chat"):
        open_source(HF_TINY / "llama").chat(MESSAGES)
    with pytest.raises(ValueError, match="needs the model's chat template"):
        ruler.prompter(Text(source.tokenizer), "chat")
