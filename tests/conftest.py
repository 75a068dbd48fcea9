"""Shared fixtures: tiny configs that run in milliseconds on a CPU."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

# Tiny test models gain nothing from intra-op threads, and two threads on a loaded 2-core machine (one pytest-xdist
# worker per core) are many times slower than one: one thread here and in every process a test starts.
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

torch.set_num_threads(1)

# Triton's CPU interpreter for attn_implementation "relpos_triton" (tests/test_triton_shaw.py) where there is no GPU:
# read when triton decorates its own library functions, so set before anything imports triton (torch._dynamo does).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def checkout_first_on_path() -> str:
    """PYTHONPATH for a process a test starts: this checkout, ahead of what the environment already puts there (an
    overlay of packages, as the GPU machine's carried wheels, stays in effect)."""
    return os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))


def major_minor(version: str) -> tuple[int, int]:
    """(3, 6) for "3.6.0+git1234"."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def relpos_triton_unavailable() -> str | None:
    """Why attn_implementation "relpos_triton" cannot run its kernels here, or None: they need triton, and a GPU or
    Triton's interpreter from triton 3.5 on (before 3.4 triton.autotune wants a GPU driver, 3.4 has no float64
    tl.dot), from 3.7 on with NumPy 2.4 or newer (3.5 and 3.6 index with a one-element array, which NumPy 2.4
    refuses)."""
    if importlib.util.find_spec("triton") is None:
        return "needs triton"
    if os.environ.get("TRITON_INTERPRET") == "1":
        import numpy
        import triton

        version = major_minor(triton.__version__)
        if version < (3, 5) or (version < (3, 7) and major_minor(numpy.__version__) >= (2, 4)):
            return (f"Triton's interpreter runs these kernels from triton 3.5 on, from 3.7 on with NumPy 2.4 or newer; "
                    f"triton {triton.__version__} and NumPy {numpy.__version__} are installed")
    elif not torch.cuda.is_available():
        return "needs a GPU or Triton's interpreter (TRITON_INTERPRET=1)"
    return None


RELPOS_TRITON_UNAVAILABLE = relpos_triton_unavailable()
requires_relpos_triton = pytest.mark.skipif(RELPOS_TRITON_UNAVAILABLE is not None,
                                            reason=str(RELPOS_TRITON_UNAVAILABLE))
# Set by .ci/run: CI must run the relpos_triton tests (Triton's interpreter on the CPU), never skip them.
REQUIRE_RELPOS_TRITON = "HF_RELPOS_TESTS_REQUIRE_TRITON"


def pytest_configure(config: pytest.Config) -> None:
    """With HF_RELPOS_TESTS_REQUIRE_TRITON=1, a machine where the relpos_triton tests would be skipped is a usage error
    before any test runs, not a pass without them."""
    if os.environ.get(REQUIRE_RELPOS_TRITON) == "1" and RELPOS_TRITON_UNAVAILABLE is not None:
        raise pytest.UsageError(f"{REQUIRE_RELPOS_TRITON}=1, but the relpos_triton tests cannot run here: "
                                f"{RELPOS_TRITON_UNAVAILABLE}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the imports and the collection made (torch, transformers, every test module: most of a worker's heap) is
    kept out of the garbage collector's full passes from here on (gc.freeze, after one collection): the Trainer runs
    gc.collect at every train() (accelerate's free_memory), and each such pass walked that whole heap (0.3 s here)."""
    import gc

    gc.collect()
    gc.freeze()


from transformers import AttentionInterface  # noqa: E402
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402

import hf_relpos  # noqa: E402
from hf_relpos.model.positions import built_in_schemes  # noqa: E402
from hf_relpos.testing import tiny_config  # noqa: E402

# The schemes hf_relpos ships (what a fresh process running an experiment or a script has registered).
BUILT_IN_SCHEMES = built_in_schemes()

# A kernel of transformers' own, not hf_relpos': its SDPA function and mask under another name, standing in for
# flash_attention_2/3 and Hub kernels (which need a GPU and packages this machine lacks).
TRANSFORMERS_KERNEL = "transformers_sdpa_for_tests"
AttentionInterface.register(TRANSFORMERS_KERNEL, sdpa_attention_forward)
AttentionMaskInterface.register(TRANSFORMERS_KERNEL, sdpa_mask)


def sinusoid_by_loop(position: int, dim: int) -> torch.Tensor:
    """Vaswani et al. (2017) sec. 3.5 for one position, term by term in float64: [sin(p / 10000^(2i/d)) | cos(...)],
    the sines at the paper's even dimensions 2i < d, the cosines at its odd ones 2i + 1 < d."""
    return torch.tensor(
        [math.sin(position / 10000 ** (2 * t / dim)) for t in range((dim + 1) // 2)]
        + [math.cos(position / 10000 ** (2 * t / dim)) for t in range(dim // 2)],
        dtype=torch.float64,
    )


def warnings_logged(caplog, run) -> list[str]:
    """The warnings `run()` logs, transformers' once-per-process memory cleared first."""
    logging.Logger.warning_once.cache_clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run()
    return [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]


def tiny_model(position_scheme: str = "shaw", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return hf_relpos.RelPosTransformerForConditionalGeneration(tiny_config(position_scheme, **overrides)).eval()


def spread_model(position_scheme: str, kernel: str, layer_norm_position: str = "post", **overrides):
    """A tiny float64 model whose weights are drawn wide (N(0, 0.5)), so that greedy and beam outputs vary from step
    to step instead of repeating one token."""
    torch.manual_seed(0)
    config = tiny_config(position_scheme, d_model=16, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2,
                         decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, pad_token_id=0,
                         eos_token_id=2, bos_token_id=1, decoder_start_token_id=1, attn_implementation=kernel,
                         layer_norm_position=layer_norm_position, tie_word_embeddings=False,
                         **hf_relpos.RelPosTransformerConfig.held_fields(position_scheme, {
                             "relative_attention_num_buckets": 8, "relative_attention_max_distance": 10}), **overrides)
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    return model


def assert_cached_generation_equals_uncached(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                            num_beams: int) -> None:
    """generate with and without the KV cache (10 tokens, greedy or beam search): the same tokens, logits within
    float32 noise."""
    results = []
    for use_cache in (True, False):
        with torch.no_grad():
            results.append(model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams,
                                          do_sample=False, max_new_tokens=10, min_new_tokens=10, use_cache=use_cache,
                                          output_logits=True, return_dict_in_generate=True))
    cached, uncached = results
    assert torch.equal(cached.sequences, uncached.sequences)
    assert (torch.stack(cached.logits) - torch.stack(uncached.logits)).abs().max() < 1e-5


def run_without_hf_relpos(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run `script` in a fresh Python in which importing hf_relpos fails (a machine with transformers only), offline
    and with its own remote-code module cache under `tmp_path`."""
    blocked = 'import sys\nsys.modules["hf_relpos"] = None  # importing hf_relpos now raises ImportError\n'
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", blocked + textwrap.dedent(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def pyproject() -> dict[str, Any]:
    """The repository's pyproject.toml, parsed."""
    with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)


def console_script(name: str) -> str:
    """`module:function` of a console command the package installs (pyproject.toml's [project.scripts])."""
    scripts = pyproject()["project"]["scripts"]
    assert name in scripts, f"{name} is not a console script of pyproject.toml ({sorted(scripts)})"
    return scripts[name]


def console_script_main(name: str) -> Callable[..., Any]:
    """The function that the console command `name` runs, imported."""
    module_name, _, function = console_script(name).partition(":")
    return getattr(importlib.import_module(module_name), function)


# Every tests/test_scheme_*.py registers a scheme when imported, and lists its float64 oracle (`ORACLE_CASES`,
# test_positions.py's reference signature): imported here, before any test module is collected, its scheme is in
# SCHEMES and joins every test parametrized over the schemes, with no other edit.
SCHEME_TEST_MODULES = [importlib.import_module(path.stem) for path in sorted(Path(__file__).parent.glob("test_scheme_*.py"))]
SCHEME_ORACLES = [case for module in SCHEME_TEST_MODULES for case in module.ORACLE_CASES]
SCHEMES = tuple(hf_relpos.POSITION_SCHEMES)
RELATIVE_SCHEMES = tuple(scheme for scheme in SCHEMES if scheme not in ("absolute", "none"))
# Schemes whose encoder tells a sequence from its reversal without an end marker: not the position-blind control, and
# not alibi, whose encoder bias -m |i - j| is symmetric (test_model.py checks that it is mirror-equivariant), nor
# those a tests/test_scheme_*.py names in its ORDER_BLIND_SCHEMES (a symmetric scheme of its own).
ORDER_BLIND_SCHEMES = ("none", "alibi")


def order_aware_schemes(schemes: Iterable[str], scheme_test_modules: Iterable[Any]) -> tuple[str, ...]:
    """`schemes` but ORDER_BLIND_SCHEMES and those each scheme test module lists in its `ORDER_BLIND_SCHEMES`."""
    blind = set(ORDER_BLIND_SCHEMES).union(*(getattr(module, "ORDER_BLIND_SCHEMES", ()) for module in
                                             scheme_test_modules))
    return tuple(scheme for scheme in schemes if scheme not in blind)


ORDER_AWARE_SCHEMES = order_aware_schemes(SCHEMES, SCHEME_TEST_MODULES)


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)


# Sentence pairs a tiny model memorises in a few seconds (`memorised_model_folder`).
MEMORISED_PAIRS = (
    ("The cat sleeps.", "Die Katze schläft."),
    ("The dog sees the cat.", "Der Hund sieht die Katze."),
    ("The small bird sings.", "Der kleine Vogel singt."),
    ("The house is red.", "Das Haus ist rot."),
    ("The tree is big.", "Der Baum ist groß."),
    ("The cat sees the bird.", "Die Katze sieht den Vogel."),
)


def train_memorising_model(pairs, steps: int):
    """A tiny Shaw model (and its joint tokenizer) trained with Adam on `pairs` until greedy decoding reproduces each
    target exactly (asserted); returns the model in eval mode (generation max_length 20), the tokenizer and the
    hypotheses."""
    from hf_relpos.translation.tokenization import special_token_ids, train_joint_tokenizer

    torch.manual_seed(0)
    tokenizer = train_joint_tokenizer([text for pair in list(pairs) * 4 for text in pair], vocab_size=456)
    config = hf_relpos.RelPosTransformerConfig(
        position_scheme="shaw", vocab_size=len(tokenizer), d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0,
        max_relative_position=4,
        layer_norm_position="pre", **special_token_ids(tokenizer),
    )
    model = hf_relpos.RelPosTransformerForConditionalGeneration(config)
    sources = tokenizer([source for source, _ in pairs], padding=True, return_tensors="pt")
    labels = tokenizer([target for _, target in pairs], padding=True, return_tensors="pt").input_ids
    labels[labels == tokenizer.pad_token_id] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains fastest on one thread
    try:
        for _ in range(steps):
            loss = model(**sources, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.generation_config.max_length = 20
    hypotheses = tokenizer.batch_decode(model.generate(**sources), skip_special_tokens=True)
    assert hypotheses == [target for _, target in pairs], hypotheses
    return model, tokenizer, hypotheses


@pytest.fixture(scope="session")
def memorised_model_folder(tmp_path_factory) -> Path:
    """A tiny Shaw model that translates each source of MEMORISED_PAIRS into its target exactly, saved with its
    tokenizer as a model folder (generation config: greedy, max_length 20)."""
    model, tokenizer, _ = train_memorising_model(MEMORISED_PAIRS, steps=150)
    folder = tmp_path_factory.mktemp("memorised") / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class RecordMatmuls(TorchDispatchMode):
    """The operand shapes of every matmul (mm, bmm, addmm, baddbmm) run inside it."""

    MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
               torch.ops.aten.baddbmm.default}

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.MATMULS:
            self.shapes.append([tuple(arg.shape) for arg in args if isinstance(arg, torch.Tensor)])
        return func(*args, **(kwargs or {}))


def make_unwritable(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """`folder` behaves as a folder without write permission even for root: creating a temporary file or folder in it
    (how the package writes every output, `hf_relpos.publish.files`, and probes a folder) fails with EACCES."""
    import errno
    import tempfile

    for name in ("mkstemp", "mkdtemp"):
        create = getattr(tempfile, name)

        def refuse(*args, create=create, **kwargs):
            if Path(kwargs.get("dir") or "").resolve() == folder.resolve():
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            return create(*args, **kwargs)

        monkeypatch.setattr(tempfile, name, refuse)


def load_experiment(script: Path, monkeypatch):
    """A script (experiments/X.py) imported as a module, registered in sys.modules for the test's duration, with its
    folder on sys.path, as when it runs as a script."""
    monkeypatch.syspath_prepend(str(script.parent))   # its sibling scripts, as when it runs as a script
    spec = importlib.util.spec_from_file_location(script.stem, script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def die_while_writing(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """From now on, a file opened for writing in `path`'s folder whose name contains `path`'s name (`path` itself or
    a temporary file for it) gets half of its first write, flushed to disk, then the process "dies"
    (KeyboardInterrupt): what a kill while writing leaves on disk."""
    real_open = open

    class DyingFile:
        def __init__(self, handle):
            self.handle = handle

        def write(self, text):
            self.handle.write(text[: max(1, len(text) // 2)])
            self.handle.flush()
            raise KeyboardInterrupt(f"simulated kill while writing {path}")

        def __enter__(self):
            return self

        def __exit__(self, *exception):
            self.handle.close()

        def __getattr__(self, name):
            return getattr(self.handle, name)

    def dying_open(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        written = not isinstance(file, int) and any(flag in mode for flag in "wax")
        if written and Path(file).parent == path.parent and path.name in Path(file).name:
            return DyingFile(handle)
        return handle

    monkeypatch.setattr("builtins.open", dying_open)
    monkeypatch.setattr("io.open", dying_open)


class Killed(Exception):
    """A training run stopped from a test, as a kill would stop it."""


def run_killed_after_checkpoint(monkeypatch: pytest.MonkeyPatch, run: Callable[[list[str]], Any], argv: list[str],
                                step: int) -> None:
    """`run(argv)` stopped right after it saved its checkpoint of `step` (a kill between two saves)."""
    from transformers import Seq2SeqTrainer

    save_checkpoint = Seq2SeqTrainer._save_checkpoint

    def killed_after_the_checkpoint(self, model, trial):
        save_checkpoint(self, model, trial)
        if self.state.global_step == step:
            raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(Seq2SeqTrainer, "_save_checkpoint", killed_after_the_checkpoint)
        with pytest.raises(Killed):
            run(argv)


def hub_error(error_class: type[Exception], message: str) -> Exception:
    """An error of huggingface_hub's `error_class` (RepositoryNotFoundError, GatedRepoError) as hf_raise_for_status
    raises it for a response, without a response object."""
    error = error_class.__new__(error_class)
    Exception.__init__(error, message)
    return error


def unreachable_hub(monkeypatch: pytest.MonkeyPatch, cache: Path) -> None:
    """No network: the Hub's model_info fails to connect, and the local Hub cache is the empty folder `cache`."""
    def unreachable(self, repo_id, **kwargs):
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr("huggingface_hub.HfApi.model_info", unreachable)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))

