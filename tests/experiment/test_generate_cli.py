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
    pytest.param(["--workdir", "no/such/run", "--prompt", "x"], "no/such/run", marks=SLOW),
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
