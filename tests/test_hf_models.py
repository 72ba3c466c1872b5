"""Hugging Face model families end to end: tiny GPT-2, BERT, Llama (tied and untied) and ViT
built from configs (no downloads), pruned by hand and by the Trainer callback.

Each model trains a few steps on random inputs, is finalized, and must then
save and load through ``save_pretrained``/``from_pretrained`` and
``fs.save_sparse``/``fs.load_sparse`` unchanged (and still ``generate()``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import feather_sparse as fs
from _guards import guard
from _helpers import one_thread

os.environ.setdefault("HF_HUB_OFFLINE", "1")

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'feather-sparse[hf]')"
)

VOCAB = 64


def gpt2() -> nn.Module:
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def bert_mlm() -> nn.Module:
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    return transformers.BertForMaskedLM(config)


def llama(tied: bool) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        config = transformers.LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=32,
            tie_word_embeddings=tied,
        )
        return transformers.LlamaForCausalLM(config)

    return make


def vit() -> nn.Module:
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
    )
    return transformers.ViTForImageClassification(config)


# name: (builder, the input embedding's module name or None, whether it is tied to the head)
MODELS: dict[str, tuple[Callable[[], nn.Module], str | None, bool]] = {
    "gpt2": (gpt2, "transformer.wte", True),
    "bert-mlm": (bert_mlm, "bert.embeddings.word_embeddings", True),
    "llama": (llama(tied=False), "model.embed_tokens", False),
    "llama-tied": (llama(tied=True), "model.embed_tokens", True),
    "vit": (vit, None, False),
}
CAUSAL = ("gpt2", "llama", "llama-tied")


def build(name: str) -> Any:
    torch.manual_seed(0)
    return MODELS[name][0]()


def batch(name: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if name == "vit":
        return {
            "pixel_values": torch.randn(2, 3, 16, 16, generator=g),
            "labels": torch.tensor([0, 2]),
        }
    ids = torch.randint(1, VOCAB, (2, 12), generator=g)
    return {"input_ids": ids, "labels": ids}


def prunable(model: nn.Module) -> dict[str, Any]:
    """Modules the default ``include`` takes: Linear, Conv and GPT-2's Conv1D."""
    from transformers.pytorch_utils import Conv1D

    kinds = (nn.Linear, nn.Conv2d, Conv1D)
    return {n: m for n, m in model.named_modules() if isinstance(m, kinds)}


@pytest.mark.parametrize("how", ["sparsity", "2:4"])
@pytest.mark.parametrize("name", list(MODELS))
def test_each_family_prunes_finalizes_and_round_trips(name: str, how: str, tmp_path: Path) -> None:
    _, embedding, tied = MODELS[name]
    model = build(name)
    kwargs: dict[str, Any] = {"sparsity": 0.8, "total_steps": 3} if how == "sparsity" else {}
    pruner = fs.Pruner(model, pattern=None if how == "sparsity" else "2:4", **kwargs)
    # Default targets: every Linear/Conv (ViT's patch projection, the head included);
    # the token embedding only as the tied alias of the head.
    assert {t.name for t in pruner.targets} == set(prunable(model))
    assert [alias.name for alias, _ in pruner.tied] == ([embedding] if tied else [])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with one_thread():
        for _ in range(3):
            model(**batch(name)).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            pruner.step()
        achieved = pruner.finalize()
    weights: list[torch.Tensor] = [m.weight for m in prunable(model).values()]
    n = sum(w.numel() for w in weights)
    zeros = sum(int((w == 0).sum()) for w in weights)
    target = 0.8 if how == "sparsity" else 0.5
    assert zeros == round(target * n) and achieved == pytest.approx(target, abs=1 / n)
    if embedding is not None:
        table = model.get_submodule(embedding).weight
        head = model.get_output_embeddings().weight
        assert (table is head) == tied  # finalize keeps the tie
        assert int((table == 0).sum()) == (int((head == 0).sum()) if tied else 0)
    model.eval()
    with torch.no_grad():
        expected = model(**batch(name)).logits

    model.save_pretrained(tmp_path / "hf")
    loaded = type(model).from_pretrained(tmp_path / "hf").eval()
    info = fs.save_sparse(model, tmp_path / "m.fsp")
    # every key that shares its tensor with an earlier one is stored as an alias of it
    first: dict[int, str] = {}
    for key, value in model.state_dict().items():
        first.setdefault(value.data_ptr(), key)
    shared = {
        k: first[v.data_ptr()] for k, v in model.state_dict().items() if first[v.data_ptr()] != k
    }
    assert {r.name: r.alias_of for r in info.tensors if r.is_alias} == shared
    assert bool(shared) == (tied or name == "bert")  # BERT also ties its decoder's bias
    fresh = fs.load_sparse(tmp_path / "m.fsp", build(name)).eval()
    for other in (loaded, fresh):
        assert not any("parametrizations" in k for k in other.state_dict())
        for key, value in model.state_dict().items():
            assert torch.equal(other.state_dict()[key], value), key
        with torch.no_grad():
            assert torch.equal(other(**batch(name)).logits, expected)
    if name in CAUSAL:
        prompt = batch(name)["input_ids"][:, :4]
        out = loaded.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=0)
        assert out.shape == (2, 7)


def test_gpt2_excluding_the_head_keeps_the_tied_embedding_dense() -> None:
    model = build("gpt2")
    pruner = fs.Pruner(model, sparsity=0.8, total_steps=1, schedule="constant", exclude=["lm_head"])
    assert not pruner.tied and "lm_head" not in {t.name for t in pruner.targets}
    pruner.finalize()
    assert int((model.transformer.wte.weight == 0).sum()) == 0
    assert model.lm_head.weight is model.transformer.wte.weight
    with pytest.raises(ValueError, match="tied weight is pruned everywhere or nowhere"):
        fs.Pruner(build("gpt2"), sparsity=0.8, total_steps=1, exclude=["transformer.wte"])


# ---------------------------------------------------------------- the Trainer on tied GPT-2
pytest.importorskip("accelerate", reason="the Trainer needs accelerate (feather-sparse[hf])")

from transformers import (  # noqa: E402
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from feather_sparse.integrations.hf import PRUNER_STATE_NAME, FeatherCallback  # noqa: E402

SAMPLES, BATCH, EPOCHS = 16, 4, 2
STEPS = SAMPLES // BATCH * EPOCHS  # 8 optimizer steps
SAVE_STEPS = STEPS // 2


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        self.ids = torch.randint(
            1, VOCAB, (SAMPLES, 12), generator=torch.Generator().manual_seed(1)
        )

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class SavePretrainedMidway(TrainerCallback):
    """``model.save_pretrained`` at step 2 while the Pruner is attached; keeps the dense weights."""

    def __init__(self, feather: FeatherCallback, folder: Path) -> None:
        self.feather, self.folder = feather, folder
        self.dense: dict[str, torch.Tensor] | None = None

    def on_step_end(
        self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any
    ) -> None:
        if state.global_step == 2 and self.dense is None:
            assert self.feather.pruner is not None
            self.dense = {k: v.clone() for k, v in self.feather.pruner.dense_state_dict().items()}
            model.save_pretrained(self.folder)


def arguments(output_dir: Path, epochs: int = EPOCHS) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=BATCH,
        num_train_epochs=epochs,
        save_steps=SAVE_STEPS,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        log_level="error",
    )


def train(
    output_dir: Path, resume: Path | None = None, midway: Path | None = None
) -> tuple[Any, FeatherCallback, SavePretrainedMidway | None]:
    model = build("gpt2")
    feather = FeatherCallback(0.8)
    saver = SavePretrainedMidway(feather, midway) if midway is not None else None
    trainer = Trainer(
        model=model,
        args=arguments(output_dir),
        train_dataset=Tokens(),
        callbacks=[saver] if saver is not None else [],
    )
    feather.install(trainer)
    with one_thread():
        trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    return model, feather, saver


@pytest.fixture(scope="module")
def gpt2_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("gpt2")
    full = train(out / "run", midway=out / "midway")
    checkpoint = out / "run" / f"checkpoint-{SAVE_STEPS}"
    saved = torch.load(checkpoint / PRUNER_STATE_NAME, weights_only=True)  # before the resume
    resumed = train(out / "run", resume=checkpoint)
    return {"full": full, "resumed": resumed, "checkpoint": checkpoint, "saved": saved, "out": out}


def test_trainer_finalizes_tied_gpt2_and_it_round_trips(
    gpt2_runs: dict[str, Any], tmp_path: Path
) -> None:
    model, feather, _ = gpt2_runs["full"]
    assert feather.final_sparsity == pytest.approx(0.8, abs=1e-4)
    assert model.lm_head.weight is model.transformer.wte.weight
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_save_pretrained_during_training_holds_the_dense_plain_weights(
    gpt2_runs: dict[str, Any],
) -> None:
    _, _, saver = gpt2_runs["full"]
    assert saver is not None and saver.dense is not None
    loaded = transformers.GPT2LMHeadModel.from_pretrained(gpt2_runs["out"] / "midway")
    state = loaded.state_dict()
    assert set(state) == set(build("gpt2").state_dict())
    for key, value in saver.dense.items():
        assert torch.equal(state[key], value), key  # the dense weights, tied head included


def test_resume_of_tied_gpt2_restores_the_pruner_bit_exactly(gpt2_runs: dict[str, Any]) -> None:
    full_model, _, _ = gpt2_runs["full"]
    model, feather, _ = gpt2_runs["resumed"]
    assert feather.pruner is not None and feather.pruner.current_step == STEPS
    saved = gpt2_runs["saved"]
    assert saved["step"] == SAVE_STEPS
    expected = full_model.state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key]), key


def begin(feather: FeatherCallback, model: nn.Module, folder: Path, max_steps: int) -> None:
    """What the Trainer does first when it resumes at SAVE_STEPS (without training after it)."""
    args = TrainingArguments(output_dir=str(folder), use_cpu=True, report_to=[])
    state = TrainerState(global_step=SAVE_STEPS, max_steps=max_steps)
    feather.on_train_begin(args, state, TrainerControl(), model=model)


def is_plain(model: nn.Module) -> bool:
    plain = not any(hasattr(m, "parametrizations") for m in model.modules())
    return plain and set(model.state_dict()) == set(build("gpt2").state_dict())


@guard(
    "HF: resuming a Trainer checkpoint with another training length (more epochs, `max_steps`)",
    "`ValueError` naming both step counts and the fix (the same length, or a new run); "
    "the model left plain",
)
def test_resuming_with_another_training_length_is_one_clear_error(
    gpt2_runs: dict[str, Any], tmp_path: Path
) -> None:
    model = build("gpt2")
    feather = FeatherCallback(0.8, resume_from=gpt2_runs["checkpoint"])
    with pytest.raises(ValueError) as info:
        begin(feather, model, tmp_path, max_steps=STEPS + 4)
    message = str(info.value)
    assert f"laid out on {STEPS} optimizer steps, but this run has {STEPS + 4}" in message
    assert "training length" in message and "from_state_dict" not in message
    assert feather.pruner is None and is_plain(model)


@guard(
    "HF: resuming a Trainer checkpoint with other callback settings (`sparsity`, `exclude`)",
    "`ValueError` naming the setting and both values, advising the run's own settings; "
    "the model left plain",
)
@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"sparsity": 0.9}, "saved with sparsity=0.8, but this callback has sparsity=0.9"),
        (
            {"sparsity": 0.8, "exclude": ["lm_head"]},
            r"saved with targets=9 layers \(lm_head at 8\), but this callback has targets=8 "
            r"\(none at 8\)",
        ),
    ],
)
def test_resuming_with_other_settings_is_one_clear_error(
    gpt2_runs: dict[str, Any], tmp_path: Path, kwargs: dict[str, Any], expected: str
) -> None:
    model = build("gpt2")
    feather = FeatherCallback(**kwargs, resume_from=gpt2_runs["checkpoint"])
    with pytest.raises(ValueError, match=expected) as info:
        begin(feather, model, tmp_path, max_steps=STEPS)
    assert "settings of the run that wrote the checkpoint" in str(info.value)
    assert "from_state_dict" not in str(info.value)
    assert feather.pruner is None and is_plain(model)
