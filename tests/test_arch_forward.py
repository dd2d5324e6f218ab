"""The architectures between backbone and heads (mtl/architectures): each forward against a float64 numpy reference
written from the paper's formula (experts and gates, expert mixing, extraction levels, stitch units, task
BatchNorms, adapters), each declared shared-parameter set against the gradients every task's loss actually sends,
and the initialisation and indexing bugs the issue names (constant starts, a PLE gate reading another task's expert).
"""
import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.data.steps import collate
from mtl.train.job import build_job

TASKS = ("a", "b", "c")
MLP = {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [16], "embedding_size": 8}
MLP_BN = dict(MLP, batch_norm=True)
CNN = {"type": "cnn", "channels": [4, 8], "embedding_size": 8}
ARCHITECTURES = {
    "hard_tower": ({"type": "hard", "tower": [6, 5]}, MLP),
    "shared_bottom": ({"type": "hard", "bottom": [7], "tower": [5]}, MLP),
    "mmoe": ({"type": "mmoe", "experts": 3, "expert_layers": [7, 5], "tower": [4]}, MLP),
    "omoe": ({"type": "mmoe", "experts": 3, "expert_layers": [7], "gates": "one"}, MLP),
    "cgc": ({"type": "cgc", "task_experts": 2, "shared_experts": 2, "expert_layers": [6]}, MLP),
    "ple": ({"type": "ple", "levels": 3, "task_experts": 2, "shared_experts": 1, "expert_layers": [6, 5]}, MLP),
    "ple2": ({"type": "ple", "levels": 2, "task_experts": 1, "shared_experts": 2, "expert_layers": [6]}, MLP),
    "cross_stitch": ({"type": "cross_stitch", "layers": [6, 5], "tower": [4]}, MLP),
    "cross_stitch_linear": ({"type": "cross_stitch", "layers": [6, 5], "last_relu": False}, MLP),
    "mmoe_linear": ({"type": "mmoe", "experts": 2, "expert_layers": [7, 5], "last_relu": False}, MLP),
    "ple_linear": ({"type": "ple", "levels": 2, "expert_layers": [6], "last_relu": False}, MLP),
    "task_norm": ({"type": "task_norm", "tower": [5]}, MLP_BN),
    "task_norm_cnn": ({"type": "task_norm"}, CNN),
    "adapters": ({"type": "adapters"}, CNN),
    "cross_stitch_backbone": ({"type": "cross_stitch_backbone", "init": [0.8, 0.2], "tower": [5]}, CNN),
}
LENET = {"type": "lenet", "batch_norm": True, "embedding_size": 8}


def build(architecture, backbone=MLP, seed=3):
    """A three-task job (softmax, regression, softmax heads on synthetic data) with ``architecture``."""
    readers = [{"type": "synthetic", "num_samples": 40, "num_classes": 5, "seed": 1},
               {"type": "synthetic", "num_samples": 40, "seed": 2, "target": "regression"},
               {"type": "synthetic", "num_samples": 40, "num_classes": 3, "seed": 4}]
    heads = [{"type": "softmax"}, {"type": "regression"}, {"type": "softmax"}]
    cfg = load_job(data={"seed": seed, "device": "cpu", "output_dir": "unused", "architecture": architecture,
                         "tasks": [{"name": n, "reader": r, "head": h, "eval": None}
                                   for n, r, h in zip(TASKS, readers, heads)],
                         "backbone": backbone, "schedule": {"batch_size": 12}, "log": {"progress": False}})
    return build_job(cfg, announce_plan=False)


def batch_of(job, rows=6):
    """``{task: {field: tensor}}``: the first ``rows`` samples of every task's reader."""
    return {t.name: {k: paddle.to_tensor(v) for k, v in collate([t.reader[i] for i in range(rows)]).items()}
            for t in job.tasks}


def backbone_features(job, batch, task):
    """The backbone's features of ``task``'s rows (float64 numpy), the backbone run on those rows alone."""
    job.model.architecture.select(task)
    return job.model.backbone({"image": batch[task]["image"]}).numpy().astype(np.float64)


def f64(param):
    return param.numpy().astype(np.float64)


def relu(x):
    return np.maximum(x, 0.0)


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def expert(bank, i, x):
    """Expert i of an ExpertBank on x, one ReLU layer after another (the last one linear without last_relu)."""
    for j, (weight, bias) in enumerate(zip(bank.weights, bank.biases)):
        x = x @ f64(weight)[i] + f64(bias)[i]
        x = relu(x) if bank.last_relu or j < len(bank.weights) - 1 else x
    return x


def gate(layer, x):
    return softmax(x @ f64(layer.linear.weight) + f64(layer.linear.bias))


def tower(architecture, task, h):
    if architecture.towers is None:
        return h
    for layer in architecture.towers[TASKS.index(task)].layers:
        h = relu(h @ f64(layer.weight) + f64(layer.bias))
    return h


def mixture(weights, outputs):
    """sum_i g_i e_i from a gate [n, m] and a list of m expert outputs [n, w]."""
    return sum(weights[:, i:i + 1] * e for i, e in enumerate(outputs))


def reference_mmoe(arch, task, z):
    """Ma et al. eqs. 6-8: f^k(z) = sum_i softmax(W_gk z)_i f_i(z), then the tower."""
    outs = [expert(arch.experts, i, z) for i in range(arch.experts.count)]
    g = gate(arch.gates[0 if arch.one_gate else TASKS.index(task)], z)
    return tower(arch, task, mixture(g, outs))


def reference_ple(arch, task, z):
    """Tang et al. eq. 5, level by level with experts addressed by (owner, index); CGC is one level."""
    t, last = TASKS.index(task), len(arch.levels) - 1
    inputs, shared = [z] * len(TASKS), z
    for j, level in enumerate(arch.levels):
        own = [[expert(level.task_experts[k], i, inputs[k]) for i in range(level.task_experts[k].count)]
               for k in range(len(TASKS))]
        common = [expert(level.shared_experts, i, shared) for i in range(level.shared_experts.count)]
        outputs = [mixture(gate(level.task_gates[k], inputs[k]), own[k] + common) for k in range(len(TASKS))]
        if j < last:
            shared = mixture(gate(level.shared_gate, shared), [e for k in range(len(TASKS)) for e in own[k]] + common)
        inputs = outputs
    return tower(arch, task, inputs[t])


def reference_cross_stitch(arch, task, z):
    """Misra et al. eq. 1 for T columns: h_t^l = sum_s alpha^l_ts relu(W_s^l h_s^(l-1) + b_s^l)."""
    h = [z] * len(TASKS)
    for layer in range(len(arch.stitches)):
        a = [h[s] @ f64(arch.columns[s][layer].weight) + f64(arch.columns[s][layer].bias) for s in range(len(TASKS))]
        a = [relu(x) if arch.last_relu or layer < len(arch.stitches) - 1 else x for x in a]
        h = [sum(f64(arch.stitches[layer][t])[s] * a[s] for s in range(len(TASKS))) for t in range(len(TASKS))]
    return tower(arch, task, h[TASKS.index(task)])


def reference_shared_bottom(arch, task, z):
    """Ma et al. eq. 1: y_k = h^k(f(x)), f one shared ReLU layer, h^k the task's tower."""
    for layer in arch.bottom.layers:
        z = relu(z @ f64(layer.weight) + f64(layer.bias))
    return tower(arch, task, z)


REFERENCES = {"hard_tower": lambda arch, task, z: tower(arch, task, z), "shared_bottom": reference_shared_bottom,
              "mmoe": reference_mmoe,
              "omoe": reference_mmoe, "cgc": reference_ple, "ple": reference_ple, "ple2": reference_ple,
              "cross_stitch": reference_cross_stitch, "cross_stitch_linear": reference_cross_stitch,
              "mmoe_linear": reference_mmoe, "ple_linear": reference_ple}


@pytest.mark.parametrize("name", list(REFERENCES))
def test_forward_matches_the_papers_formula(name):
    job = build(*ARCHITECTURES[name])
    job.model.eval()
    batch = batch_of(job)
    features = job.model.features(batch)
    for task in TASKS:
        expected = REFERENCES[name](job.model.architecture, task, backbone_features(job, batch, task))
        np.testing.assert_allclose(features[task].numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=f"{name} {task}")
        assert features[task].shape[1] == job.model.architecture.output_size == job.task(task).head.feature_size


def reference_task_norm_mlp(job, task, x, running):
    """The MLP with one BatchNorm1D per task in training: Linear, BN_t over task t's rows (batch statistics, biased
    variance), ReLU, Linear; ``running`` -> the updated running statistics (0.9 old + 0.1 batch)."""
    layers = job.model.backbone.layers
    norm = layers[1].by_task[TASKS.index(task)]
    h = x.reshape(len(x), -1) @ f64(layers[0].weight) + f64(layers[0].bias)
    mean, var = h.mean(axis=0), h.var(axis=0)
    h = f64(norm.weight) * (h - mean) / np.sqrt(var + norm._epsilon) + f64(norm.bias)
    running[task] = (0.9 * running[task][0] + 0.1 * mean, 0.9 * running[task][1] + 0.1 * var)
    out = relu(h) @ f64(layers[3].weight) + f64(layers[3].bias)
    return tower(job.model.architecture, task, out)


def written_out(net, x):
    """The lenet and cnn forwards written out layer by layer (what their stages must compose to)."""
    import paddle.nn.functional as F

    if net.registered_name == "lenet":
        h = net.conv1(x)
        h = F.relu(F.max_pool2d(net.bn1(h) if net.bn1 is not None else h, 2))
        h = net.conv2(h)
        h = net.bn2(h) if net.bn2 is not None else h
        h = F.relu(F.max_pool2d(net.dropout(h) if net.dropout is not None else h, 2))
        return F.relu(net.fc(paddle.flatten(h, start_axis=1)))
    for layer in net.body:
        x = layer(x)
    x = paddle.mean(x, axis=[2, 3]) if net.output_bn is None else paddle.flatten(net.output_bn(x), start_axis=1)
    x = net.fc(net.dropout(x) if net.dropout is not None else x)
    return x if net.neck is None else net.neck(x)


@pytest.mark.parametrize("backbone", [CNN, dict(CNN, batch_norm=False),
                                      dict(CNN, output="flatten", embedding_bn=True, dropout=0.3), LENET,
                                      dict(LENET, batch_norm=False)])
def test_a_backbones_stages_compose_to_its_forward(backbone):
    """``Backbone.stages()`` chained give the network written out layer by layer (what cross_stitch_backbone runs
    per column; ``forward`` itself chains them), one stage per block."""
    from mtl.backbones.base import build_backbone

    net = build_backbone(backbone)
    net.eval()
    side = 28 if backbone["type"] == "lenet" else 8
    x = paddle.to_tensor(np.random.RandomState(0).randn(5, 1, side, side).astype(np.float32))
    h = {"image": x}
    for stage in net.stages():
        h = stage(h)
    np.testing.assert_array_equal(h.numpy(), written_out(net, x).numpy())
    np.testing.assert_array_equal(net({"image": x}).numpy(), h.numpy())
    assert len(net.stages()) == 3  # lenet: two conv blocks and fc; cnn [4, 8]: two blocks and the output


def _columns_of(arch, backbone):
    return [backbone] + list(arch.columns)


def test_cross_stitch_backbone_mixes_the_columns_after_every_stage():
    """Misra et al. eq. 1 over whole networks: h_t^l = sum_s alpha^l_ts stage_l^(s)(h_s^(l-1)), the mixing in
    float64 numpy over each column's stages; task t reads tower_t(h_t^L). Each column is the job's backbone config
    drawn on its own (not a copy of the backbone's weights) and every column counts as the backbone's kind."""
    job = build(*ARCHITECTURES["cross_stitch_backbone"])
    model, arch = job.model, job.model.architecture
    model.eval()
    batch = batch_of(job)
    features = model.features(batch)
    columns = _columns_of(arch, model.backbone)
    assert len(columns) == len(TASKS) and len({id(c) for c in columns}) == len(TASKS)
    assert not np.allclose(columns[0].body[0].weight.numpy(), columns[1].body[0].weight.numpy())
    assert type(columns[1]) is type(columns[0])
    for task in TASKS:
        h = [{"image": batch[task]["image"]}] * len(TASKS)
        for layer, stages in enumerate(zip(*[c.stages() for c in columns])):
            a = [stage(x if layer == 0 else paddle.to_tensor(x.astype(np.float32))).numpy().astype(np.float64)
                 for stage, x in zip(stages, h)]
            alpha = np.stack([f64(row) for row in arch.stitches[layer]])
            h = [sum(alpha[t, s] * a[s] for s in range(len(TASKS))) for t in range(len(TASKS))]
        expected = tower(arch, task, h[TASKS.index(task)])
        np.testing.assert_allclose(features[task].numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=task)
    assert np.allclose(f64(arch.stitches[0][1]), [0.1, 0.8, 0.1])  # the paper's convex start


def test_cross_stitch_backbone_with_identity_stitches_is_one_network_per_task():
    """init [1, 0]: no mixing, so task t's features are column t's plain forward (each task its own network)."""
    job = build({"type": "cross_stitch_backbone", "init": [1.0, 0.0]}, CNN)
    model = job.model
    model.eval()
    batch = batch_of(job)
    features = model.features(batch)
    for task, column in zip(TASKS, _columns_of(model.architecture, model.backbone)):
        np.testing.assert_allclose(features[task].numpy(), column({"image": batch[task]["image"]}).numpy(),
                                   rtol=1e-6, atol=1e-7)


def test_task_norm_normalises_each_task_with_its_own_statistics_and_affine():
    job = build(*ARCHITECTURES["task_norm"])
    norms = job.model.backbone.layers[1].by_task
    for i, norm in enumerate(norms):  # distinct affine per task, so that a mix-up shows
        norm.weight.set_value(np.linspace(0.5, 1.5, 16).astype(np.float32) * (i + 1))
        norm.bias.set_value(np.full(16, 0.1 * i, np.float32))
    running = {t: (f64(norms[i]._mean), f64(norms[i]._variance)) for i, t in enumerate(TASKS)}
    batch = batch_of(job)
    features = job.model.features(batch)
    for i, task in enumerate(TASKS):
        x = batch[task]["image"].numpy().astype(np.float64)
        expected = reference_task_norm_mlp(job, task, x, running)
        np.testing.assert_allclose(features[task].numpy(), expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(norms[i]._mean.numpy(), running[task][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(norms[i]._variance.numpy(), running[task][1], rtol=1e-5, atol=1e-6)
    assert job.model.backbone_passes(batch) == [["a"], ["b"], ["c"]]


def test_adapters_add_a_tasks_1x1_convolution_of_the_shared_convolution():
    """y_t = w * x + alpha_t * (w * x) (Rebuffi et al., eq. 2): checked on every adapted convolution with random
    adapters; with the adapters at their start (zero) the network equals task_norm's."""
    job = build(*ARCHITECTURES["adapters"])
    plain = build(*ARCHITECTURES["task_norm_cnn"])
    batch = batch_of(job)
    job.model.eval()
    plain.model.eval()
    for task in TASKS:
        np.testing.assert_array_equal(job.model.features(batch)[task].numpy(),
                                      plain.model.features(batch)[task].numpy())
    rng = np.random.RandomState(0)
    x = paddle.to_tensor(rng.randn(3, 1, 8, 8).astype(np.float32))
    for adapted in job.model.architecture.switches[:2]:  # the adapted convolutions come first
        for t, adapter in enumerate(adapted.by_task):
            adapter.weight.set_value(rng.randn(*adapter.weight.shape).astype(np.float32) * 0.3)
            adapted.active = t
            y = adapted.conv(x).numpy().astype(np.float64)
            expected = y + np.einsum("oc,nchw->nohw", f64(adapter.weight)[:, :, 0, 0], y)
            np.testing.assert_allclose(adapted(x).numpy(), expected, rtol=1e-5, atol=1e-5)
        x = paddle.nn.functional.relu(adapted(x))


def reached(job, batch):
    """``{parameter name: tasks whose loss alone sends it a nonzero gradient}`` (each task's loss differentiated
    alone, the others weighted 0)."""
    model, found = job.model, {}
    model.train()
    for task in TASKS:
        model.clear_gradients()
        model.backward(model(batch), {t: 1.0 if t == task else 0.0 for t in TASKS})
        for name, p in model.named_parameters():
            if p.grad is not None and float(paddle.abs(p.grad).max()) > 0:
                found.setdefault(name, set()).add(task)
    return found


@pytest.mark.parametrize("name", list(ARCHITECTURES) + ["hard"])
def test_declared_shared_parameters_are_those_several_tasks_reach(name):
    """Shared: reached by more than one task's loss; task t's own: reached by task t's loss only; together every
    trainable parameter of the backbone and the architecture, once."""
    job = build(*ARCHITECTURES.get(name, ({"type": "hard"}, MLP)))
    model = job.model
    names = {id(p): n for n, p in model.named_parameters()}
    found = reached(job, batch_of(job))
    shared = [names[id(p)] for p in model.shared_parameters()]
    own = {t: [names[id(p)] for p in model.architecture.task_parameters(t, model.backbone)] for t in TASKS}
    for n in shared:
        assert len(found.get(n, ())) >= 2, f"{n} is declared shared but only {found.get(n)} reach it"
    for t, params in own.items():
        for n in params:
            assert found.get(n) == {t}, f"{n} is declared task {t}'s but {found.get(n)} reach it"
    trainable = sorted(n for n, p in model.named_parameters() if not p.stop_gradient and not n.startswith("heads."))
    declared = shared + [n for params in own.values() for n in params]
    assert sorted(declared) == trainable
    for t in TASKS:  # the model's task parameters: the head's and the architecture's
        head = {names[id(p)] for p in model.heads[t].parameters()}
        assert {names[id(p)] for p in model.task_parameters(t)} == head | set(own[t])


def test_hard_shares_exactly_the_backbone():
    job = build({"type": "hard"})
    assert [id(p) for p in job.model.shared_parameters()] == [id(p) for p in job.model.backbone.parameters()]
    assert job.model.architecture.is_identity and job.model.embedder("a") is job.model.backbone
    assert job.model.architecture.state_dict() == {}


def test_experts_start_from_distinct_random_weights_and_diverge():
    """Not PaddleRec's constant start: every unit of every expert (and of every gate) starts different, and one
    gradient step keeps them different (with equal weights and biases, units get equal gradients forever)."""
    job = build(*ARCHITECTURES["mmoe"])
    arch = job.model.architecture
    for weight in [*arch.experts.weights, *[g.linear.weight for g in arch.gates]]:
        w = weight.numpy().reshape(-1, weight.shape[-1])
        assert len(np.unique(np.round(w.T, 6), axis=0)) == w.shape[1]  # every output unit its own column
        assert np.std(w) > 0.05
    experts = arch.experts.weights[0].numpy()
    assert all(not np.allclose(experts[i], experts[j]) for i in range(3) for j in range(i))
    job.model.backward(job.model(batch_of(job)))
    grad = arch.experts.weights[0].grad.numpy().reshape(-1, 7)
    assert len(np.unique(np.round(grad.T, 8), axis=0)) == 7


def test_ple_task_gates_read_only_their_own_and_the_shared_experts():
    """The indexing PaddleRec gets wrong: at the last level task a's loss reaches none of task b's or c's experts,
    and below it every expert reaches every task through the shared gate."""
    job = build(*ARCHITECTURES["ple2"])
    found = reached(job, batch_of(job))
    for k, task in enumerate(TASKS):
        for name in (f"architecture.levels.1.task_experts.{k}.weights.0", f"architecture.levels.1.task_gates.{k}"
                     ".linear.weight"):
            assert found[name] == {task}, name
        assert found[f"architecture.levels.0.task_experts.{k}.weights.0"] == set(TASKS)
    gate = job.model.architecture.levels[1].task_gates[0].linear.weight
    assert gate.shape == [6, 1 + 2]  # its own expert and the two shared ones


def test_the_architecture_weights_depend_on_the_job_seed_only():
    a, b, c = (build(*ARCHITECTURES["cgc"], seed=s).model.architecture.state_dict() for s in (3, 3, 4))
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    assert not all(np.array_equal(a[k].numpy(), c[k].numpy()) for k in a)


@pytest.mark.parametrize("architecture, backbone, key, words", [
    ({"type": "moe"}, MLP, "architecture.type", "did you mean 'mmoe'"),
    ({"type": "mmoe", "experts": 0}, MLP, "architecture.experts", "a positive integer (a count), got 0"),
    ({"type": "mmoe", "experts": [2, 3]}, MLP, "architecture.experts", "a positive integer (a count), got [2, 3]"),
    ({"type": "ple", "levels": True}, MLP, "architecture.levels", "a positive integer (a count), got True"),
    ({"type": "cgc", "shared_experts": 1.5}, MLP, "architecture.shared_experts", "positive integer (a count)"),
    ({"type": "ple", "expert_layers": [8, 0]}, MLP, "architecture.expert_layers", "list of positive integers"),
    ({"type": "mmoe", "gates": "all"}, MLP, "architecture.gates", "'task'"),
    ({"type": "ple", "level": 2}, MLP, "architecture.level", "has no parameter 'level'"),
    ({"type": "cross_stitch", "init": [0.9]}, MLP, "architecture.init", "alpha_same"),
    ({"type": "task_norm"}, MLP, "architecture.type", "has none"),
    ({"type": "adapters"}, MLP, "architecture.type", "kernel > 1"),
    ({"type": "cross_stitch_backbone"}, MLP, "architecture.type", "does not declare them (lenet and cnn do)"),
    ({"type": "cross_stitch_backbone", "init": "0.9"}, CNN, "architecture.init", "alpha_same"),
    ({"type": "hard", "tower_dropout": 1.5}, MLP, "architecture.tower_dropout", "[0, 1)"),
])
def test_bad_architectures_are_one_sentence_naming_the_key(architecture, backbone, key, words):
    with pytest.raises(ConfigError) as caught:
        build(architecture, backbone)
    assert f": {key}: " in str(caught.value) and words in str(caught.value), str(caught.value)
