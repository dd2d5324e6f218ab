"""Step batches: independent of the process count, pure in (seed, step), epochs without repeats."""
import numpy as np
import pytest

from mtl.core.errors import ConfigError
from mtl.data.scheduler import JointSchedule, SampleSchedule
from mtl.data.steps import SampleOrder, StepDataset, check_divisible
from mtl.readers.synthetic import SyntheticReader
from tests.references.steps import step_samples


def test_sample_order_is_a_permutation_per_epoch():
    order = SampleOrder(10, seed=5)
    first, second = order.indices(0, 10), order.indices(10, 10)
    assert sorted(first) == list(range(10)) and sorted(second) == list(range(10))
    assert list(first) != list(second)
    np.testing.assert_array_equal(order.indices(7, 6), np.concatenate([first[7:], second[:3]]))


def _readers():
    return {"a": SyntheticReader(num_samples=37, num_classes=5, seed=1),
            "b": SyntheticReader(num_samples=23, num_classes=3, seed=2, target="regression")}


@pytest.mark.parametrize("mode", ["joint", "sample"])
def test_global_batch_does_not_depend_on_world_size(mode):
    readers = _readers()
    if mode == "joint":
        sched = JointSchedule(["a", "b"], [1, 1], 8, seed=0)
    else:
        sched = SampleSchedule(["a", "b"], [0.5, 0.5], 8, seed=0)
    single = StepDataset(sched, readers, seed=3, start_step=0, end_step=12)
    halves = [StepDataset(sched, readers, seed=3, start_step=0, end_step=12, world=2, rank=r) for r in range(2)]
    quarters = [StepDataset(sched, readers, seed=3, start_step=0, end_step=12, world=4, rank=r) for r in range(4)]
    for i in range(12):
        full = single[i]
        for parts in (halves, quarters):
            pieces = [p[i] for p in parts]
            assert set(full) == set(pieces[0])
            for task, sub in full.items():
                for field, value in sub.items():
                    np.testing.assert_array_equal(value, np.concatenate([p[task][field] for p in pieces]))


def test_resume_point_gives_the_same_batches():
    readers = _readers()
    sched = SampleSchedule(["a", "b"], [0.3, 0.7], 4, seed=9)
    full = StepDataset(sched, readers, seed=1, start_step=0, end_step=30)
    tail = StepDataset(SampleSchedule(["a", "b"], [0.3, 0.7], 4, seed=9), readers, seed=1, start_step=17,
                       end_step=30)
    for i in range(13):
        a, b = full[17 + i], tail[i]
        assert a.keys() == b.keys()
        for t in a:
            np.testing.assert_array_equal(a[t]["image"], b[t]["image"])


def test_every_sample_once_per_epoch():
    readers = {"a": SyntheticReader(num_samples=12, num_classes=4, seed=1)}
    sched = JointSchedule(["a"], [1], 4, seed=0)
    ds = StepDataset(sched, readers, seed=0, start_step=0, end_step=3)
    seen = np.concatenate([step_samples(ds, s)["a"] for s in range(3)])
    assert sorted(seen) == list(range(12))


def test_indivisible_sub_batch_is_a_clear_error():
    sched = JointSchedule(["a", "b"], [1, 2], 9, seed=0)   # sizes 3 and 6
    with pytest.raises(ConfigError) as err:
        check_divisible(sched, 2, "job.yaml")
    msg = str(err.value)
    assert "task 'a'" in msg and "3 samples" in msg and "2 processes" in msg and "schedule.batch_size" in msg
    check_divisible(JointSchedule(["a", "b"], [1, 2], 12, seed=0), 2)


def test_loader_with_worker_processes_keeps_step_order():
    from mtl.data.steps import make_loader

    readers = _readers()
    sched = SampleSchedule(["a", "b"], [0.5, 0.5], 4, seed=2)
    ds = StepDataset(sched, readers, seed=1, start_step=5, end_step=17)
    got = list(make_loader(ds, num_workers=2))
    assert len(got) == 12
    for i, batch in enumerate(got):
        want = ds[i]
        assert batch.keys() == want.keys()
        for t in want:
            for field in want[t]:
                np.testing.assert_array_equal(batch[t][field].numpy(), want[t][field])


def test_suggested_batch_sizes_really_split_evenly():
    import re

    from mtl.data.scheduler import largest_remainder

    sched = JointSchedule(list("abcde"), [1, 1, 1, 1, 1], 22, seed=0)
    with pytest.raises(ConfigError) as err:
        check_divisible(sched, 2)
    suggested = [int(x) for x in re.search(r"one of \[([0-9, ]+)\]", str(err.value)).group(1).split(",")]
    assert suggested
    for b in suggested:
        assert all(n % 2 == 0 for n in largest_remainder(b, [1] * 5)), b


def _same_inputs(seed=4):
    """Two tasks over one set of inputs, a label each (as MultiMNIST's left and right digits)."""
    return {"left": SyntheticReader(num_samples=30, num_classes=5, seed=seed),
            "right": SyntheticReader(num_samples=30, num_classes=5, seed=seed)}


@pytest.mark.parametrize("world", [1, 2])
def test_same_rows_reads_one_order_for_every_task(world):
    """Every task's rows of a step are the same samples, epoch after epoch, on every rank: the positions
    ``[6 s, 6 s + 6)`` of the permutations ``RandomState(seed_left + e)`` (numpy, not the step pipeline)."""
    from mtl.data.steps import task_seed

    readers = _same_inputs()
    sched = JointSchedule(["left", "right"], [1, 1], 12, seed=0, same_rows=True)
    parts = [StepDataset(sched, readers, seed=3, start_step=0, end_step=12, world=world, rank=r) for r in
             range(world)]
    seed = task_seed(3, "left")
    for step in range(12):  # 6 rows a task, 30 samples: 5 steps an epoch, so epochs 0, 1 and 2
        positions = np.arange(6 * step, 6 * step + 6)
        expected = [np.random.RandomState(seed + p // 30).permutation(30)[p % 30] for p in positions]
        batch = {t: np.concatenate([d[step][t]["image"] for d in parts]) for t in ("left", "right")}
        np.testing.assert_array_equal(batch["left"], batch["right"])
        np.testing.assert_array_equal(batch["left"], np.stack([readers["left"][int(i)]["image"] for i in expected]))
    apart = StepDataset(JointSchedule(["left", "right"], [1, 1], 12, seed=0), readers, seed=3, start_step=0,
                        end_step=1)
    assert not np.array_equal(apart[0]["left"]["image"], apart[0]["right"]["image"])  # each its own order otherwise


def test_same_rows_is_part_of_the_schedule_a_checkpoint_keeps():
    plain, same = JointSchedule(["a", "b"], [1, 1], 8), JointSchedule(["a", "b"], [1, 1], 8, same_rows=True)
    assert "same_rows" not in plain.state_dict()  # checkpoints written before the key still resume
    assert same.state_dict() == {**plain.state_dict(), "same_rows": True}
    assert same.with_batch_size(16).same_rows and same.order_key("b") == "a" and plain.order_key("b") == "b"
    with pytest.raises(ValueError, match="same sub-batch for every task, the ratios give 'a' 6, 'b' 2"):
        JointSchedule(["a", "b"], [3, 1], 8, same_rows=True)
