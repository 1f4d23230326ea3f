"""models/config.py: the decoder's config and the names its options take, without JAX; the decoder
and the attention package give every name a meaning."""
import subprocess
import sys

from models import config
from models.attention import paths
from models.decoder import ACTIVATIONS, DTYPES
from tests.conftest import REPO


def test_every_name_the_config_takes_has_its_jax_meaning_and_no_other():
    assert set(ACTIVATIONS) == set(config.ACTIVATION_NAMES)
    assert set(DTYPES) == set(config.DTYPE_NAMES)
    assert config.ATTENTION_PATHS == ("auto", *paths.PATHS) and config.DEFAULT_PATH in config.ATTENTION_PATHS
    assert config.ModelConfig().attention == config.DEFAULT_PATH
    assert config.ModelConfig().attention_block == config.DEFAULT_BLOCK


def test_importing_the_config_loads_no_jax():
    code = ("import sys, models, models.config, models.attention\n"
            "models.config.ModelConfig.from_config({'attention': 'dense'}, 10)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'jax', 'flax', 'orbax', 'optax'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr
