"""The Hugging Face Trainer callback on a tiny randomly-initialised BERT (no downloads).

One uninterrupted run (gradient accumulation 2, a checkpoint halfway) and one
run resumed from that checkpoint are shared by the tests through a
module-scoped fixture; each Trainer run takes a few seconds on a CPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from _helpers import one_thread

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SPARSITY = 0.8
SAMPLES, BATCH, ACCUMULATION, EPOCHS = 32, 4, 2, 2
# 32 samples / batch 4 = 8 micro-batches = 4 optimizer steps per epoch.
OPTIMIZER_STEPS = SAMPLES // BATCH // ACCUMULATION * EPOCHS
SAVE_STEPS = OPTIMIZER_STEPS // 2


def test_importing_the_core_imports_no_framework() -> None:
    code = (
        "import sys, feather_sparse, feather_sparse.integrations;"
        "bad = [m for m in ('transformers', 'lightning', 'pytorch_lightning') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    src = str(Path(fs.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'feather-sparse[hf]')"
)
pytest.importorskip("accelerate", reason="the Trainer needs accelerate (feather-sparse[hf])")

from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from feather_sparse.integrations.hf import PRUNER_STATE_NAME, FeatherCallback  # noqa: E402


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def quiet_args(output_dir: Path, **options: Any) -> TrainingArguments:
    """Trainer arguments for these tests: CPU, seed 0, batch BATCH for EPOCHS epochs, no
    reporting or progress bars; ``options`` add to them."""
    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=BATCH,
        num_train_epochs=EPOCHS,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        log_level="error",
        **options,
    )


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 64, (SAMPLES, 16), generator=g)
        self.labels = torch.randint(0, 2, (SAMPLES,), generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class Recorder(TrainerCallback):
    """Counts optimizer steps and keeps what it sees, for the assertions."""

    def __init__(self, feather: FeatherCallback) -> None:
        self.feather = feather
        self.optimizer_steps = 0
        self.logs: list[dict[str, float]] = []
        self.state_at_begin: dict[str, Any] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        assert self.feather.pruner is not None
        self.state_at_begin = self.feather.pruner.state_dict()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.optimizer_steps += 1

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        self.logs.append(dict(logs))


def train(
    output_dir: Path, resume: str | None = None
) -> tuple[BertForSequenceClassification, FeatherCallback, Recorder, Trainer]:
    model = tiny_bert()
    args = quiet_args(
        output_dir,
        gradient_accumulation_steps=ACCUMULATION,
        save_steps=SAVE_STEPS,
        logging_steps=1,
    )
    feather = FeatherCallback(SPARSITY, exclude=["classifier"])
    recorder = Recorder(feather)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(), callbacks=[recorder])
    feather.install(trainer)  # first, ahead of the recorder (as of any logger)
    trainer.train(resume_from_checkpoint=resume)
    return model, feather, recorder, trainer


@dataclass
class Runs:
    full: tuple[BertForSequenceClassification, FeatherCallback, Recorder, Trainer]
    resumed: tuple[BertForSequenceClassification, FeatherCallback, Recorder, Trainer]
    checkpoint: Path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    out = tmp_path_factory.mktemp("hf")
    with one_thread():
        full = train(out)
        checkpoint = out / f"checkpoint-{SAVE_STEPS}"
        resumed = train(out, resume=str(checkpoint))
    return Runs(full, resumed, checkpoint)


def pruned_linears(model: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and not name.startswith("classifier")
    ]


def test_pruner_steps_once_per_optimizer_step(runs: Runs) -> None:
    _, feather, recorder, trainer = runs.full
    assert feather.pruner is not None
    assert trainer.state.max_steps == OPTIMIZER_STEPS
    assert recorder.optimizer_steps == OPTIMIZER_STEPS
    assert feather.pruner.current_step == OPTIMIZER_STEPS
    assert feather.pruner.total_steps == OPTIMIZER_STEPS


def test_final_model_is_plain_and_exactly_at_target(runs: Runs) -> None:
    model, feather, _, _ = runs.full
    layers = pruned_linears(model)
    assert layers and not any(hasattr(m, "parametrizations") for _, m in layers)
    n = sum(m.weight.numel() for _, m in layers)
    zeros = sum(int((m.weight == 0).sum()) for _, m in layers)
    assert zeros == round(SPARSITY * n)
    assert feather.final_sparsity == pytest.approx(zeros / n)
    assert int((model.classifier.weight == 0).sum()) == 0  # excluded: dense
    embedding = model.bert.embeddings.word_embeddings.weight[1:]  # row 0: padding, zero
    assert int((embedding == 0).sum()) == 0


def test_logs_follow_the_schedule_and_reach_earlier_callbacks(runs: Runs) -> None:
    _, feather, recorder, trainer = runs.full
    assert feather.pruner is not None
    train_logs = [log for log in trainer.state.log_history if "loss" in log]
    assert len(train_logs) == OPTIMIZER_STEPS
    for log in train_logs:
        step = int(log["step"])
        assert log["feather/scheduled_sparsity"] == pytest.approx(
            feather.pruner.scheduled_sparsity(step)
        )
        assert abs(log["feather/sparsity"] - log["feather/scheduled_sparsity"]) < 1e-3
        assert log["feather/threshold"] > 0
    seen = [log for log in recorder.logs if "loss" in log]
    assert all("feather/sparsity" in log for log in seen) and len(seen) == OPTIMIZER_STEPS


def test_checkpoint_holds_pruner_state_and_loads_into_the_dense_model(runs: Runs) -> None:
    state = torch.load(runs.checkpoint / PRUNER_STATE_NAME, weights_only=True)
    assert state["step"] == SAVE_STEPS
    from safetensors.torch import load_file

    weights = load_file(str(runs.checkpoint / "model.safetensors"))
    assert not any("parametrizations" in k for k in weights)
    dense = tiny_bert()
    dense.load_state_dict(weights, strict=True)  # plain keys: the dense model's own


def test_resume_restores_the_pruner_and_continues_identically(runs: Runs) -> None:
    saved = torch.load(runs.checkpoint / PRUNER_STATE_NAME, weights_only=True)
    full_model, _, _, _ = runs.full
    model, feather, recorder, _ = runs.resumed
    begin = recorder.state_at_begin
    assert begin is not None and begin["step"] == SAVE_STEPS
    for a, b in zip(begin["thresholds"], saved["thresholds"]):
        assert torch.equal(a, b)
    assert recorder.optimizer_steps == OPTIMIZER_STEPS - SAVE_STEPS
    assert feather.pruner is not None and feather.pruner.current_step == OPTIMIZER_STEPS
    expected = full_model.state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7, msg=key)


def test_resume_without_pruner_state_is_refused(runs: Runs, tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere"
    copy.mkdir()
    for f in runs.checkpoint.iterdir():
        if f.name != PRUNER_STATE_NAME:
            (copy / f.name).write_bytes(f.read_bytes())
    with pytest.raises(FileNotFoundError, match="resume_from"):
        train(tmp_path / "out", resume=str(copy))


def test_unknown_arguments_name_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown argument 'sparsty'.*exclude"):
        FeatherCallback(0.5, sparsty=0.9)
    with pytest.raises(ValueError, match="takes model from the trainer"):
        FeatherCallback(0.5, model=nn.Linear(2, 2))
    with pytest.raises(ValueError, match="takes total_steps from the trainer"):
        FeatherCallback(0.5, total_steps=10)


def begin(feather: FeatherCallback, model: nn.Module, folder: Path, step: int) -> None:
    """What the Trainer does first when it resumes at ``step`` (without training after it)."""
    args = TrainingArguments(output_dir=str(folder), use_cpu=True, report_to=[])
    state = TrainerState(global_step=step, max_steps=OPTIMIZER_STEPS)
    feather.on_train_begin(args, state, TrainerControl(), model=model)


def is_plain(model: nn.Module) -> bool:
    """No parametrization left, and the dense model's own checkpoint keys."""
    plain = not any(hasattr(m, "parametrizations") for m in model.modules())
    return plain and set(model.state_dict()) == set(tiny_bert().state_dict())


@guard(
    "HF: resuming the Trainer at one step with `resume_from` at another step's checkpoint",
    "`ValueError` naming both steps; the model left plain, so a corrected retry trains it",
)
def test_a_pruner_state_of_another_step_leaves_the_model_plain(runs: Runs, tmp_path: Path) -> None:
    model = tiny_bert()
    wrong = FeatherCallback(SPARSITY, exclude=["classifier"], resume_from=runs.checkpoint)
    with pytest.raises(
        ValueError, match=f"Pruner is at step {SAVE_STEPS} but the Trainer at {OPTIMIZER_STEPS}"
    ):
        begin(wrong, model, tmp_path, step=OPTIMIZER_STEPS)
    assert wrong.pruner is None and is_plain(model)
    # The user points resume_from at the right folder and starts again, same model.
    right = FeatherCallback(SPARSITY, exclude=["classifier"], resume_from=runs.checkpoint)
    begin(right, model, tmp_path, step=SAVE_STEPS)
    assert right.pruner is not None and right.pruner.current_step == SAVE_STEPS


@guard(
    "HF: a damaged `checkpoint-N/feather_pruner.pt` (cut short, garbage, empty)",
    "one `ValueError` naming the file and another checkpoint to resume from, "
    "no torch advice; the model left plain",
)
def test_a_damaged_pruner_state_is_one_clear_error(runs: Runs, tmp_path: Path) -> None:
    data = (runs.checkpoint / PRUNER_STATE_NAME).read_bytes()
    path = tmp_path / PRUNER_STATE_NAME
    for payload in (data[: len(data) // 2], b"not a torch file", b""):
        path.write_bytes(payload)
        model = tiny_bert()
        feather = FeatherCallback(SPARSITY, exclude=["classifier"], resume_from=tmp_path)
        with pytest.raises(ValueError) as info:
            begin(feather, model, tmp_path, step=SAVE_STEPS)
        message = str(info.value)
        assert str(path) in message and "damaged" in message and "resume_from" in message
        assert "weights_only" not in message and info.value.__suppress_context__
        assert is_plain(model)


@guard(
    "HF: a bad Pruner setting (`sparsity=1.5`, `backbone='globl'`) or `finalize='no'`",
    "`ValueError` when the callback is made, with the Pruner's own message",
)
def test_bad_settings_are_refused_when_the_callback_is_made() -> None:
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\)"):
        FeatherCallback(1.5)
    with pytest.raises(ValueError, match="unknown backbone 'globl'"):
        FeatherCallback(0.5, backbone="globl")
    with pytest.raises(ValueError, match="finalize must be True or False"):
        FeatherCallback(0.5, finalize="no")  # type: ignore[arg-type]


def test_the_pruner_reports_the_finalized_model_after_training(runs: Runs) -> None:
    model, feather, _, _ = runs.full
    assert feather.pruner is not None
    report = feather.pruner.report()  # the docs promise callback.pruner for its report
    layers = dict(pruned_linears(model))
    assert [row.name for row in report.layers] == list(layers)
    for row in report.layers:
        weight = layers[row.name].weight
        assert row.sparsity == int((weight == 0).sum()) / weight.numel()
        assert row.threshold > 0
    assert report.sparsity == feather.pruner.sparsity_achieved() == feather.final_sparsity
    assert report.step == OPTIMIZER_STEPS
    assert len(feather.pruner.thresholds()) == len(layers)
    with pytest.raises(RuntimeError, match=r"step\(\) is refused: this Pruner was finalized"):
        feather.pruner.step()


@guard(
    "HF: `FeatherCallback(sparsity=0.9, backbone='asl+')` (a backbone with trainable parameters)",
    "`ValueError` when the callback is made, not when training starts",
)
def test_a_trainable_backbone_is_refused_when_the_callback_is_made() -> None:
    with pytest.raises(
        ValueError, match=r"backbone 'asl\+' has trainable parameters.*FeatherCallback"
    ):
        FeatherCallback(0.9, backbone="asl+")


def tiny_gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=32)
    return transformers.GPT2LMHeadModel(config)


def test_gpt2_conv1d_layers_are_pruned_by_default() -> None:
    """GPT-2's attention and MLP weights are ``Conv1D`` layers (a Linear stored (in, out)),
    neither ``nn.Linear`` nor ``nn.ConvNd``: the default include takes them."""
    from transformers.pytorch_utils import Conv1D

    model = tiny_gpt2()
    convs = {n for n, m in model.named_modules() if isinstance(m, Conv1D)}
    pruner = fs.Pruner(model, sparsity=0.5, total_steps=1, schedule="constant")
    assert convs and convs <= {t.name for t in pruner.targets}
    pruner.finalize()
    zeros = sum(int((m.weight == 0).sum()) for n, m in model.named_modules() if n in convs)
    assert zeros > 0.3 * sum(m.weight.numel() for n, m in model.named_modules() if n in convs)


def test_gpt2_nm_groups_run_along_the_inputs_of_conv1d() -> None:
    """A Conv1D weight is (in, out): its N:M groups run down the columns (the inputs),
    which is what a 2:4 kernel on x @ W needs; training through it works."""
    from transformers.pytorch_utils import Conv1D

    model = tiny_gpt2()
    pruner = fs.Pruner(model, pattern="2:4", exclude=["lm_head"])
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    model(ids, labels=ids).loss.backward()
    pruner.finalize()
    layers = [m for m in model.modules() if isinstance(m, Conv1D)]
    assert layers
    for layer in layers:
        per_group = (layer.weight.t().reshape(-1, 4) != 0).sum(1)
        assert (per_group == 2).all()
    with pytest.raises(ValueError, match=r"stored \(in, out\)\) has 30 inputs"):
        bad = Conv1D(8, 30)  # nf=8 outputs, nx=30 inputs
        fs.Pruner(torch.nn.Sequential(bad), pattern="2:4", include=[Conv1D])


def test_load_best_model_at_end_finalizes_the_best_checkpoints_weights(tmp_path: Path) -> None:
    """The docs' promise: the Trainer loads the best checkpoint's dense weights (non-strictly,
    so plain keys matter) and finalize() prunes them to the target."""
    from safetensors.torch import load_file

    model = tiny_bert()
    args = quiet_args(
        tmp_path,
        eval_strategy="steps",
        eval_steps=3,
        save_steps=3,
        save_total_limit=1,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
    )
    feather = FeatherCallback(SPARSITY, exclude=["classifier"])
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=RandomTokens(),
        eval_dataset=RandomTokens(),
        callbacks=[feather],
    )
    with one_thread():
        trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None and feather.pruner is not None
    assert trainer.state.global_step > int(best.rsplit("-", 1)[1])  # not the last weights
    expected = tiny_bert()
    expected.load_state_dict(load_file(os.path.join(best, "model.safetensors")), strict=False)
    fs.Pruner(
        expected, SPARSITY, total_steps=feather.pruner.total_steps, exclude=["classifier"]
    ).finalize()
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected.state_dict()[key]), key
