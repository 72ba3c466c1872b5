"""Tests that close the gaps a mutation audit of file recognition and the training's
checks and plumbing found.

Each test here fails on one or more hand-made mutants of ``export/files.py``,
``train/fit.py``, ``train/dist.py`` (with the teardown in ``cli/train.py``) or
``train/progress.py`` that the rest of the suite let through
(``docs/mutation-audit.md``, "File recognition and the training's checks and
plumbing"; the mutants' ids are in each test's docstring). Each asserts the
documented contract (the modules' docstrings, ONNX's ``onnx.proto``,
``docs/distributed.md``, ``--help``), worked out here, never the code's current
output. None of them trains or starts a process group: ``torch.distributed`` is
replaced by recorders where a group would be joined.
"""

from __future__ import annotations

import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import feather_sparse.cli.train as cli_train
import feather_sparse.recipes
import feather_sparse.train.dist as train_dist
import feather_sparse.train.progress as progress
from _guards import guard
from _helpers import needs_safetensors
from feather_sparse import cli
from feather_sparse.export import load_sparse, save_sparse
from feather_sparse.export.files import check_writable, is_onnx
from feather_sparse.train.dist import DistContext, distributed_context, init_distributed
from feather_sparse.train.fit import check_model_takes, models_taking

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, published as tomli before it joined the standard library
    import tomli as tomllib

pytestmark = pytest.mark.usefixtures("one_thread")


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(40, 8), nn.ReLU(), nn.Linear(8, 4)).eval()


# ------------------------------------------------------------ export/files.py
@guard(
    "`save_sparse` / `export -o` to a folder, or to a path below a file (`notes.txt/model.fsp`)",
    "`IsADirectoryError` suggesting `FOLDER/model.fsp`, or `NotADirectoryError` naming the "
    "file in the way, before anything is written",
)
def test_a_folder_or_a_file_as_the_folder_is_refused_naming_the_fix(tmp_path: Path) -> None:
    """xf05, xf02: the folder's error suggests the file inside it; a file as the target's
    own folder is named (the module docstring: "errors name the path and what to do")."""
    with pytest.raises(IsADirectoryError) as err:
        check_writable(tmp_path, "model.fsp")
    assert f"e.g. {tmp_path / 'model.fsp'}" in str(err.value)
    notes = tmp_path / "notes.txt"
    notes.write_text("keep\n")
    with pytest.raises(NotADirectoryError, match=rf"{notes} is a file, not a folder"):
        check_writable(notes / "model.fsp")
    assert notes.read_text() == "keep\n"


def test_a_target_anywhere_inside_a_folder_read_is_refused(tmp_path: Path) -> None:
    """xf06: ``target`` must not "lie inside" a folder of ``reads``, at any depth."""
    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / "old").mkdir(parents=True)
    for target in (checkpoints / "model.fsp", checkpoints / "old" / "model.fsp"):
        with pytest.raises(FileExistsError, match="which --resume needs"):
            check_writable(target, reads=[checkpoints])


@needs_safetensors
def test_another_name_of_the_file_read_is_refused(tmp_path: Path) -> None:
    """xf07: a hard link to the source is the file being read (another path, the same
    file, which ``resolve`` does not tell); writing there would lose it."""
    source = tmp_path / "model.fsp"
    save_sparse(small_net(), source)
    link = tmp_path / "link.fsp"
    try:
        os.link(source, link)
    except OSError:
        pytest.skip("no hard links here")
    with pytest.raises(FileExistsError, match="it is the file being read"):
        check_writable(link, reads=[source])


def test_a_name_of_the_other_format_is_refused_in_capitals_too(tmp_path: Path) -> None:
    """xf08: a suffix names a format whatever its case (``MODEL.ONNX`` is an ONNX name)."""
    with pytest.raises(ValueError, match=r"is named as an ONNX model"):
        check_writable(tmp_path / "MODEL.ONNX")
    with pytest.raises(ValueError, match=r"is named as a sparse checkpoint"):
        check_writable(tmp_path / "model.FSP", "model.onnx", kind="onnx")


@needs_safetensors
def test_a_damaged_fsp_with_its_header_cut_short_is_replaced(tmp_path: Path) -> None:
    """xf12: a safetensors file whose header cannot be read counts as a ``.fsp`` (the
    docstring of ``_existing_kind``), which a new export may replace."""
    path = tmp_path / "model.fsp"
    save_sparse(small_net(), path)
    path.write_bytes(path.read_bytes()[:20])  # the length, "{" and a few header bytes
    save_sparse(small_net(), path)
    loaded = load_sparse(
        path, nn.Sequential(nn.Flatten(), nn.Linear(40, 8), nn.ReLU(), nn.Linear(8, 4))
    )
    x = torch.randn(3, 1, 40)
    assert torch.equal(loaded.eval()(x), small_net()(x))


# The smallest ModelProto is_onnx accepts, written from onnx.proto: ir_version (field 1,
# varint), graph (field 7, length-delimited) and opset_import (field 8, length-delimited).
_IR7 = b"\x08\x07"
_EMPTY_GRAPH = b"\x3a\x00"
_EMPTY_OPSET = b"\x42\x00"


@pytest.mark.parametrize(
    ("content", "onnx"),
    [
        (_IR7 + _EMPTY_GRAPH + _EMPTY_OPSET, True),
        (b"\x08\x07" + b"\x3a\x80\x01" + bytes(128) + _EMPTY_OPSET, True),  # a 128-byte graph
        (b"\x12\x03abc", False),  # producer_name alone
        (_IR7, False),  # no graph, no opset
        (_IR7 + _EMPTY_GRAPH, False),  # no opset
        (_IR7 + b"\x38\x01" + b"\x40\x01", False),  # graph and opset as varints
        (b"\x08\x00" + _EMPTY_GRAPH + _EMPTY_OPSET, False),  # IR version 0 does not exist
    ],
)
def test_is_onnx_on_hand_made_protobufs(content: bytes, onnx: bool, tmp_path: Path) -> None:
    """xf14, xf15, xf16, xf17: the IR version, the graph and an opset must be there, each
    with ONNX's wire type, the IR version above 0; a varint byte of 0x80 continues."""
    path = tmp_path / "file"
    path.write_bytes(content)
    assert is_onnx(path) is onnx


# ---------------------------------------------------------------- train/fit.py
@guard(
    "`check_model_takes` given a model that is on another device than the CPU (a GPU)",
    "the two zero samples are made on the model's device: a model that takes the data is "
    "not refused, one that does not is (`ValueError` naming both)",
)
@pytest.mark.parametrize("device", ["meta", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_check_runs_on_the_device_the_model_is_on(device: str) -> None:
    """The docstring: "the model is run on two zero samples on the device it is on". Zeros
    made on the CPU made a model on any other device fail, so it was refused as a model that
    does not take the data (``meta``: shapes without memory, a stand-in for a GPU here)."""
    fits = nn.Sequential(nn.Flatten(), nn.Linear(40, 3)).to(device)
    check_model_takes(fits, model_name="m", dataset="mnist1d", shape=(1, 40), num_classes=3)
    with pytest.raises(ValueError, match=r"model 'w' does not take data set 'mnist1d'"):
        check_model_takes(
            nn.Linear(3, 2).to(device),
            model_name="w",
            dataset="mnist1d",
            shape=(1, 40),
            num_classes=3,
        )


class _Recorder(nn.Module):
    """A model that takes any sample and records what it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(1, 3)
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.clone())
        return self.fc(x.flatten(1)[:, :1])


def test_the_model_is_run_once_on_two_zero_samples() -> None:
    """xf20: "runs the model forward once on a batch of two zero samples"."""
    model = _Recorder()
    check_model_takes(model, model_name="m", dataset="mnist1d", shape=(1, 40), num_classes=3)
    (x,) = model.seen
    assert x.shape == (2, 1, 40) and not x.any()


class _Noisy(nn.Module):
    """A model that draws random numbers in its forward, in evaluation mode too."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(40, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1) + 0.01 * torch.randn_like(x.flatten(1)))


def test_the_check_leaves_the_random_state_of_a_model_that_draws() -> None:
    """xf19: the check "changes neither the model nor what a seeded run draws afterwards"."""
    model = _Noisy()  # built first: its initialisation draws
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    check_model_takes(model, model_name="m", dataset="mnist1d", shape=(1, 40), num_classes=3)
    assert torch.equal(torch.rand(3), expected)


class _Indexing(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0, 100].unsqueeze(1)  # an IndexError on 40-long samples


class _TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x * mask  # a TypeError when called with one input


@guard(
    "a model whose forward fails on the data's samples with an `IndexError` or a `TypeError` "
    "(an index past the sample, a second input it needs)",
    "`ValueError` naming the model, the data set, the sample shape and the error, before "
    "training, like a shape error",
)
@pytest.mark.parametrize("model", [_Indexing(), _TwoInputs()], ids=["IndexError", "TypeError"])
def test_an_index_or_type_error_of_the_forward_names_the_model_and_the_data(
    model: nn.Module,
) -> None:
    """xf21: the documented ``Raises: ValueError`` for a forward that fails, not the raw error."""
    with pytest.raises(
        ValueError, match=r"model 'odd' does not take data set 'mnist1d'.*\(1, 40\)"
    ):
        check_model_takes(model, model_name="odd", dataset="mnist1d", shape=(1, 40), num_classes=3)


def _bundled_recipes() -> dict[str, dict[str, Any]]:
    """Each bundled recipe's TOML, read here (independently of ``recipes_for``)."""
    folder = Path(feather_sparse.recipes.__file__).parent
    return {p.stem: tomllib.loads(p.read_text()) for p in sorted(folder.glob("*.toml"))}


def test_the_fix_names_the_recipes_of_the_data_set_only_and_the_recipe_given() -> None:
    """xf22, xf24: "the bundled recipe made for that data" and the recipe the settings came
    from, named if given."""
    recipes = _bundled_recipes()
    ours = {name for name, r in recipes.items() if r.get("dataset") == "mnist1d"}
    others = set(recipes) - ours
    assert ours and others  # mnist1d's recipes, and the image recipes
    with pytest.raises(ValueError) as err:
        check_model_takes(
            nn.Linear(3, 2),
            model_name="lin",
            dataset="mnist1d",
            shape=(1, 40),
            num_classes=10,
            recipe="mine",
        )
    message = str(err.value)
    assert message.startswith("model 'lin' (of recipe mine) does not take data set 'mnist1d'")
    for name in ours:
        assert f"--recipe {name} trains {recipes[name]['model']}" in message
    for name in others:
        assert f"--recipe {name} " not in message


def test_the_models_that_take_a_shape_are_listed_once_each() -> None:
    """xf23: the bundled recipes' models, each once (two mnist1d recipes share one model)."""
    models = [r["model"] for r in _bundled_recipes().values()]
    assert len(models) > len(set(models))  # a model of several recipes
    found = models_taking((1, 40), 10)
    assert found == list(dict.fromkeys(found)) and "mnist1d_cnn" in found


# --------------------------------------------------------------- train/dist.py
class _FakeDist:
    """The calls init_distributed makes on ``torch.distributed`` and ``torch.cuda``, recorded."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, *, initialized: bool, cuda: bool, gpus: int = 4
    ) -> None:
        self.backends: list[str] = []
        self.gpus: list[int] = []
        dist = torch.distributed
        monkeypatch.setattr(dist, "is_available", lambda: True)
        monkeypatch.setattr(dist, "is_initialized", lambda: initialized)
        monkeypatch.setattr(
            dist, "init_process_group", lambda backend: self.backends.append(backend)
        )
        monkeypatch.setattr(torch.cuda, "set_device", lambda index: self.gpus.append(index))
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
        device = torch.device("cuda" if cuda else "cpu")
        monkeypatch.setattr(train_dist, "resolve_device", lambda name: device)


def _torchrun_env(monkeypatch: pytest.MonkeyPatch, rank: int, local_rank: int) -> None:
    """What torchrun --nnodes=2 --nproc_per_node=4 sets on the process of global rank ``rank``."""
    for key, value in {
        "WORLD_SIZE": "8",
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": "4",
    }.items():
        monkeypatch.setenv(key, value)


def test_under_torchrun_on_cuda_the_process_joins_with_nccl_on_gpu_local_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """xf26, xf27, xf28: docs/distributed.md: "``nccl`` when the device is CUDA (process ``i``
    uses GPU ``LOCAL_RANK``), ``gloo`` on CPU"; True: this call initialised the group."""
    _torchrun_env(monkeypatch, rank=6, local_rank=2)
    fake = _FakeDist(monkeypatch, initialized=False, cuda=True)
    assert init_distributed("auto") is True
    assert fake.backends == ["nccl"] and fake.gpus == [2]
    fake = _FakeDist(monkeypatch, initialized=False, cuda=False)
    assert init_distributed("cpu") is True
    assert fake.backends == ["gloo"] and fake.gpus == []


@guard(
    "torchrun starts more processes per machine than it has GPUs for a CUDA run "
    "(`--nproc_per_node=2` on a one-GPU machine, `device = auto`)",
    "exit 1 on the process without a GPU, before joining the group: start at most as "
    "many as there are GPUs, or --device cpu",
)
def test_more_processes_than_gpus_on_a_machine_is_refused_before_joining(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LOCAL_RANK 1 of a CUDA run on a machine with one GPU: NCCL cannot share the GPU, and
    set_device(1) would fail with CUDA's own 'invalid device ordinal'."""
    _torchrun_env(monkeypatch, rank=1, local_rank=1)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = _FakeDist(monkeypatch, initialized=False, cuda=True, gpus=1)
    with pytest.raises(ValueError, match=r"number 1 \(LOCAL_RANK\) on its machine") as info:
        init_distributed("auto")
    assert "shows it 1 CUDA device:" in str(info.value)
    assert "--nproc_per_node=1" in str(info.value) and "--device cpu" in str(info.value)
    assert fake.backends == [] and fake.gpus == []
    # a launcher that gives each process its own GPU through the variable: it is named
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(ValueError, match=r"1 CUDA device \(CUDA_VISIBLE_DEVICES='3' here\)"):
        init_distributed("auto")
    _torchrun_env(monkeypatch, rank=0, local_rank=0)  # the first process has its GPU
    assert init_distributed("auto") is True
    assert fake.backends == ["nccl"] and fake.gpus == [0]


def test_a_group_that_exists_already_is_not_joined_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """xf25: "Does nothing ... when a group exists already" (and says it did not create it)."""
    _torchrun_env(monkeypatch, rank=1, local_rank=1)
    fake = _FakeDist(monkeypatch, initialized=True, cuda=False)
    assert init_distributed("cpu") is False
    assert fake.backends == [] and fake.gpus == []


@pytest.mark.parametrize("local", ["-4", "-1"])
def test_a_negative_local_world_size_is_not_the_processes_per_node(
    local: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """xf29: a count of processes per node is at least 1 (None: "said a number that does not
    divide"; 8 % -4 == 0 in Python)."""
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 3)
    monkeypatch.setattr(dist, "get_world_size", lambda: 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    assert distributed_context() == DistContext(rank=3, world_size=8, local_world_size=None)


def test_the_cli_leaves_the_group_it_joined_after_success_and_after_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """xf32: the group ``init_distributed`` created is destroyed at the end, after a barrier
    when the run ended well, without one when it failed (the others must not wait)."""
    calls: list[str] = []
    monkeypatch.setattr(cli_train, "init_distributed", lambda device: True)
    monkeypatch.setattr(cli_train, "distributed_context", lambda: DistContext(1, 2))
    monkeypatch.setattr(torch.distributed, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: calls.append("destroy"))
    stopped = types.SimpleNamespace(
        completed=False, epochs=1, test_accuracy=0.5, run_dir=tmp_path, table=""
    )
    monkeypatch.setattr(cli_train, "train", lambda *args, **kwargs: stopped)
    assert cli.main(["train", "--run-dir", str(tmp_path), "--stop-after-epoch", "1"]) == 0
    assert calls == ["barrier", "destroy"]

    def failing(*args: Any, **kwargs: Any) -> None:
        raise ValueError("this rank failed")

    calls.clear()
    monkeypatch.setattr(cli_train, "train", failing)
    assert cli.main(["train", "--run-dir", str(tmp_path), "--stop-after-epoch", "1"]) == 1
    assert calls == ["destroy"]


# ----------------------------------------------------------- train/progress.py
class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(("stderr_tty", "stdout_tty"), [(True, False), (False, True)])
def test_the_bar_follows_stderr_and_an_explicit_choice(
    stderr_tty: bool, stdout_tty: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """xf33, xf34: ``--progress``'s help: "on when stderr is a terminal"; an explicit
    ``progress=False`` (``--no-progress``) or True wins over the terminal."""
    monkeypatch.setattr(sys, "stderr", _Stream(stderr_tty))
    monkeypatch.setattr(sys, "stdout", _Stream(stdout_tty))
    assert progress._use_bar(None) is stderr_tty
    assert progress._use_bar(False) is False
    assert progress._use_bar(True) is True


def test_the_bar_is_drawn_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """xf35: the bar goes to stderr, leaving stdout to the results the CLI prints."""
    pytest.importorskip("tqdm")
    bar = progress._Progress(4, "epoch 1/3", True)
    for done in range(1, 5):
        bar.update(done, {"loss": "0.5000"})
    bar.close()
    out, err = capsys.readouterr()
    assert out == "" and "epoch 1/3" in err


def _clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    return now


def test_without_tqdm_the_epoch_runs_and_logs_a_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """xf36: the bar is optional (``tqdm`` is an extra): without it, the log lines."""
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # `from tqdm.auto import` fails
    now = _clock(monkeypatch)
    bar = progress._Progress(10, "epoch 1/3", True)
    assert bar.bar is None
    now[0] = progress.LOG_INTERVAL_S
    with caplog.at_level(logging.INFO, logger=progress.logger.name):
        bar.update(5, {"loss": "0.5000"})
    bar.close()
    assert [r.getMessage() for r in caplog.records] == ["epoch 1/3 step 5/10 loss 0.5000"]


def test_without_a_bar_an_in_epoch_line_is_logged_at_most_every_interval(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """xf37, xf38: "log an in-epoch line at most this often" (``LOG_INTERVAL_S``, 30 s),
    counted from the last line logged."""
    now = _clock(monkeypatch)
    bar = progress._Progress(100, "epoch 2/3", False)
    interval = progress.LOG_INTERVAL_S
    logged = []
    with caplog.at_level(logging.INFO, logger=progress.logger.name):
        for step, t in enumerate([1.0, 10.0, interval, interval + 1, 1.5 * interval, 2 * interval]):
            now[0] = t
            caplog.clear()
            bar.update(step + 1, {"loss": "0.1"})
            logged.append(bool(caplog.records))
    assert logged == [False, False, True, False, False, True]


def test_the_bars_threshold_is_the_mean_over_the_layers() -> None:
    """xf39: "one number for the bar: the global threshold (the mean over layers otherwise)"."""
    per_layer = types.SimpleNamespace(
        thresholds=lambda: [torch.tensor(1.0), torch.tensor(2.0), torch.tensor(6.0)]
    )
    assert progress._threshold_value(per_layer) == pytest.approx(3.0)


def test_the_dense_table_counts_the_prunable_layer_types_only() -> None:
    """xf40: "a per-layer table of the dense model's prunable-type weights"."""
    model = nn.Sequential(nn.Conv1d(1, 4, 3), nn.BatchNorm1d(4), nn.Flatten(), nn.Linear(8, 2))
    table = progress._dense_table(model)
    prunable = 4 * 1 * 3 + 2 * 8  # the Conv1d's and the Linear's weights
    assert f"| **total** | | {prunable:,} |" in table
    assert "| 1 |" not in table  # the batch norm has no row


def test_the_epoch_line_shows_the_test_accuracy_in_percent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """xf41: the epoch line gives accuracies in percent, as the training accuracy."""
    row = {
        "epoch": 1,
        "train_loss": 0.5,
        "train_acc": 0.25,
        "test_loss": 0.75,
        "test_acc": 0.5,
        "sparsity": 0.9,
        "threshold": 0.01,
        "lr": 0.1,
        "epoch_time": 1.0,
    }
    with caplog.at_level(logging.INFO, logger=progress.logger.name):
        progress._log_epoch(row, 3)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "train loss 0.5000 acc 25.00%" in line and "test loss 0.7500 acc 50.00%" in line
