"""generate.py: a continuation printed on stdout and the speed on stderr; many prompts (--prompts_file) a line
each in --out, over every device and process; bad input in one line, exit 2."""
import json
import os
import subprocess
import sys

import pytest

TINY = "tests/fixtures/hf_tiny/llama"


def run(*args):
    return subprocess.run([sys.executable, "generate.py", *args], capture_output=True, text=True, timeout=600)


SLOW = pytest.mark.slow  # each a fresh process that loads JAX: the default run keeps two


@pytest.mark.parametrize("args, says", [
    (["--workdir", TINY, "--prompt", "  "], "the prompt is empty"),
    pytest.param(["--workdir", TINY], "--prompt TEXT or --prompt_file FILE", marks=SLOW),
    pytest.param(["--workdir", TINY, "--prompt_file", "no/such/file.txt"], "no such file", marks=SLOW),
    pytest.param(["--workdir", TINY, "--prompt", "x", "--top_p", "0"], "top_p", marks=SLOW),
    pytest.param(["--workdir", "no/such/run", "--prompt", "x"], "--workdir no/such/run: no such file or folder; "
                 "--workdir takes a run folder (train.py, import_hf.py), a Hugging Face folder, a GGUF file or the "
                 "name of a packaged model (smollm2, gemma3)", marks=SLOW),  # issue 67, case 12
    (["--workdir", TINY, "--prompt_file", "tests/fixtures/generate/latin1.txt"],
     "--prompt_file tests/fixtures/generate/latin1.txt: not UTF-8 text (byte 0xe9 at position 3); save it as UTF-8"),
    pytest.param(["--workdir", TINY, "--prompt", "x", "--max_new_tokens", "2.5"], "--max_new_tokens", marks=SLOW),
    pytest.param(["--workdir", TINY, "--prompt", "x", "--stop", ""], "--stop '': an empty string ends nothing",
                 marks=SLOW),
    (["--workdir", TINY, "--prompt", "x", "--method", "warp"], "unknown method 'warp'"),
    (["--workdir", TINY, "--prompts_file", "p.jsonl"], "--prompts_file needs --out OUT.jsonl"),
    pytest.param(["--workdir", TINY, "--prompts_file", "p.jsonl", "--out", "o.jsonl", "--prompt", "x"],
                 "--prompts_file replaces --prompt", marks=SLOW),
    pytest.param(["--workdir", TINY, "--prompt", "x", "--out", "o.jsonl"], "--out goes with --prompts_file", marks=SLOW),
    pytest.param(["--workdir", TINY, "--prompts_file", "no/such.jsonl", "--out", "o.jsonl"],
                 "--prompts_file no/such.jsonl: no such file", marks=SLOW),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    done = run(*args)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip() and "WARNING" not in line]
    assert says in done.stderr and len(lines) <= 2, done.stderr


@pytest.mark.slow
def test_a_checkpoint_continues_a_prompt_with_a_method(tmp_path):
    done = run("--workdir", TINY, "--prompt", "The quick brown fox", "--max_new_tokens", "5", "--method", "yarn")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() and "new tokens; prefill of" in done.stderr and "YaRN" not in done.stdout


def test_the_harness_without_lm_eval_names_its_extra(monkeypatch):
    """Issue 67, case 7: `python -m experiment.harness` without lm_eval was a ModuleNotFoundError traceback."""
    hidden = ("import runpy, sys; sys.modules['lm_eval'] = None; "
              "runpy.run_module('experiment.harness', run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", hidden, "--model", "lengthx"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == ("error: the lm-evaluation-harness is not installed: "
                                                    "pip install -e '.[harness]' (lm_eval==0.4.13)")
    for name in ["lm_eval", *(m for m in sys.modules if m.startswith("lm_eval."))]:  # (where it is installed)
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "experiment.harness", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"experiment.harness: .*pip install -e '.\[harness\]'"):
        import experiment.harness  # noqa: F401


def test_a_missing_source_is_named_with_the_kinds_it_may_be(tmp_path):
    """Issue 67, case 12: a --workdir that does not exist was "not a folder with a Hugging Face checkpoint"."""
    from experiment.generation import open_source
    for missing in (tmp_path / "nothing", "runs/x/y", "./here"):
        with pytest.raises(FileNotFoundError, match=rf"^--workdir {missing}: no such file or folder; --workdir takes "
                                                     rf"a run folder .*a GGUF file or the name of a packaged model"):
            open_source(missing)
    with pytest.raises(FileNotFoundError, match="^pretrained=nothing/at/all: no such file or folder; pretrained= "):
        open_source("nothing/at/all", "pretrained=")


def signalled(times: int, nth: int, *args: str) -> subprocess.CompletedProcess:
    """generate.py with SIGINT sent `times` times to itself at the `nth` token's draw."""
    wrapper = (
        "import os, runpy, signal, sys\n"
        "import models.generate as g\n"
        "real, calls = g._sample, [0]\n"
        "def sample(*a, **k):\n"
        "    calls[0] += 1\n"
        f"    for _ in range({times} if calls[0] == {nth} else 0):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(*a, **k)\n"
        "g._sample = sample\n"
        "sys.argv = ['generate.py', *sys.argv[1:]]\n"
        "runpy.run_path('generate.py', run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", wrapper, *args], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_ctrl_c_stops_between_two_tokens_and_prints_the_text_so_far():
    """Issue 67, cases 5 and 6: Ctrl-C during generation never stopped it (every token was generated, then
    "interrupted as the command finished"); a second Ctrl-C spoke of checkpoints and records."""
    args = ["--workdir", TINY, "--prompt", "The quick brown fox", "--max_new_tokens", "40", "--stop", "@@"]
    once = signalled(1, 3, *args)
    assert once.returncode == 130 and "Traceback" not in once.stderr, once.stderr[-2000:]
    assert once.stderr.strip().splitlines()[-1] == ("interrupted after 3 of 40 new tokens (the text so far is printed "
                                                    "above); generate.py writes no file")
    full = run(*args)
    assert full.returncode == 0 and once.stdout.strip() and full.stdout.startswith(once.stdout.rstrip("\n"))
    twice = signalled(2, 3, *args)
    assert twice.returncode == 130 and twice.stderr.strip().splitlines()[-1] == (
        "second Ctrl-C: stopped at once; generate.py writes no file, so nothing is left half-written")


# ---- many prompts: generate.py --prompts_file (experiment/generate_many.py) ------------------------------

MANY = ['"The quick brown fox"', '{"prompt": "Once upon a time", "id": 7}', '', '"A"', '"jumps over the lazy dog"']


def _many(tmp_path, out, **kw):
    """The tiny checkpoint's continuations of MANY's four prompts into `out` (5 new tokens, 2 a batch)."""
    from experiment import generate_many
    from experiment.generation import open_source
    source = open_source(TINY)
    prompts = generate_many.read_prompts(tmp_path / "prompts.jsonl")
    ids = [source.encode(p) for p in prompts]
    done = generate_many.generate_many(source.model(), prompts, ids, out, decode=source.decode, batch_size=2,
                                       max_new_tokens=5, stop=source.stop_ids, tokenizer=source.tokenizer, **kw)
    return source, prompts, ids, done


def test_many_prompts_become_one_line_each_in_order_and_a_rerun_goes_on_after_them(tmp_path):
    from experiment import generate_many
    from models.generate import generate
    (tmp_path / "prompts.jsonl").write_text("\n".join(MANY) + "\n")
    out = tmp_path / "out.jsonl"
    source, prompts, ids, done = _many(tmp_path, out)
    assert prompts == ["The quick brown fox", "Once upon a time", "A", "jumps over the lazy dog"] and done == 4
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    model = source.model()
    assert [line["text"] for line in lines] == [source.decode(generate(model, [x], 5, stop=source.stop_ids,
                                                                       tokenizer=source.tokenizer)[0]) for x in ids]
    assert [(line["index"], line["prompt"], line["prompt_tokens"]) for line in lines] == [
        (i, p, len(x)) for i, (p, x) in enumerate(zip(prompts, ids))]
    whole = out.read_text()
    out.write_text("".join(whole.splitlines(keepends=True)[:2]) + whole.splitlines()[2][:20])  # a line cut short
    assert _many(tmp_path, out)[3] == 2 and out.read_text() == whole  # the last batch again, nothing twice
    assert _many(tmp_path, out)[3] == 0 and out.read_text() == whole
    (tmp_path / "prompts.jsonl").write_text('"another prompt"\n')
    with pytest.raises(ValueError, match=r"--out .* holds line 1 for another prompt than --prompts_file's prompt 1"):
        _many(tmp_path, out)
    for text, says in (('"x"\nnot json\n', "line 2: not JSON"), ('{"text": "x"}\n', "line 1: no prompt text"),
                       ("\n\n", "no prompts in it")):
        (tmp_path / "bad.jsonl").write_text(text)
        with pytest.raises(ValueError, match=says):
            generate_many.read_prompts(tmp_path / "bad.jsonl")


MANY_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
process_id, port, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
from experiment.runtime import distributed
if port != "-":
    distributed.initialize(f"127.0.0.1:{{port}}", 2, process_id)
import jax, pathlib
from tests.experiment.test_generate_cli import _many
_many(pathlib.Path(workdir), pathlib.Path(workdir) / f"out{{process_id}}.jsonl", temperature=1.0, seed=3)
print(json.dumps({{"devices": jax.device_count()}}))
"""


@pytest.mark.slow  # one device, 8 simulated devices, 2 processes of 2: ~1 min on 2 cores
def test_many_prompts_on_eight_devices_and_two_processes_write_one_devices_lines(tmp_path):
    """Sampled (each batch its own seed), so that a batch run with another's seed would show."""
    from tests.conftest import REPO
    from tests.experiment.runtime.test_distributed import start_two_processes
    from tests.helpers import EIGHT_DEVICES
    (tmp_path / "prompts.jsonl").write_text("\n".join(MANY * 3) + "\n")  # 12 prompts: 6 batches
    _many(tmp_path, tmp_path / "one.jsonl", temperature=1.0, seed=3)
    one = (tmp_path / "one.jsonl").read_text()
    script = MANY_SCRIPT.format(repo=str(REPO))
    eight = subprocess.run([sys.executable, "-c", script, "0", "-", str(tmp_path)], cwd=REPO, text=True,
                           capture_output=True, env={**os.environ, **EIGHT_DEVICES}, timeout=900)
    assert eight.returncode == 0, eight.stderr[-3000:]
    assert json.loads(eight.stdout.strip().splitlines()[-1])["devices"] == 8
    assert (tmp_path / "out0.jsonl").read_text() == one
    (tmp_path / "out0.jsonl").unlink()
    procs = start_two_processes(MANY_SCRIPT, tmp_path, 0)
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert (tmp_path / "out0.jsonl").read_text() == one and not (tmp_path / "out1.jsonl").exists()  # process 0 writes
