"""``torch.compile`` for the training step, behind ``train.compile``: auto, true or false.

``true`` compiles the model's forward (and so its backward) with inductor and dynamic
shapes, since every batch has other lengths; if compiling fails on this machine the run
stops with one line. ``false`` trains eagerly. ``auto`` compiles only on device types
where ``experiments/bench_train.py --compile`` measured the compiled step faster than the
eager one; a failure then falls back to eager with a note.

The dropout schedule (``train.early_dropout``) moves the probability every step;
``layers.Dropout`` reads it from a tensor inside the graph, so that recompiles nothing. A
forward that dynamo still recompiles past its ``recompile_limit`` would run eagerly from then
on in silence: here the run says so in its log and goes on eagerly, whatever the setting.

On CPU every compiled set-up measured (whole model, per layer, max-autotune, length
buckets; ``bench_train.py --compile --json`` records them, docs/results.md renders the
records) was slower than eager, so ``auto`` is eager on CPU. On an H200, in one bench run
(experiments/results/gpu-check-h200/bench_train_compiled_whole_bf16.json, 3 interleaved
rounds), the whole model compiled with dynamic shapes stepped 117,366 target tokens/s median
(113,158-161,926 a round) under bf16 against eager's 81,514 (55,681-118,673), after 86 s of
compiling: the rounds overlap. The compiled step in tf32, the precision ``auto`` takes there,
was not measured, and that default itself awaits a paired run (precision.py; the GPU issue,
61, measures both): ``auto`` stays eager on CUDA until then. MPS is not measured. A device
type joins ``COMPILE_WINS`` when a measurement says so.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from seq2seq.config_checks import setting_of
from seq2seq.errors import Seq2SeqError

COMPILE_WINS: frozenset[str] = frozenset()  # device types where compiling measured faster


def wants_compile(value: object, device: torch.device) -> bool:
    setting = setting_of(value)
    return setting == "true" or (setting == "auto" and device.type in COMPILE_WINS)


def compile_errors() -> tuple[type[BaseException], ...]:
    """What a failing compile raises: dynamo's errors (a backend that fails is wrapped in
    one), inductor's, which a lazily compiled backward raises unwrapped, and ``stopped()``'s;
    the last two where this torch has them (InductorError came in 2.7, the other in 2.6)."""
    import torch._dynamo.exc
    import torch._inductor.exc

    newer = (
        getattr(torch._inductor.exc, "InductorError", None),
        getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", None),
    )
    return (torch._dynamo.exc.TorchDynamoException, *(e for e in newer if e is not None))


def compiled(module: nn.Module, backend: str = "inductor") -> Callable:
    """``module``'s forward compiled with dynamic shapes; the parameters stay the module's,
    so checkpoints, validation and the optimizer see the same tensors. A forward that dynamo
    would recompile past its ``recompile_limit`` raises instead of silently running eagerly
    from then on (see ``stopped``)."""
    try:
        forward = torch.compile(module, backend=backend, dynamic=True)
    except RuntimeError as e:  # e.g. a Python version that dynamo does not support yet
        raise failure(e) from None

    # The switch has this name from torch 2.7 (2.6 had it as fail_on_cache_limit_hit); without
    # it dynamo runs eagerly past its limit, with a warning, and stopped() never sees it.
    known = hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit")
    strict = {"fail_on_recompile_limit_hit": True} if known else {}

    def call(*args: object, **kwargs: object) -> object:
        with torch._dynamo.config.patch(**strict):
            return forward(*args, **kwargs)

    return call


def fallback(error: BaseException, setting: object, step: int) -> str:
    """What a compiled ``step`` that failed to compile means for the run, in the note that
    says so: with ``train.compile: true`` the run ends in one line (this raises); with
    ``auto`` it goes on eagerly, from this same step. A compile that worked and then stopped
    (``stopped``) goes on eagerly either way."""
    why = stopped(error)
    if why:
        return f"note: torch.compile stopped at step {step}: {why}; training eagerly from here"
    if setting_of(setting) == "true":
        raise failure(error) from None
    return f"note: torch.compile failed here ({reason(error)}); training eagerly"


def stopped(error: BaseException) -> str | None:
    """Why compiling stopped, when ``error`` is dynamo giving up on recompiling (compiling
    worked, then a guard failed at every step: the run can go on eagerly); else None."""
    import torch._dynamo.exc

    stop = getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", None)  # raised from 2.7 on
    if stop is None or not isinstance(error, stop):
        return None
    limit = getattr(torch._dynamo.config, "recompile_limit", None)  # as old as the error
    return f"dynamo recompiled past its limit of {limit} graphs (TORCH_LOGS=recompiles says why)"


def reason(error: BaseException) -> str:
    """The first line of the backend's own error, not of dynamo's wrapper around it."""
    error = getattr(error, "inner_exception", None) or error
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def failure(error: BaseException) -> Seq2SeqError:
    return Seq2SeqError(
        f"train.compile: torch.compile failed on this machine ({reason(error)}); "
        "train with --set train.compile=false"
    )
