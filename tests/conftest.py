"""Shared fixtures: tiny Hugging Face Qwen3 checkpoints, a tiny tokenizer, the run's seed.

Tests run on the CPU unless marked ``gpu``; without CUDA, Triton is switched to its interpreter
here, before any test module imports a kernel (``TRITON_INTERPRET`` is read when a ``@triton.jit``
function is defined). Weights are random with the run's seed, printed in the report header and in
the summary at the end: a fixed one (``DEFAULT_SEED``) unless ``TEST_SEED`` says otherwise, so
that CI and a plain ``pytest`` run the same draws every time; ``TEST_SEED=random`` draws a fresh
one (to look for seed-dependent failures), ``TEST_SEED=N`` repeats a run.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # Tiny tensors: waking a thread pool costs more than it saves (several ms per op on 2 cores).
    torch.set_num_threads(1)

import pytest  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SEED = 20240531     # any fixed value: CI must not fail on one draw and pass on the next


def _run_seed(text: str | None) -> int:
    if not text:
        return DEFAULT_SEED
    if text.strip().lower() == "random":
        return random.SystemRandom().randrange(2**31)
    try:
        return int(text) % 2**31
    except ValueError:
        return None     # refused in pytest_configure, where pytest reports it in one line


SEED = _run_seed(os.environ.get("TEST_SEED"))


def pytest_configure(config):
    if SEED is None:
        raise pytest.UsageError(f"TEST_SEED must be an integer or 'random', got {os.environ['TEST_SEED']!r}")


def _seed_line() -> str:
    given = (os.environ.get("TEST_SEED") or "").strip().lower()
    how = "fixed default" if not given else "drawn fresh: TEST_SEED=random" if given == "random" else "from TEST_SEED"
    return f"test seed: {SEED} ({how}; TEST_SEED={SEED} repeats this run, TEST_SEED=random draws a fresh one)"


def code_commit() -> str | None:
    """The commit a results row of a run from this tree should name, found independently of
    megakernel.results: MEGAKERNEL_GIT_COMMIT, else the checkout's HEAD, else the commit a ``git
    archive`` copy wrote into megakernel/ARCHIVED_COMMIT; None where nothing says (an sdist, a zip)."""
    import re
    import subprocess
    if os.environ.get("MEGAKERNEL_GIT_COMMIT"):
        return os.environ["MEGAKERNEL_GIT_COMMIT"]
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip():
        return r.stdout.strip()
    archived = (REPO / "megakernel" / "ARCHIVED_COMMIT").read_text().strip()
    return archived if re.fullmatch(r"[0-9a-f]{40}", archived) else None


def pytest_report_header(config):
    return _seed_line()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _own_plan_cache(tmp_path_factory, monkeypatch):
    """Each test its own cache folder, so its plan cache (megakernel.plans) starts empty: plans
    tuned on this machine stay out. Its ``random`` folder links to the user's, so random weights
    (0.6b's take tens of seconds to make) are made once, as outside the tests."""
    from models.qwen3.weights import cache_dir
    shared = cache_dir() / "random"
    shared.mkdir(parents=True, exist_ok=True)
    own = tmp_path_factory.mktemp("mkcache")
    (own / "random").symlink_to(shared, target_is_directory=True)
    monkeypatch.setenv("MEGAKERNEL_CACHE", str(own))


@pytest.fixture
def seed(request) -> int:
    """This run's seed, varied per test so tests do not share their random draws."""
    s = (SEED + sum(map(ord, request.node.nodeid)) * 7919) % 2**31
    print(f"seed {s} (run seed {SEED})")
    return s


# ---------------------------------------------------------------------------------------------
# Tiny checkpoints


@dataclass
class Tiny:
    folder: Path
    hf: object            # transformers Qwen3ForCausalLM, float32, eval mode
    vocab_size: int


def hf_config(vocab=320, hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, tie=False,
              **extra):
    from transformers import Qwen3Config
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       head_dim=head_dim, tie_word_embeddings=tie, max_position_embeddings=512,
                       rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, **extra)


def randomize(model, seed: int):
    """Well-conditioned random weights, drawn independently of our own loader: norm weights near
    1 and projections scaled by fan-in, so logits have clear margins (HF's 0.02-std init gives
    near-uniform logits whose greedy choice is a coin toss at float32 rounding)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)


def build_checkpoint(folder: Path, seed: int, dtype=torch.float32, max_shard_size=None,
                     tokenizer: bool = False, **cfg) -> Tiny:
    """A tiny HF checkpoint in ``folder`` (shape keywords as ``hf_config``), saved in ``dtype``,
    sharded where ``max_shard_size`` is given, with a tokenizer.json of the same vocabulary where
    ``tokenizer`` is true."""
    from transformers import Qwen3ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tok = None
    if tokenizer:
        tok = build_tokenizer(cfg.get("vocab", 320))
        tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(hf_config(**cfg)).float().eval()
    randomize(model, seed)
    if dtype != torch.float32:
        model = model.to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    return Tiny(folder, model, model.config.vocab_size)


@pytest.fixture
def tiny_checkpoint(tmp_path, seed):
    """A factory: ``tiny_checkpoint(**shape)`` writes a tiny HF checkpoint and returns a ``Tiny``."""
    count = iter(range(1000))

    def make(**kwargs) -> Tiny:
        return build_checkpoint(tmp_path / f"ckpt{next(count)}", seed, **kwargs)

    return make


# ---------------------------------------------------------------------------------------------
# A tiny tokenizer

WORDS = ("the a an of to in is was and or but if then when where what who which that this it he she they "
         "we you i me my your his her their our cat dog bird fish tree house car road city river sea sky sun "
         "moon star day night time year man woman child people world life hand eye head water fire earth "
         "air stone light dark red blue green black white big small old new good bad long short high low "
         "first last next other same different great little own right left run walk see look come go make "
         "take give find think know want tell say ask work call try use feel become leave put mean keep let "
         "begin seem help show hear play move live believe bring happen write sit stand lose pay meet "
         "include continue set learn change lead understand watch follow stop create speak read allow add "
         "spend grow open offer remember love consider appear buy wait serve die send expect build stay fall "
         "cut reach kill remain paris france capital river").split()


def build_tokenizer(vocab_size: int):
    """A word-level tokenizer of exactly ``vocab_size`` ids: Qwen's special tokens first, then
    words (and filler tokens). Decoding joins words with spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    words = list(dict.fromkeys(WORDS)) + ["\n", "user", "assistant"] + [f"w{i}" for i in range(vocab_size)]
    vocab = {t: i for i, t in enumerate((specials + words)[:vocab_size])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split("\n", "isolated"),
                                                 pre_tokenizers.Split(Regex(" +"), "removed")])
    tok.decoder = decoders.WordPiece(prefix="##")   # joins with spaces, no space before "##" pieces
    tok.add_special_tokens(specials[:3])
    return tok


@pytest.fixture
def cli(tmp_path):
    """Run ``python -m megakernel.generate ARGS`` in a subprocess: the repo importable, no network,
    an empty Hugging Face cache (so no real checkpoint is found by name) and a private cache for
    random weights, ``tmp_path / "mkcache"``. Returns the CompletedProcess (text mode);
    ``module=`` runs another module (``megakernel`` for ``python -m megakernel``)."""
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"), MEGAKERNEL_CACHE=str(tmp_path / "mkcache"),
               PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(torch.get_num_threads()))
    env.pop("HF_HUB_CACHE", None)

    def run(*args, timeout=120, module="megakernel.generate"):
        return subprocess.run([sys.executable, "-m", module, *map(str, args)], env=env,
                              capture_output=True, text=True, timeout=timeout, cwd=REPO)

    return run


def pytest_terminal_summary(terminalreporter):
    # also here: -q hides the header, and a failure is only reproducible with its seed
    terminalreporter.write_line(_seed_line())
