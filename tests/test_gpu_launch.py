"""Launching on a GPU build, decided on CPU: the GPU id the launcher hands a process,
the device and collective backend under the launcher, the launcher's device count, the lost-peer sentence for
NCCL's errors, and the per-step row check that must come before a gather. References: Paddle's own functions
(``ParallelEnv``, ``_is_cpuonly``, the launcher's ``Device``) with the CUDA test replaced, or numpy."""
import numpy as np
import paddle
import pytest

from mtl import cli
from mtl.commands import launch
from mtl.core.errors import ConfigError
from mtl.core.runtime import gpu_index, resolve_device


@pytest.fixture
def cuda_build(monkeypatch):
    """Paddle's ``core.is_compiled_with_cuda`` answers True (the CPU build's code then takes the CUDA branches)."""
    from paddle.base import core

    monkeypatch.setattr(core, "is_compiled_with_cuda", lambda: True)


@pytest.mark.parametrize("selected", ["0", "3", "0,1", "2,3", " 1 , 0"])
def test_the_gpu_id_is_the_first_of_flags_selected_gpus_as_paddle_reads_it(monkeypatch, cuda_build, selected):
    """The launcher sets FLAGS_selected_gpus to "0,1" when it starts one process on two GPUs; int() of it failed."""
    monkeypatch.setenv("FLAGS_selected_gpus", selected.replace(" ", ""))
    assert gpu_index() == paddle.distributed.ParallelEnv().device_id
    assert gpu_index({"FLAGS_selected_gpus": selected}) == int(selected.split(",")[0])


def test_without_the_flag_the_local_rank_then_zero():
    assert gpu_index({"PADDLE_LOCAL_RANK": "2"}) == 2
    assert gpu_index({}) == 0


def test_a_cpu_job_on_a_cuda_build_asks_for_gloo_which_paddle_then_picks(cuda_build):
    """Root cause: ``init_parallel_env`` treats backend 'auto' as NCCL on any CUDA build (``_is_cpuonly``) and sets
    the process's GPU as the place, whatever device was set before; the job's CPU device asks for gloo."""
    from paddle.distributed.parallel import _is_cpuonly

    launched = {"PADDLE_TRAINERS_NUM": "2", "FLAGS_selected_gpus": "1"}
    assert not _is_cpuonly("auto")  # what the launcher's environment alone gives: NCCL and a GPU place
    device, env = resolve_device("cpu", has_cuda=True, compiled_with_cuda=True, environ=launched)
    assert device == "cpu" and _is_cpuonly(env["PADDLE_DISTRI_BACKEND"])
    device, env = resolve_device("auto", has_cuda=False, compiled_with_cuda=True, environ=launched)
    assert device == "cpu" and _is_cpuonly(env["PADDLE_DISTRI_BACKEND"])  # a CUDA build on a machine without GPU


def test_gpu_jobs_keep_nccl_and_take_their_own_gpu():
    launched = {"PADDLE_TRAINERS_NUM": "2", "FLAGS_selected_gpus": "1"}
    assert resolve_device("auto", True, True, launched) == ("gpu:1", {})
    assert resolve_device("gpu", True, True, {"FLAGS_selected_gpus": "0,1"}) == ("gpu:0", {})
    assert resolve_device("cpu", False, False, launched) == ("cpu", {})  # the CPU build: the launcher chose gloo
    assert resolve_device("cpu", True, True, {"PADDLE_DISTRI_BACKEND": "gloo"}) == ("cpu", {})
    with pytest.raises(ConfigError, match="device 'gpu' was asked for"):
        resolve_device("gpu", has_cuda=False, compiled_with_cuda=True, environ={})


@pytest.mark.parametrize("visible", ["", "0", "0,1", "3,5,7"])
def test_the_launchers_device_count_is_read_as_paddle_reads_it(monkeypatch, visible):
    """``Device.parse_device`` (the launcher's) counts CUDA_VISIBLE_DEVICES entries, an empty value as one."""
    from paddle.distributed.launch.context.device import Device

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert launch.visible_gpu_count() == Device.parse_device().count


@pytest.mark.parametrize("args, gpus, stops", [
    (["--nproc_per_node", "4", "train.py"], 2, True),
    (["--nproc_per_node=2", "train.py"], 2, False),
    (["--nproc_per_node", "1", "train.py"], 2, False),
    (["train.py"], 2, False),  # no count given: the launcher starts one process per GPU
    (["--nproc_per_node", "4", "--devices", "0,0,0,0", "train.py"], 1, False),
    (["--nproc_per_node", "3", "--gpus", "0,1", "train.py"], 8, True),
    (["--nproc_per_node", "2", "train.py"], 1, True),  # CUDA_VISIBLE_DEVICES="" counts as one
    (["--nproc_per_node", "4", "train.py"], None, False),  # unknown count: the launcher decides
])
def test_more_processes_than_launcher_devices_stop_with_a_sentence(args, gpus, stops):
    """Reference: the launcher's own device list (``Device.get_selected_devices``) is shorter than the process
    count exactly when process i would index past it."""
    from paddle.distributed.launch.context.device import Device

    problem = launch.device_problem(args, gpu_build=True, visible_gpus=gpus)
    assert (problem is not None) == stops
    if gpus is not None:
        device = Device()
        devices = launch._option(args, ("--devices", "--gpus"))
        device.labels = devices if devices else [str(i) for i in range(gpus)]
        nproc = int(launch._option(args, ("--nproc_per_node",)) or len(device.labels))
        assert (nproc > len(device.get_selected_devices(devices or ""))) == stops
    if stops:
        assert problem.count(";") == 1 and "use --nproc_per_node" in problem
    assert launch.device_problem(args, gpu_build=False, visible_gpus=gpus) is None


# Paddle's wording of NCCL failures (phi/core/enforce.h build_nvidia_error_msg, nccl_tools.h NCCL_CHECK)
NCCL_LOST = ["(External) NCCL error(6), remote process exited or there was a network error. ",
             "(External) NCCL error(2), unhandled system error (run with NCCL_DEBUG=INFO for details). ",
             "Failed, NCCL error /paddle/phi/core/distributed/nccl_comm_context.cc:120 'remote process exited or "
             "there was a network error'"]


@pytest.mark.parametrize("text", NCCL_LOST + ["[/gloo/transport/tcp/pair.cc:589] Connection closed by peer"])
def test_a_lost_peer_is_recognised_for_nccl_and_gloo(monkeypatch, text):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    assert cli._lost_peer(OSError(text)) and cli._lost_peer(RuntimeError(text))
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "1")
    assert not cli._lost_peer(RuntimeError(text))


def test_other_errors_are_not_a_lost_peer(monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    for text in ["(External) NCCL error(5), invalid usage (run with NCCL_DEBUG=WARN for details). ",
                 "(InvalidArgument) The shape of input x does not match", "Connection reset"]:
        assert not cli._lost_peer(RuntimeError(text))


def test_an_nccl_error_raised_as_oserror_reaches_the_lost_peer_sentence(monkeypatch, capsys):
    """Paddle raises External errors (NCCL's) as OSError, which ``mtl.cli.run`` used not to catch."""
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    monkeypatch.setattr(cli, "LOST_PEER_DELAY", 0.0)

    def failing(args):
        raise OSError(NCCL_LOST[0])

    with pytest.raises(SystemExit) as stop:
        cli.run(failing, None)
    assert stop.value.code == 1
    assert "error (rank 1): lost contact with another process in a collective" in capsys.readouterr().err


class _TwoRanks:
    """``dist.all_reduce`` of a 2-rank world whose other rank holds ``other``: the MAX of both (numpy)."""

    def __init__(self, other):
        self.other = np.asarray(other, dtype=np.int64)
        self.calls = 0

    def __call__(self, tensor, op=None):
        self.calls += 1
        tensor.set_value(paddle.to_tensor(np.maximum(tensor.numpy(), self.other)))


def _fake_world(monkeypatch, other):
    from mtl.parallel import distributed

    fake = _TwoRanks(other)
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed.dist, "all_reduce", fake)
    return fake


@pytest.mark.parametrize("mine, theirs, uneven", [([4, 0, 2], [4, 0, 2], []), ([4, 0, 2], [4, 0, 3], [2]),
                                                  ([3, 1, 0], [5, 1, 2], [0, 2])])
def test_the_steps_agreement_finds_uneven_rows_in_its_one_all_reduce(monkeypatch, mine, theirs, uneven):
    """The other rank's flags are (no error, no stop, its counts, their negatives); the MAX of both vectors tells
    every rank max and min of each count (reference: numpy comparison of the two lists)."""
    from mtl.parallel import distributed

    fake = _fake_world(monkeypatch, [0, 0, *theirs, *[-c for c in theirs]])
    text, stop, found = distributed.agree(None, False, counts=mine)
    assert (text, stop, fake.calls) == (None, False, 1)
    assert found == [i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b] == uneven


def test_the_strategy_stops_a_step_with_uneven_rows_before_any_head_gathers(monkeypatch):
    """On NCCL an all-gather of unequal shapes hangs or writes past its buffer before a check after it could
    report; the strategy's per-step agreement (already one all-reduce) carries every task's row count."""
    from mtl.architectures.hard import Hard
    from mtl.headkit.base import Head
    from mtl.parallel.strategy import ParallelStrategy

    model = paddle.nn.Layer()
    model.backbone = paddle.nn.Linear(2, 2)
    model.architecture = Hard(2, ["a", "b"])  # a joint model's parts, as ParallelStrategy reads them
    model.heads = paddle.nn.LayerDict({"a": Head(2), "b": Head(2)})
    strategy = ParallelStrategy(model)
    strategy.world, strategy.rank = 2, 0
    batch = {"b": {"image": np.zeros((3, 2)), "label": np.zeros(3)}}  # task a absent from this step
    assert strategy.batch_rows(batch) == [0, 3]
    _fake_world(monkeypatch, [0, 0, 0, 4, 0, -4])
    with pytest.raises(RuntimeError, match=r"different numbers of rows of task\(s\) \['b'\] in this step"):
        strategy.agree(None, False, batch)
    _fake_world(monkeypatch, [0, 0, 0, 3, 0, -3])
    assert strategy.agree(None, False, batch) == (None, False)
