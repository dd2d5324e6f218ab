"""Which samples a step reads, computed here from the schedule and each task's sample order (not by the step
pipeline itself): the reference the data tests compare against."""


def step_samples(dataset, step: int) -> dict:
    """``{task: sample indices}`` of the whole global batch of ``step`` of a :class:`mtl.data.steps.StepDataset`."""
    return {task: dataset.orders[task].indices(dataset.schedule.consumed(task, step), n)
            for task, n in dataset.schedule.plan(step).items()}
