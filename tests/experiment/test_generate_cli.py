"""generate.py: a continuation printed on stdout and the speed on stderr; bad input in one line, exit 2."""
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
