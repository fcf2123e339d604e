"""Where training runs: threads on every device, the GPU bound before the process group,
rank 0's data preparation outside the process group's timeout, DDP without buffer broadcasts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fakes import FakeCuda
from helpers import child_env

from seq2seq.run import runtime
from seq2seq.run.runlog import write_environment

REPO = Path(__file__).resolve().parents[1]

# Two gloo ranks whose process group times out after 3 s, while rank 0 "prepares" for 8 s;
# then a DDP step with rank 1's position tables made different from rank 0's.
JOB = """
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from helpers import tiny_model
from seq2seq.run.runtime import (
    distributed, exit_rank, leave_process_group, main_first, setup_runtime
)

dist.init_process_group("gloo", timeout=timedelta(seconds=3))
rt = setup_runtime("cpu", threads=1)
print(f"rank {rt.rank}: {main_first(rt, lambda: time.sleep(8) or 'prepared')}", flush=True)
model = tiny_model().train()
with torch.no_grad():
    model.src_embed.positions += rt.rank  # a buffer DDP would overwrite with rank 0's
src = torch.tensor([[5, 6, 7, 2]])
distributed(model, rt)(src, src).sum().backward()
print(f"rank {rt.rank}: positions shifted by {model.src_embed.positions[0, 1].item():.0f}")
if leave_process_group():  # a torchrun rank: its exit code, not the interpreter's teardown
    print(f"rank {rt.rank}: left the group, group initialized: {dist.is_initialized()}")
    exit_rank(0)
raise SystemExit(5)
"""


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> subprocess.CompletedProcess:
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("torch.distributed with the gloo backend is not available in this torch build")
    script = tmp_path_factory.mktemp("job") / "job.py"
    script.write_text(JOB)
    env = child_env(PYTHONPATH=f"{REPO}:{REPO / 'tests'}")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    return subprocess.run(
        [*command, str(script)], env=env, capture_output=True, text=True, timeout=300
    )


def test_rank_0_prepares_for_longer_than_the_process_groups_timeout(two_ranks):
    assert two_ranks.returncode == 0, two_ranks.stderr[-3000:]
    assert "rank 0: prepared" in two_ranks.stdout and "rank 1: prepared" in two_ranks.stdout


def test_each_rank_leaves_the_group_then_exits_with_its_code(two_ranks):
    assert two_ranks.returncode == 0, two_ranks.stderr[-3000:]  # not SystemExit(5)
    for rank in (0, 1):
        assert f"rank {rank}: left the group, group initialized: False" in two_ranks.stdout


def test_a_process_without_a_group_has_none_to_leave():
    assert not dist.is_initialized() and runtime.leave_process_group() is False


def test_ddp_leaves_each_ranks_buffers_alone(two_ranks):
    assert two_ranks.returncode == 0, two_ranks.stderr[-3000:]
    # sin(0) + 0 at position 0, column 1 is cos(0) = 1: rank 1's table kept its own shift
    assert "rank 0: positions shifted by 1" in two_ranks.stdout
    assert "rank 1: positions shifted by 2" in two_ranks.stdout


@pytest.fixture
def fake(monkeypatch):
    """Four CUDA devices that refuse what torch refuses (``fakes.FakeCuda``)."""
    fake = FakeCuda(count=4).install(monkeypatch)
    threads = torch.get_num_threads()
    yield fake
    torch.set_num_threads(threads)
    fake.restore()


@pytest.fixture
def fake_gpus(fake):
    """The calls ``setup_runtime`` makes on the fake's four devices."""
    return fake.calls


def test_the_fake_gpus_refuse_what_torch_refuses(fake_gpus, monkeypatch):
    with pytest.raises(ValueError, match="Expected a torch.device with a specified index"):
        torch.cuda.set_device(torch.device("cuda"))  # the crash of every default GPU run
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.cuda.set_device(7)
    with pytest.raises(AssertionError, match="Invalid device id"):  # torch's own function
        torch.cuda.get_device_capability(7)
    with pytest.raises(ValueError, match="device_id with index"):
        dist.init_process_group("nccl", device_id=torch.device("cuda"))
    with pytest.raises(ValueError, match="does not match the current compilation"):
        dist.init_process_group("nccl", device_id=torch.device("mps", 0))
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="environment variable MASTER_ADDR expected"):
        dist.init_process_group("nccl", rank=0, world_size=2)
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.new_group(backend="gloo")
    assert fake_gpus == [] and not dist.is_initialized()


def test_the_fake_gpus_accept_what_torch_accepts(fake, monkeypatch):
    torch.cuda.set_device(-1)  # "a no-op if this argument is negative"
    assert fake.calls == [] and torch.cuda.current_device() == 0
    assert torch.cuda.get_device_capability("cuda:3") == (9, 0)
    assert torch.cuda.get_device_name() == "Fake GPU 0"
    assert torch.cuda.mem_get_info(torch.device("cuda")) == (fake.memory - fake.used, fake.memory)
    # torch's is_bf16_supported, reading the current device's properties
    assert torch.cuda.is_bf16_supported(including_emulation=False)
    fake.capability = (7, 5)  # a T4: bf16 emulated only
    assert not torch.cuda.is_bf16_supported(including_emulation=False)
    assert torch.cuda.is_bf16_supported()
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    gpu = torch.device("cuda", 1)
    dist.init_process_group("nccl", world_size=2, device_id=gpu)
    assert dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) == (1, 2)
    with pytest.raises(ValueError, match="initialize the default process group twice"):
        dist.init_process_group("nccl", world_size=2, device_id=gpu)
    dist.new_group(backend="gloo")  # bound to the default group's device, as torch binds it
    assert fake.calls[-1] == ("new_group", "gloo", gpu)


def test_each_fake_takes_the_arguments_of_torchs_function():
    """Same parameters, in the same order: a call that torch takes reaches the fake alike."""
    import inspect as pyinspect

    fake = FakeCuda()  # not installed: torch's functions are in place
    cuda = ("is_available", "device_count", "current_device", "set_device", "mem_get_info")
    distributed = ("init_process_group", "is_initialized", "get_rank", "get_world_size")
    faked = [(torch.cuda, name) for name in (*cuda, "get_device_properties")]
    faked += [(dist, name) for name in (*distributed, "new_group")]
    for module, name in faked:
        real = pyinspect.signature(getattr(module, name)).parameters
        assert list(pyinspect.signature(getattr(fake, name)).parameters) == list(real), name


@pytest.mark.parametrize("asked, index", [("auto", 0), ("cuda", 0), ("cuda:2", 2)])
def test_every_cuda_device_resolves_to_an_index_that_set_device_takes(fake_gpus, asked, index):
    # Every entry point (train, translate, evaluate, attention, serve, export, seq2seq.load,
    # bench_train, gpu_check) reaches the device through setup_runtime.
    rt = runtime.setup_runtime(asked)
    assert rt.device == torch.device("cuda", index)
    assert fake_gpus == [("set_device", rt.device)]


def test_cuda_without_an_index_is_the_current_device(fake_gpus):
    torch.cuda.set_device(3)
    fake_gpus.clear()
    assert runtime.setup_runtime("cuda").device == torch.device("cuda", 3)


@pytest.mark.parametrize("setting", ["auto", "all"])
def test_on_cuda_the_attention_setting_chooses_sdpas_kernels(fake_gpus, setting):
    runtime.setup_runtime("cuda", attention=setting)
    on = runtime.sdpa_kernels_on()
    assert on.get("cudnn", False) == (setting == "all")  # cuDNN plans anew for every shape
    assert on["flash"] and on["mem_efficient"] and on["math"]


def test_entry_points_share_one_device_default():
    import inspect as pyinspect

    from seq2seq.config import TrainConfig
    from seq2seq.decoding.translate import Translator
    from seq2seq.explorer.notebook import load

    assert TrainConfig().device == "auto"
    assert pyinspect.signature(load).parameters["device"].default == "auto"
    assert pyinspect.signature(Translator.from_run).parameters["device"].default == "auto"


def test_train_threads_are_set_on_a_gpu_too(fake_gpus):
    runtime.setup_runtime("cuda", threads=3)
    assert torch.get_num_threads() == 3  # SentencePiece and the batches run on them


def test_under_torchrun_the_gpu_is_bound_before_the_process_group(fake_gpus, monkeypatch, tmp_path):
    env = {"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # what torchrun sets too
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # a 64-core host whose CPU quota allows 8: each of the 4 local ranks takes 2 threads
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    (tmp_path / "cpu.max").write_text("800000 100000\n")
    monkeypatch.setattr(runtime, "CGROUP", tmp_path)
    rt = runtime.setup_runtime("cuda")
    gpu = torch.device("cuda", 2)
    assert (rt.rank, rt.world, rt.device) == (2, 4, gpu)
    assert fake_gpus == [("set_device", gpu), ("init_process_group", "nccl", gpu)]
    assert torch.get_num_threads() == 2  # the usable CPUs over the local ranks, not 64 // 4


@pytest.mark.cuda
def test_on_a_gpu_setup_runtime_binds_the_device():
    rt = runtime.setup_runtime("cuda", threads=2)
    assert rt.device == torch.device("cuda", torch.cuda.current_device())
    assert torch.get_num_threads() == 2


def test_environment_names_the_gpu_and_its_libraries(tmp_path, monkeypatch, tf32_switch):
    tf32_switch.fp32_precision = "tf32"  # a user's own, after which the legacy getter raises
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "Some GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 27, 3))
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    for device in ("cuda:0", "cpu"):
        write_environment(
            tmp_path / device, runtime.Runtime(device=torch.device(device)), "tf32", None
        )
    [gpu] = json.loads((tmp_path / "cuda:0" / "environment.json").read_text())["segments"]
    assert (gpu["device"], gpu["gpu"], gpu["gpu_capability"]) == ("cuda:0", "Some GPU", "9.0")
    assert (gpu["cuda"], gpu["cudnn"], gpu["nccl"]) == ("12.8", 90100, "2.27.3")
    assert (gpu["precision"], gpu["tf32_matmul"]) == ("fp32, TF32 matrix multiplies", True)
    [cpu] = json.loads((tmp_path / "cpu" / "environment.json").read_text())["segments"]
    assert cpu["device"] == "cpu" and not {"gpu", "cuda", "cudnn", "nccl"} & cpu.keys()
    assert cpu["precision"] == "fp32"


def test_a_second_signal_stops_at_once_saying_what_was_last_saved():
    said, before = [], signal.getsignal(signal.SIGINT)
    with runtime.StopSignals(said.append) as signals:
        signal.raise_signal(signal.SIGINT)  # the first: a flag, the step finishes and saves
        assert signals.received == "SIGINT" and said == []
        signals.saved = "last saved: step 3, in RUN/last.safetensors"
        with pytest.raises(KeyboardInterrupt, match="SIGTERM: stopped at once; last saved: step 3"):
            signal.raise_signal(signal.SIGTERM)  # the second, during validation say
    assert said == [
        "a second SIGTERM: stopped at once; last saved: step 3, in RUN/last.safetensors"
    ]
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.parametrize("given", [None, "8", "1024"])
def test_the_cpus_kernel_caches_are_bounded_unless_the_user_set_them(given, tmp_path):
    """A fresh process: setup_runtime bounds oneDNN's and ideep's caches before any kernel is
    made, keeps a capacity the user gave, and environment.json says which were in force."""
    env = {k: v for k, v in child_env().items() if k not in runtime.KERNEL_CACHES}
    if given is not None:
        env[runtime.KERNEL_CACHES[0]] = given  # the other one left to the package
    code = (
        "import json, os, sys; from pathlib import Path\n"
        "from seq2seq.run.runtime import setup_runtime, KERNEL_CACHES\n"
        "from seq2seq.run.runlog import write_environment\n"
        "rt = setup_runtime('cpu')\n"
        "write_environment(Path(sys.argv[1]), rt, 'fp32', None)\n"
        "print(json.dumps({name: os.environ[name] for name in KERNEL_CACHES}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    first, second = runtime.KERNEL_CACHES
    expected = {first: given or runtime.KERNEL_CACHE_DEFAULT, second: runtime.KERNEL_CACHE_DEFAULT}
    assert json.loads(done.stdout) == expected
    recorded = json.loads((tmp_path / "environment.json").read_text())
    assert recorded["segments"][-1]["kernel_caches"] == expected
