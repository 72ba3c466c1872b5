"""Training recipes: the frozen ``TrainConfig`` and the bundled TOML recipes.

A recipe is a TOML file whose keys are ``TrainConfig`` fields; the bundled
ones live beside this module:

* ``mnist1d`` (the default): the small 1-D CNN on MNIST-1D at 90 % sparsity
  with Feather-Global, tuned to finish in well under two minutes on two CPU
  cores.
* ``mnist1d-regime``: ``mnist1d`` with the model at 0.75 width and
  gradient-norm clipping at 3, a setting closer to the paper's Table 1: the
  reference method (GMP) loses 15 points at 99 % sparsity. Chosen by a rule
  fixed in advance, with the dense model and GMP only
  (``docs/results/mnist1d-regime/regime.md``).
* ``cifar100``: the paper's CIFAR-100 recipe (appendix and the authors'
  released code): 160 epochs, batch 128, SGD lr 0.1, momentum 0.9, weight
  decay 5e-4 except on normalisation parameters and biases, cosine annealing
  stepped every iteration, gradient-norm clipping at 3.
* ``imagenet``: the paper's ImageNet recipe: 100 epochs, batch 256, SGD lr
  0.2, momentum 0.9, weight decay 5e-5, cosine with 5 linear warm-up epochs,
  label smoothing 0.1.

Every field can be overridden (``load_config("cifar100", sparsity=0.98)``, or
``--sparsity 0.98`` / ``--set sparsity=0.98`` on the command line). Values are
checked and converted in one place (``TrainConfig.__post_init__``), so a
string from the command line and a number from TOML end up the same, and a
bad key or value raises a ``ValueError`` that names the field.

Example:
    >>> cfg = load_config("cifar100", sparsity=0.98, model="resnet20")
    >>> cfg.epochs, cfg.lr, cfg.sparsity
    (160, 0.1, 0.98)
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import re
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Union

from feather_sparse.methods import METHODS
from feather_sparse.nm.operator import NMPattern
from feather_sparse.pruner_config import REGISTRIES
from feather_sparse.registry import Registry
from feather_sparse.rules import check_p, check_sparsity, check_theta

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, published as tomli before it joined the standard library
    import tomli as tomllib

__all__ = [
    "DEFAULT_RECIPE",
    "LR_SCHEDULES",
    "OPTIMIZERS",
    "TrainConfig",
    "config_fields",
    "field_help",
    "list_recipes",
    "load_config",
    "load_recipe",
    "parse_override",
    "recipe_path",
]

#: The recipe ``feather-sparse train`` uses when none is named.
DEFAULT_RECIPE = "mnist1d"

#: Optimizers the training loop can build (see ``train.build_optimizer``).
OPTIMIZERS = ("sgd", "adamw")

#: Learning-rate schedules (see ``train.lr_factor``), stepped every iteration.
LR_SCHEDULES = ("cosine", "constant")

#: The device strings torch accepts for the kinds a run can use: ``cuda``, ``cuda:1``, ...
_DEVICE = re.compile(r"(cpu|cuda|mps)(:(0|[1-9][0-9]*))?")
_AMP_DTYPES = ("bfloat16", "float16")


def _f(default: Any, help: str, choices: Registry[Any] | None = None) -> Any:
    """A dataclass field with an immutable default and its command-line help text.

    ``choices``: the registry the field's names are looked up in; ``{choices}``
    in ``help`` becomes its names when the help is shown (:func:`field_help`),
    so that the list includes whatever was registered since.
    """
    metadata: dict[str, Any] = {"help": help}
    if choices is not None:
        metadata["choices"] = choices
    return field(default=default, metadata=metadata)


def field_help(f: dataclasses.Field[Any]) -> str:
    """The help text of a :class:`TrainConfig` field, with the registered choices filled in.

    This text is the field's description: ``feather-sparse train --help``
    shows it beside the field's flag.

    Args:
        f: one of :func:`config_fields`.
    """
    text = str(f.metadata.get("help", ""))
    registry = f.metadata.get("choices")
    return text if registry is None else text.replace("{choices}", ", ".join(registry.names()))


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run (and nothing that does not).

    Fields are grouped as in the recipe files. Where the run is written, and
    whether it resumes, are arguments of ``train()``, not config. The defaults
    are neutral settings; the recipes set the rest.

    Each field is described once, by its ``help`` metadata: :func:`field_help`
    reads it, ``feather-sparse train --help`` shows it beside the field's flag,
    and the training guide (``docs/training.md``) lists the fields by group.
    """

    # --- what -------------------------------------------------------------
    recipe: str = _f("custom", "name of the recipe this config came from (for run names)")
    model: str = _f("mnist1d_cnn", "registered model name (feather_sparse.models)")
    model_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "extra keyword arguments of the model factory, e.g. '{width = 2}'"},
    )
    dataset: str = _f("mnist1d", "registered data set name (feather_sparse.data)")
    data_dir: str | None = _f(None, "where the data set lives on disk (CIFAR archive, ImageNet)")
    data_options: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "extra options of the data set, e.g. '{augment = false}' for cifar100"},
    )
    init_from: str | None = _f(
        None,
        "start from these weights instead of a random init: a .fsp or a run folder (its "
        "model.fsp) of the same model, e.g. a dense run to prune",
    )
    # --- how long, how big -------------------------------------------------
    epochs: int = _f(30, "training epochs")
    batch_size: int = _f(128, "training batch size (per process)")
    eval_batch_size: int | None = _f(None, "test batch size (default: batch_size)")
    eval_every: int = _f(
        1, "test the model every this many epochs and at the last (0: only the final model)"
    )
    num_workers: int = _f(0, "loader worker processes (file-based data sets)")
    # --- optimisation -------------------------------------------------------
    optimizer: str = _f("sgd", f"optimizer: {', '.join(OPTIMIZERS)}")
    lr: float = _f(0.1, "peak learning rate")
    momentum: float = _f(0.9, "SGD momentum (AdamW: beta1)")
    nesterov: bool = _f(False, "Nesterov momentum (SGD)")
    weight_decay: float = _f(5e-4, "weight decay (never applied to norm parameters and biases)")
    lr_schedule: str = _f("cosine", f"LR schedule per iteration: {', '.join(LR_SCHEDULES)}")
    warmup_epochs: float = _f(0.0, "linear LR warm-up from 0, in epochs")
    min_lr: float = _f(0.0, "final learning rate of the cosine schedule")
    grad_clip: float | None = _f(None, "clip the global gradient norm at this value")
    label_smoothing: float = _f(0.0, "label smoothing of the cross-entropy loss")
    amp: bool = _f(False, "mixed precision (CUDA only)")
    amp_dtype: str = _f("bfloat16", f"autocast dtype with amp: {', '.join(_AMP_DTYPES)}")
    # --- reproducibility, hardware -------------------------------------------
    seed: int = _f(0, "seed of the model init, data order and augmentation")
    device: str = _f("auto", "auto (CUDA when available), cpu, cuda, cuda:N, mps")
    threads: int | None = _f(None, "CPU threads of torch's kernels (none: torch's default)")
    deterministic: bool = _f(False, "force deterministic kernels (slower on CUDA)")
    tensorboard: bool = _f(True, "write TensorBoard logs when tensorboard is installed")
    # --- sparsity -------------------------------------------------------------
    dense: bool = _f(False, "train the dense baseline (no pruning)")
    method: str = _f("feather", "sparsification method: {choices}", METHODS)
    sparsity: float = _f(0.9, "final target sparsity over all prunable weights")
    pattern: str | None = _f(
        None,
        "N:M pattern (2:4, 4:8, 1:4): keep N of every M weights along each layer's reduction "
        "dimension; sets sparsity to (M-N)/M (unset: unstructured)",
    )
    conv_order: str | None = _f(
        None,
        "N:M groups of a conv with a kernel > 1: flat (along in_channels x kernel, kernel "
        "innermost; unset: flat) or channels (input channels at each kernel position, the "
        "order NVIDIA's sparse conv kernels take)",
    )
    # Unset (None): the method decides (Feather: operator feather with p = 3,
    # theta auto, backbone global); a set value the method fixes otherwise is
    # an error (feather_sparse.methods.pruner_config).
    operator: str | None = _f(
        None, "thresholding operator: {choices} (unset: the method's)", REGISTRIES["operator"]
    )
    p: float | None = _f(None, "operator power >= 1 (overrides the operator's; inf = hard)")
    theta: float | str | None = _f(
        None, "gradient scale of pruned weights in [0, 1], or auto (unset: the method's)"
    )
    theta_rule: str = _f("paper", "auto theta boundary: paper (S >= 0.95) or released (S > 0.95)")
    backbone: str | None = _f(
        None, "threshold backbone: {choices} (unset: the method's)", REGISTRIES["backbone"]
    )
    schedule: str = _f("cubic", "sparsity schedule: {choices}", REGISTRIES["schedule"])
    schedule_start: float = _f(0.0, "fraction of training where the sparsity ramp starts")
    schedule_end: float = _f(0.5, "fraction of training where the target sparsity is reached")
    update_every: int = _f(1, "recompute the thresholds every this many steps")
    exclude: tuple[str, ...] = _f((), "module names / 're:<regex>' never to prune")
    max_layer_sparsity: float | None = _f(None, "layer-collapse guard: cap per-layer sparsity")

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = _coerce(f.name, hints[f.name], getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        self._check()

    def _check(self) -> None:
        """Range and choice checks; every message names the field."""
        _positive(self, "epochs", "batch_size", "update_every")
        if self.eval_batch_size is not None:
            _positive(self, "eval_batch_size")
        if self.threads is not None:
            _positive(self, "threads")
        _non_negative(
            self,
            "eval_every",
            "num_workers",
            "seed",
            "weight_decay",
            "warmup_epochs",
            "min_lr",
            "lr",
        )
        if self.seed >= 2**63:  # torch.manual_seed's range (the data loaders' generators)
            raise ValueError(f"seed must be below 2**63, got {self.seed}")
        if not 0 < self.lr < math.inf:
            raise ValueError(f"lr must be a finite number > 0, got {self.lr}")
        if self.min_lr > self.lr:
            raise ValueError(
                f"min_lr ({self.min_lr}) must not exceed lr ({self.lr}): the schedule decays "
                "from lr to min_lr"
            )
        _choice(self, "optimizer", OPTIMIZERS)
        _choice(self, "lr_schedule", LR_SCHEDULES)
        _choice(self, "amp_dtype", _AMP_DTYPES)
        _choice(self, "theta_rule", ("paper", "released"))
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("nesterov needs momentum > 0, got momentum 0")
        if self.warmup_epochs > self.epochs:
            raise ValueError(
                f"warmup_epochs ({self.warmup_epochs}) must not exceed epochs ({self.epochs})"
            )
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or none, got {self.grad_clip}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.device != "auto" and not _DEVICE.fullmatch(self.device):
            raise ValueError(
                f"device must be auto, cpu, cuda, cuda:N (N a GPU's number: 0, 1, ...) or mps, "
                f"got {self.device!r}"
            )
        # The pruning parameters follow the library's one rule each (feather_sparse.rules).
        check_sparsity(self.sparsity)
        if self.pattern is not None:
            # The pattern fixes the sparsity: a recipe's unstructured target gives way to it
            # (load_config refuses a conflicting sparsity given together with the pattern).
            nm = NMPattern.parse(self.pattern)
            object.__setattr__(self, "pattern", str(nm))
            object.__setattr__(self, "sparsity", nm.sparsity)
            if self.conv_order is not None and self.conv_order not in ("flat", "channels"):
                raise ValueError(f"conv_order must be flat or channels, got {self.conv_order!r}")
            if self.backbone is not None and self.backbone.strip().lower() != "nm":
                raise ValueError(
                    f"pattern {nm} brings its own per-group thresholds (the nm backbone); "
                    f"backbone {self.backbone!r} cannot be combined with it: leave backbone out"
                )
        if self.conv_order is not None and self.pattern is None:
            raise ValueError(
                f"conv_order={self.conv_order!r} orders N:M groups: it needs a pattern (e.g. 2:4)"
            )
        if self.theta is not None:
            theta = check_theta(self.theta, allow_auto=True)
            if isinstance(theta, str):  # "Auto" is stored as "auto"
                object.__setattr__(self, "theta", theta)
        if self.p is not None:
            check_p(self.p)
        if not 0.0 <= self.schedule_start <= self.schedule_end <= 1.0:
            raise ValueError(
                "need 0 <= schedule_start <= schedule_end <= 1, got "
                f"schedule_start={self.schedule_start}, schedule_end={self.schedule_end}"
            )
        if self.max_layer_sparsity is not None:
            check_sparsity(self.max_layer_sparsity, "max_layer_sparsity")
        if self.init_from is not None and not self.init_from.strip():
            raise ValueError(
                "init_from: an empty path (an unset shell variable?); name the .fsp file or "
                "the run folder to start from, or leave it out to start from a random init"
            )
        # Names of the core registries (the baselines' included: see
        # feather_sparse.pruner_config) are checked here, before anything runs;
        # models, data sets and methods when the run starts. Known names are
        # stored as registered ("Feather" is "feather"): a resume compares them
        # as text, and the run folder is named after the method.
        for name, registry in REGISTRIES.items():
            value = getattr(self, name)
            if value is None:
                continue
            if value not in registry:
                raise ValueError(
                    f"{name}: unknown {registry.kind} {value!r}; choose one of: "
                    f"{', '.join(registry.names())}"
                )
            object.__setattr__(self, name, registry.canonical(value))
        if self.method in METHODS:  # an unknown one is check_method's to name
            object.__setattr__(self, "method", METHODS.canonical(self.method))

    # ------------------------------------------------------------- conversions
    def to_dict(self, model_spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A JSON/TOML-able dict (tuples become lists); ``from_dict`` inverts it.

        Args:
            model_spec: the built model's ``{"name", "kwargs"}`` (its
                ``feather_model_spec``); when given, it replaces the ``model``
                name, so that the record alone rebuilds the architecture.
        """
        out = dataclasses.asdict(self)
        out["exclude"] = list(self.exclude)
        if model_spec is not None:
            out["model"] = {"name": model_spec["name"], "kwargs": dict(model_spec["kwargs"])}
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Build a config from a mapping of field values.

        ``model`` may also be a table ``{name, kwargs}``, as run records
        (``config.json``, checkpoints) write it with the model's resolved
        arguments: its name is used, and its kwargs (without ``num_classes``,
        which comes from the data set) when ``model_kwargs`` is not given.

        Args:
            values: field name -> value; values are checked and converted like
                command-line strings (a field left out takes its default).

        Raises:
            ValueError: for an unknown key (with suggestions) or a bad value.
        """
        _check_keys(values)
        values = dict(values)
        model = values.get("model")
        if isinstance(model, Mapping):
            if not isinstance(model.get("name"), str):
                raise ValueError(f"model must be a name or a table {{name, kwargs}}, got {model!r}")
            values["model"] = model["name"]
            if "model_kwargs" not in values:
                kwargs = model.get("kwargs") or {}
                if not isinstance(kwargs, Mapping):
                    raise ValueError(
                        f"model's kwargs must be a table (e.g. {{width = 2}}), got {kwargs!r}"
                    )
                kwargs = dict(kwargs)
                kwargs.pop("num_classes", None)
                values["model_kwargs"] = kwargs
        return cls(**values)

    @classmethod
    def from_record(cls, values: Mapping[str, Any]) -> TrainConfig:
        """:meth:`from_dict` for a config a run wrote (``config.json``, a checkpoint).

        Records written before ``operator``, ``theta`` and ``backbone`` could be
        unset hold their old defaults (``"feather"``, ``"auto"``, ``"global"``),
        which meant "the method decides". Those three together are read as
        unset: for Feather that is the same setting, and for every other method
        the three together contradict it, so no valid newer record holds them.
        Use :meth:`from_dict` for configs a person wrote.

        Args:
            values: the recorded field values.

        Raises:
            ValueError: as :meth:`from_dict`.
        """
        values = dict(values)
        if all(values.get(k) == v for k, v in _LEGACY_METHOD_DEFAULTS.items()):
            values.update(dict.fromkeys(_LEGACY_METHOD_DEFAULTS))
        return cls.from_dict(values)

    def replace(self, **overrides: Any) -> TrainConfig:
        """A copy with ``overrides`` applied (checked like any other value).

        Args:
            **overrides: field name -> new value.

        Raises:
            ValueError: for an unknown field (with suggestions) or a bad value.
        """
        _check_keys(overrides)
        return dataclasses.replace(self, **overrides)

    def diff(self, other: TrainConfig) -> dict[str, tuple[Any, Any]]:
        """``{field: (self's value, other's value)}`` for the fields that differ.

        Args:
            other: the config to compare with.
        """
        mine, theirs = self.to_dict(), other.to_dict()
        return {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs[k]}

    @property
    def run_method(self) -> str:
        """``"dense"`` for the dense baseline, else the sparsification method."""
        return "dense" if self.dense else self.method


#: What ``operator``, ``theta`` and ``backbone`` defaulted to before they
#: could be left to the method (see :meth:`TrainConfig.from_record`).
_LEGACY_METHOD_DEFAULTS = {"operator": "feather", "theta": "auto", "backbone": "global"}


def config_fields() -> list[dataclasses.Field[Any]]:
    """The ``TrainConfig`` fields, in declaration order (for building a CLI)."""
    return list(dataclasses.fields(TrainConfig))


# ----------------------------------------------------------------- validation
def _check_keys(values: Mapping[str, Any]) -> None:
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    for key in values:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(
                f"unknown config field {key!r}{hint}; valid fields: {', '.join(names)}"
            )


def _positive(cfg: TrainConfig, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be > 0, got {getattr(cfg, name)}")


def _non_negative(cfg: TrainConfig, *names: str) -> None:
    for name in names:
        if getattr(cfg, name) < 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")


def _choice(cfg: TrainConfig, name: str, choices: tuple[str, ...]) -> None:
    if getattr(cfg, name) not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(cfg, name)!r}")


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NONE = ("none", "null")


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "none"
    if typing.get_origin(hint) is tuple:
        return "a list of strings"
    if typing.get_origin(hint) is dict:
        return 'a table (e.g. {key = 1}, or JSON: {"key": 1})'
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(
        hint, str(hint)
    )


def _coerce(name: str, hint: Any, value: Any) -> Any:
    """Convert ``value`` (from TOML, Python or a command-line string) to ``hint``.

    Raises:
        ValueError: naming the field and the expected type.
    """
    try:
        return _convert(hint, value)
    except (TypeError, ValueError, tomllib.TOMLDecodeError):
        raise ValueError(f"{name} must be {_describe(hint)}, got {value!r}") from None


def _convert(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if type(None) in args and (
            value is None or (isinstance(value, str) and value.strip().lower() in _NONE)
        ):
            return None
        for arg in args:  # declaration order: float before str for theta
            if arg is type(None):
                continue
            try:
                return _convert(arg, value)
            except (TypeError, ValueError, tomllib.TOMLDecodeError):
                continue
        raise ValueError(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(value)
    if hint is int:
        if isinstance(value, bool):
            raise ValueError(value)
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            return int(value.strip())
        raise ValueError(value)
    if hint is float:
        if isinstance(value, bool):
            raise ValueError(value)
        if isinstance(value, (int, float)):
            result = float(value)
        elif isinstance(value, str):
            result = float(value.strip())
        else:
            raise ValueError(value)
        if math.isnan(result):
            raise ValueError(value)
        return result
    if hint is str:
        if isinstance(value, str):
            return value
        raise ValueError(value)
    if origin is tuple:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                value = tomllib.loads(f"v = {text}")["v"]
            else:  # "fc,conv1" on the command line
                value = [part.strip() for part in text.split(",") if part.strip()]
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValueError(value)
    if origin is dict:
        if isinstance(value, str):
            text = value.strip()
            try:
                value = tomllib.loads(f"v = {text}")["v"]
            except tomllib.TOMLDecodeError:
                value = json.loads(text)  # a JSON object, as a shell user may type it
                if isinstance(value, Mapping):  # null: the default, as create_model reads
                    value = {k: v for k, v in value.items() if v is not None}  # it (TOML has none)
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return dict(value)
        raise ValueError(value)
    raise TypeError(f"unsupported config type {hint}")


def parse_override(text: str) -> tuple[str, str]:
    """Split a ``key=value`` command-line override (``--set lr=0.05``).

    Dashes in the key are read as underscores (``--set batch-size=64``).

    Args:
        text: the override as given, ``key=value``.

    Returns:
        ``(key, value)``, the value still a string, stripped; a TOML string
        (``"synthetic-mnist1d"`` or ``'...'``, quotes and all) is read as TOML
        reads it, so the quotes are not part of the value.

    Raises:
        ValueError: if there is no ``=`` or no key.
    """
    key, sep, value = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key:
        raise ValueError(f"--set expects key=value (e.g. --set lr=0.05), got {text!r}")
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        with contextlib.suppress(tomllib.TOMLDecodeError):
            value = tomllib.loads(f"v = {value}")["v"]
    return key, value


def _check_pattern_sparsity(values: Mapping[str, Any]) -> None:
    """Raise if ``values`` give both an N:M pattern and a sparsity it does not imply."""
    pattern, sparsity = values.get("pattern"), values.get("sparsity")
    if pattern is None or sparsity is None:
        return
    if isinstance(pattern, str) and pattern.strip().lower() in _NONE:
        return
    nm = NMPattern.parse(pattern)
    given = _coerce("sparsity", float, sparsity)
    if not math.isclose(given, nm.sparsity, abs_tol=1e-12):
        raise ValueError(
            f"pattern {nm} prunes {nm.sparsity:g} of the weights, but sparsity {given:g} was "
            "given with it: leave sparsity out (the pattern implies it)"
        )


# -------------------------------------------------------------------- recipes
def _bundled() -> dict[str, Path]:
    folder = resources.files(__name__)
    out = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".toml"):
            out[entry.name[: -len(".toml")]] = Path(str(entry))
    return out


def list_recipes() -> list[str]:
    """Names of the bundled recipes, sorted."""
    return sorted(_bundled())


def recipe_path(recipe: str | Path) -> Path:
    """The TOML file of a bundled recipe name, or ``recipe`` itself if it is a file.

    Args:
        recipe: a bundled recipe name (:func:`list_recipes`), or the path of a
            ``.toml`` file (a name with a ``.toml`` suffix or a folder part is
            read as a path).

    Raises:
        ValueError: for an unknown name (listing the bundled ones).
        FileNotFoundError: for a path that does not exist.
        IsADirectoryError: for a folder.
    """
    bundled = _bundled()
    if isinstance(recipe, str) and recipe in bundled:
        return bundled[recipe]
    path = Path(recipe).expanduser()
    if path.suffix == ".toml" or path.parent != Path("."):
        if path.is_dir():
            raise IsADirectoryError(f"recipe {path} is a folder; give the .toml file inside it")
        if not path.is_file():
            raise FileNotFoundError(f"recipe file {path} does not exist")
        return path
    raise ValueError(
        f"unknown recipe {str(recipe)!r}; choose one of: {', '.join(sorted(bundled))}, "
        "or give the path of a .toml file"
    )


def load_recipe(recipe: str | Path = DEFAULT_RECIPE) -> dict[str, Any]:
    """The raw field values of a recipe (a bundled name or a TOML path).

    The recipe's name (``recipe`` field) defaults to the file's stem.

    Args:
        recipe: a bundled recipe name (:func:`list_recipes`) or a TOML path.

    Raises:
        ValueError: for an unknown recipe, invalid TOML, or an unknown key.
        FileNotFoundError: for a missing file.
    """
    path = recipe_path(recipe)
    try:
        with path.open("rb") as f:
            values = tomllib.load(f)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"recipe {path} is not valid TOML: {err}") from None
    except UnicodeDecodeError:
        raise ValueError(f"recipe {path} is not a text (TOML) file") from None
    try:
        _check_keys(values)
    except ValueError as err:
        raise ValueError(f"recipe {path}: {err}") from None
    values.setdefault("recipe", path.stem)
    return values


def load_config(
    recipe: str | Path = DEFAULT_RECIPE,
    overrides: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> TrainConfig:
    """A recipe with overrides applied, checked.

    Args:
        recipe: a bundled recipe name (``list_recipes()``) or a TOML path.
        overrides: field values that replace the recipe's (strings are
            converted like command-line values).
        **kwargs: more overrides.

    Raises:
        ValueError: for an unknown recipe or field, or a bad value (the message
            names the field).
    """
    values = load_recipe(recipe)
    extra = {**(overrides or {}), **kwargs}
    _check_keys(extra)
    _check_pattern_sparsity(extra)
    values.update(extra)
    return TrainConfig.from_dict(values)
