"""Small builders shared by the test modules (pytest puts tests/ on sys.path)."""

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from seq2seq.config import Config, DataConfig, ModelConfig, TrainConfig
from seq2seq.model.transformer import Seq2Seq, build_model
from seq2seq.training.entry import train

V = 20  # vocabulary of the tiny models: 4 specials + 16 tokens
# Each reads a tensor's values on the host, so on a GPU waits for the device: Python numbers
# from a tensor, copies to the CPU, and nonzero (its output's size is the count it finds).
HOST_READS = (
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "item",
    "tolist",
    "cpu",
    "numpy",
    "nonzero",
)

# A tiny run: a 1+1-layer d_model 32 model on the committed sample corpus (40 pairs), a step a
# fraction of a second on any device; ``--set`` strings, to which each user adds its own
# batches, budgets, precision and device. The tests, experiments/gpu_check.py and
# experiments/bench_train.py --quick train it.
TINY_RUN = [
    "data.data=sample",
    "data.vocab_size=200",  # SentencePiece raises it to the 308 its byte pieces need
    "model.d_model=32",
    "model.n_heads=4",
    "model.d_ff=64",
    "model.n_enc_layers=1",
    "model.n_dec_layers=1",
    "train.attention_sentences=0",
]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts: this one's, with one OpenMP thread (torch
    in a child would otherwise start one a core, beside the suite's other workers and
    jobs), then ``extra``."""
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def tiny_model(n_kv_heads=None, d_latent=None, seed=0, **overrides) -> Seq2Seq:
    """A 2+2-layer, d_model 32 model in eval mode, seeded; ``overrides`` go to ModelConfig."""
    torch.manual_seed(seed)
    sizes = dict(
        src_vocab_size=V,
        tgt_vocab_size=V,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_enc_layers=2,
        n_dec_layers=2,
        dropout=0.0,
        max_positions=64,
    )
    config = ModelConfig(n_kv_heads=n_kv_heads, d_latent=d_latent, **{**sizes, **overrides})
    return build_model(config).eval()


def train_sample_run(
    run: Path,
    *,
    steps: int,
    validate_every: int,
    lr: float = 1e-3,
    dropout: float = 0.0,
    n_dec_layers: int = 1,
    max_positions: int = 64,
    max_len: int = 30,
    max_epochs: int = 100,
    precision: str = "fp32",
) -> Path:
    """A d_model 32 model trained on data/sample into ``run``, unless one is there already."""
    if not (run / "model.safetensors").is_file():
        config = Config(
            model=ModelConfig(
                d_model=32,
                n_heads=4,
                d_ff=64,
                n_enc_layers=1,
                n_dec_layers=n_dec_layers,
                dropout=dropout,
                max_positions=max_positions,
            ),
            data=DataConfig(data="sample", vocab_size=200, max_len=max_len),
            train=TrainConfig(
                max_steps=steps,
                max_epochs=max_epochs,
                validate_every=validate_every,
                warmup_steps=10,
                lr=lr,
                attention_sentences=0,
                threads=1,
                precision=precision,
                device="cpu",
                early_dropout=None,  # model.dropout from the first step, as given
            ),
        )
        train(config, run, overwrite=True, progress=False)
    return run


def tiny_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained on data/sample, once per test session (shared with test_evaluate)."""
    return train_sample_run(
        tmp_path_factory.getbasetemp() / "tiny_run", steps=60, validate_every=30
    )


def _host_read(name: str):
    def read(*args, **kwargs):
        raise AssertionError(f"a tensor's values read on the host: {name}")

    return read


def _indexed(original, name: str):
    """``Tensor.__getitem__`` or ``__setitem__`` that refuses a boolean mask as an index: the
    result's size is the mask's count (a nonzero inside)."""

    def index(self, key, *value):
        keys = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, torch.Tensor) and k.dtype in (torch.bool, torch.uint8) for k in keys):
            raise AssertionError(f"a tensor's values read on the host: {name} by a boolean mask")
        return original(self, key, *value)

    return index


@contextlib.contextmanager
def no_host_reads() -> Iterator[None]:
    """Within it, a read of a tensor's values on the host (``HOST_READS``, ``torch.nonzero``
    and indexing by a boolean mask) raises AssertionError: the CPU's stand-in for
    ``torch.cuda.set_sync_debug_mode("error")``."""
    with pytest.MonkeyPatch.context() as patch:
        for name in HOST_READS:
            patch.setattr(torch.Tensor, name, _host_read(name))
        patch.setattr(torch, "nonzero", _host_read("torch.nonzero"))
        for name in ("__getitem__", "__setitem__"):
            patch.setattr(torch.Tensor, name, _indexed(getattr(torch.Tensor, name), name))
        yield


def eos_probs_as_searched(model: Seq2Seq, src: torch.Tensor, steps: list[int]) -> list[float]:
    """P(EOS) at each of ``steps`` as a search reads it: one token at a time through the
    decoder's cache, each step's distribution taken from its last position.

    Shapes: src (1, S); steps: Tq ids -> Tq floats
    """
    from seq2seq.model.transformer import padding_mask
    from seq2seq.vocab import BOS_ID, EOS_ID

    with torch.inference_mode():
        src_mask = padding_mask(src)
        memory, cache, found = model.encode(src, src_mask), model.new_cache(), []
        for token in [BOS_ID, *steps[:-1]]:
            logits, _ = model.decode(torch.tensor([[token]]), memory, src_mask, cache=cache)
            found.append(logits[0, -1].float().softmax(-1)[EOS_ID].item())
        return found


def assert_trained_alike(model, got: dict, expected: dict, rtol: float, atol: float) -> None:
    """Each of ``model``'s tensors in ``got`` close to ``expected``'s, the K rows of every
    packed in_proj.bias aside: softmax ignores a shift shared by all keys, so their true
    gradient is 0, and what backward gives is rounding noise, which Adam scales up to a full
    step."""
    d, d_kv = model.config.d_model, model.encoder_layers[0].self_attn.d_kv
    for name, value in expected.items():
        mine = got[name]
        if name.endswith("in_proj.bias"):
            value, mine = (torch.cat([t[:d], t[d + d_kv :]]) for t in (value, mine))
        torch.testing.assert_close(mine, value, rtol=rtol, atol=atol, msg=name)
