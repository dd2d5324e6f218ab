"""Plug-in registry: readers, backbones, heads, task-weighting strategies and architectures (the layer between the
backbone and the heads, :mod:`mtl.architectures`) register under a name with a decorator.

Plug-in files are found by importing every ``.py`` of a folder (``heads/``, ``tasks/``, any folder a job lists under
``plugins:``) and through the entry-point group ``mtl.plugins`` (:mod:`mtl.core.plugin_loading`, whose functions are
re-exported here: ``registry.load_builtin()``, ``registry.load_folder(...)``, ...). ``build(kind, cfg)`` turns
``{"type": name, ...}`` into an instance, checking parameter names against the constructor before anything runs.
"""
import difflib
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Dict, Optional

from mtl.core.errors import ConfigError, DataError, MtlError, PluginError
from mtl.core.plugin_loading import (  # noqa: F401  (re-exported: how plug-ins are found is part of the registry's API)
    ENTRY_POINT_GROUP,
    builtin_heads_folder,
    import_error,
    load_all,
    load_builtin,
    load_entry_points,
    load_file,
    load_folder,
)

KINDS = ("reader", "backbone", "head", "weighting", "architecture")
# Constructor arguments the runner supplies at build time (not required in configs).
CONTEXT_KEYS = frozenset({"feature_size", "num_classes", "num_outputs", "seed", "split", "image_size", "channels",
                          "shape", "tasks", "loss_weights", "tokenizer", "people"})


@dataclass
class Entry:
    """One registered component: its class, where it came from and a one-line description."""

    kind: str
    name: str
    cls: type
    origin: str
    description: str


_REGISTRY: Dict[str, Dict[str, Entry]] = {k: {} for k in KINDS}


def origin_of(cls) -> str:
    """Where the class ``cls`` is defined: its file (relative to the working directory when under it), or its module."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    if path:
        try:
            rel = os.path.relpath(path)
            return rel if not rel.startswith("..") else path
        except ValueError:
            return path
    return cls.__module__


ABBREVIATIONS = ("e.g.", "i.e.", "al.", "cf.", "vs.", "etc.")  # a period that ends no sentence


def first_sentence(doc: Optional[str]) -> str:
    """The first sentence of a docstring's first paragraph, on one line (empty without one): what ``mtl plugins``
    shows (the first line cut sentences in the middle). A paragraph that introduces a list ends with ``:``, shown
    as ``.``."""
    import inspect
    import re

    paragraph = " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())
    for end in re.finditer(r"[.!?]\)?(?=\s+[A-Z`(])", paragraph):
        if not paragraph[:end.end()].endswith(ABBREVIATIONS):
            return paragraph[:end.end()]
    return paragraph[:-1] + "." if paragraph.endswith(":") else paragraph


def register(kind: str, name: str):
    """Class decorator: register ``cls`` as a ``kind`` (reader|backbone|head|weighting|architecture) called ``name``."""
    if kind not in KINDS:
        raise ValueError(f"unknown plug-in kind {kind!r}; expected one of {KINDS}")

    def wrap(cls):
        old = _REGISTRY[kind].get(name)
        if old is not None and old.cls is not cls:
            raise ConfigError(f"{kind} '{name}' is registered twice: by {old.origin} ({old.cls.__qualname__}) and by "
                              f"{origin_of(cls)} ({cls.__qualname__}); rename one of them")
        cls.registered_name = name
        _REGISTRY[kind][name] = Entry(kind, name, cls, origin_of(cls), first_sentence(cls.__doc__))
        return cls

    return wrap


def register_reader(name):
    """Register a reader class (see :class:`mtl.readers.base.Reader`)."""
    return register("reader", name)


def register_backbone(name):
    """Register a backbone class (see :class:`mtl.backbones.base.Backbone`)."""
    return register("backbone", name)


def register_head(name):
    """Register a head class (see :class:`mtl.headkit.base.Head`)."""
    return register("head", name)


def register_weighting(name):
    """Register a task-weighting strategy (see :class:`mtl.weighting.base.Weighting`).

    The ``mtl plugins`` description is the class's ``description`` attribute (its docstring's first sentence if
    empty).
    """

    def wrap(cls):
        cls = register("weighting", name)(cls)
        if cls.description:
            _REGISTRY["weighting"][name].description = cls.description
        return cls

    return wrap


def register_architecture(name):
    """Register an architecture, the layer between backbone and heads (:class:`mtl.architectures.base.Architecture`)."""
    return register("architecture", name)


def did_you_mean(word, choices) -> str:
    """Return `` (did you mean 'x'?)`` for the closest of ``choices``, or an empty string."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def plugin_class(kind: str, name: str) -> type:
    """The class registered as ``name`` (built-ins loaded first): how a plug-in subclasses a built-in head,
    e.g. ``RegressionHead = plugin_class("head", "regression")``."""
    load_builtin()
    return get(kind, name).cls


def as_component(value) -> dict:
    """A component config as a new dict: ``"name"`` becomes ``{"type": "name"}`` (the one normalisation)."""
    return {"type": value} if isinstance(value, str) else dict(value)


def entries(kind=None):
    """All registered entries (of one kind, or of every kind), sorted by kind then name."""
    kinds = [kind] if kind else KINDS
    return [e for k in kinds for _, e in sorted(_REGISTRY[k].items())]


def get(kind: str, name: str, source=None, key=None) -> Entry:
    """Look up a registered component (the built-ins are loaded first when it is not registered yet: a caller of
    the Python API need not load them), with a "did you mean" error if the name is unknown."""
    table = _REGISTRY[kind]
    if name not in table:
        load_builtin()
    if name not in table:
        known = ", ".join(sorted(table)) or "none"
        raise ConfigError(
            f"unknown {kind} '{name}'{did_you_mean(name, table)}; registered {kind}s: {known}", source, key
        )
    return table[name]


def check_params(cls, params: dict, source=None, key=None, kind="component"):
    """Raise ConfigError for a parameter that ``cls.__init__`` does not accept."""
    sig = inspect.signature(cls.__init__)
    accepted = [p for p in sig.parameters if p != "self"]
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    for name in params:
        if name not in accepted:
            prefix = f"{key}." if key else ""
            raise ConfigError(
                f"{kind} '{getattr(cls, 'registered_name', cls.__name__)}' has no parameter '{name}'"
                f"{did_you_mean(name, accepted)}; it accepts: {', '.join(accepted) or 'none'}",
                source,
                prefix + name,
            )
    missing = [
        p.name
        for p in sig.parameters.values()
        if p.name != "self" and p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in params and p.name not in CONTEXT_KEYS
    ]
    if missing:
        raise ConfigError(
            f"{kind} '{getattr(cls, 'registered_name', cls.__name__)}' needs parameter '{missing[0]}'",
            source,
            key,
        )


def split_cfg(kind, cfg, source=None, key=None):
    """Split ``{"type": name, **params}`` into (Entry, params), validating both."""
    if isinstance(cfg, str):
        cfg = as_component(cfg)
    if not isinstance(cfg, dict) or "type" not in cfg:
        raise ConfigError(f"expected a mapping with a 'type' naming a {kind}, got {cfg!r}", source, key)
    params = {k: v for k, v in cfg.items() if k != "type"}
    entry = get(kind, cfg["type"], source, f"{key}.type" if key else "type")
    check_params(entry.cls, params, source, key, kind)
    return entry, params


def build(kind, cfg, source=None, key=None, **context):
    """Build a component of ``kind`` from ``{"type": name, ...params}``; ``context`` adds keyword arguments."""
    entry, params = split_cfg(kind, cfg, source, key)
    sig = inspect.signature(entry.cls.__init__)
    for name, value in context.items():
        if name in sig.parameters and name not in params:
            params[name] = value
    try:
        return entry.cls(**params)
    except (ConfigError, DataError) as exc:  # the component's own error: add the file and the key path it lacks
        if exc.source is None:
            sub = f"{key}.{exc.key}" if key and exc.key else (exc.key or key)
            cls = ConfigError if isinstance(exc, ConfigError) else DataError
            raise cls(f"{kind} '{entry.name}': {exc.located(source)}", source, sub) from None
        raise
    except MtlError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything else is a bug in the plug-in, named as one...
        mistyped = _mistyped(entry, params, context)
        if mistyped:  # ... unless a value is not of its declared type: then the config is wrong
            name, problem = mistyped
            raise ConfigError(f"{kind} '{entry.name}': parameter '{name}' must be {problem}", source,
                              f"{key}.{name}" if key else None) from None
        raise plugin_error(kind, entry, exc) from exc


def _mistyped(entry, params: dict, context: dict):
    """``(name, what it should be)`` of the first given parameter that is not of the type the plug-in declares
    (:func:`parameters`), or None. Asked only when the plug-in raised something else than a user error: its own
    checks speak first."""
    declared = {p.name: p.type for p in parameters(entry.cls)}
    for name, value in params.items():
        problem = _type_problem(value, declared.get(name, ""))
        if problem and name not in context:
            return name, problem
    return None


_TYPE_CHECKS = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
                "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
                "bool": lambda v: isinstance(v, bool), "str": lambda v: isinstance(v, str),
                "list": lambda v: isinstance(v, (list, tuple)), "mapping": lambda v: isinstance(v, dict)}


_TYPE_WORDS = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string",
               "list": "a list", "mapping": "a mapping"}


def _type_problem(value, declared: str) -> Optional[str]:
    """What ``value`` should be (``a whole number, got 1.5``) when it is not of the type a plug-in declares for a
    parameter (``int``, ``list|float``, ``str or mapping``), or None; a type word this does not know, or None as
    the value, is left to the plug-in. Without it ``classes: "x"`` reached the reader's ``int()`` and was reported
    as a bug in the plug-in."""
    import re

    words = [w for w in re.split(r"\s*(?:\||\bor\b)\s*", declared.strip()) if w]
    if value is None or not words or any(w not in _TYPE_CHECKS for w in words):
        return None
    if any(_TYPE_CHECKS[w](value) for w in words):
        return None
    return f"{' or '.join(_TYPE_WORDS[w] for w in words)}, got {value!r}"


def plugin_error(kind: str, entry: Entry, exc: BaseException) -> PluginError:
    """The one-line report of a bug in a plug-in (``exc`` raised while it was built), its traceback kept in
    ``traceback_text`` for the run's log."""
    import traceback

    return PluginError(f"{kind} '{entry.name}' ({entry.origin}) raised {type(exc).__name__}: {exc} while it was "
                       f"built; this is a bug in the plug-in, not a mistake in the config",
                       "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


# ---- describing plug-ins: their parameters, from their own declarations ---------------------------------------------
# What the job itself passes for the constructor arguments of CONTEXT_KEYS (not set in configs).
CONTEXT_MEANINGS = {
    "feature_size": "set by the job: the backbone's embedding size",
    "num_classes": "set by the job when not given: the reader's class count (its number of labels for a multi-label "
                   "head)",
    "num_outputs": "set by the job when not given: the reader's number of regression targets",
    "seed": "set by the job: drawn from the job's seed (and the task's name)",
    "split": "set by the job: train, or eval for the evaluation reader",
    "image_size": "set by the job: the backbone's input size",
    "channels": "set by the job: the backbone's input channels",
    "shape": "set by the job: the backbone's input shape",
    "tasks": "set by the job: the names of its tasks",
    "loss_weights": "set by the job: each task's loss_weight",
    "tokenizer": "set by the job: the text backbone's tokenizer (its vocab), shared by every text task",
    "people": "set by the job: who the classes of each source of the task's reader are (names, dataset labels, "
              "people held out), for pairs that name people",
}
SECTION = "Parameters:"


@dataclass
class Parameter:
    """One constructor parameter of a plug-in, as ``mtl plugins --describe`` and docs/plugins.md show it."""

    name: str
    type: str
    default: str
    meaning: str


def documented_parameters(cls) -> Dict[str, tuple]:
    """``{name: (type or "", meaning)}`` from the ``Parameters:`` sections of the docstrings of ``cls`` and its
    bases (the first that documents a name wins; Paddle's classes are not read). A section is the line
    ``Parameters:`` followed by indented lines ``name: meaning`` or ``name (type): meaning``, a longer meaning
    continued on more indented lines; it ends at a blank line or a line indented less."""
    import re

    found = {}
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in ("paddle", "builtins"):  # Paddle's own Layer documents its own
            continue
        lines = inspect.cleandoc(vars(klass).get("__doc__") or "").splitlines()
        if SECTION not in [line.strip() for line in lines]:
            continue
        start = [line.strip() for line in lines].index(SECTION) + 1
        current, indent = None, None
        for line in lines[start:]:
            depth = len(line) - len(line.lstrip())
            if not line.strip() or (indent is not None and depth < indent):
                break
            item = re.match(r"(\w+)(?: \(([^)]*)\))?: (.*)", line.strip())
            if item and (indent is None or depth == indent):
                indent, current = depth, item.group(1)
                if current not in found:
                    found[current] = [item.group(2) or "", item.group(3)]
                else:
                    current = None  # documented by a subclass already
            elif current is not None:
                found[current][1] += " " + line.strip()
    return {name: tuple(value) for name, value in found.items()}


def _type_name(parameter, documented: str) -> str:
    if documented:
        return documented
    if parameter.annotation is not parameter.empty:
        names = {int: "int", float: "float", bool: "bool", str: "str"}
        text = names.get(parameter.annotation, str(parameter.annotation))
        return "list" if "Sequence" in text or "List" in text or "Tuple" in text else text
    default = parameter.default
    if default is parameter.empty or default is None:
        return ""
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", tuple: "list",
            dict: "mapping"}.get(type(default), type(default).__name__)


def parameters(cls) -> list:
    """Every constructor parameter of the plug-in class ``cls`` (:class:`Parameter`): its type (declared in its
    docstring, else its annotation, else its default's), its default (``required``; ``set by the job`` for the
    arguments the job passes) and its meaning (the docstrings' ``Parameters:`` sections)."""
    documented = documented_parameters(cls)
    found = []
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        kind, meaning = documented.get(p.name, ("", ""))
        if p.name in CONTEXT_KEYS:
            meaning = meaning or CONTEXT_MEANINGS[p.name]
        default = ("required" if p.name not in CONTEXT_KEYS else "set by the job") if p.default is p.empty \
            else repr(list(p.default) if isinstance(p.default, tuple) else p.default)
        found.append(Parameter(p.name, _type_name(p, kind), default, meaning))
    return found


def find(name: str, kind: Optional[str] = None) -> list:
    """The registered entries called ``name`` (of ``kind``, or of every kind); a ConfigError with a "did you mean"
    when there is none."""
    kinds = [kind] if kind else KINDS
    matches = [_REGISTRY[k][name] for k in kinds if name in _REGISTRY[k]]
    if not matches:
        every = sorted({n for k in kinds for n in _REGISTRY[k]})
        raise ConfigError(f"no {kind or 'plug-in'} is registered as '{name}'{did_you_mean(name, every)}; "
                          f"`mtl plugins` lists them")
    return matches
