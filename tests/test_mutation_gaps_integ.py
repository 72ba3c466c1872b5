"""Tests that kill the mutants of the framework integrations the suite missed.

See docs/mutation-audit.md, "The framework integrations": each test checks the
documented contract of the shared driver, the Hugging Face and Lightning
callbacks or the ``torch.ao``-style facade, against values computed here
(zeros counted in the forward's weights, k-th magnitudes), never against the
code's own output.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from _helpers import one_thread, quiet_trainer
from feather_sparse.backbones import GlobalBackbone, PruneTarget
from feather_sparse.integrations._common import PrunerDriver
from feather_sparse.integrations.ao import FeatherSparsifier

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*"),
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no"),
]


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def is_plain(model: nn.Module, like: nn.Module) -> bool:
    """No parametrization left, and the plain model's own state_dict keys."""
    plain = not any(hasattr(m, "parametrizations") for m in model.modules())
    return plain and set(model.state_dict()) == set(like.state_dict())


def forward_zeros(layer: Any) -> int:
    """Zeros of the weight the layer's forward uses (P_T(w) while a Pruner is attached)."""
    with torch.no_grad():
        return int((layer.weight == 0).sum())


# ----------------------------------------------------------------- the shared driver
class ConvScales(GlobalBackbone):
    """A backbone with one trainable scale per layer, for convolutions only: the probe
    on a one-Linear model cannot set it up, so only the real model shows its parameters."""

    name = "conv-scales"

    def setup(self, targets: Any) -> None:
        if not all(isinstance(t.module, nn.Conv2d) for t in targets):
            raise TypeError("conv-scales prunes convolutions only")
        super().setup(targets)
        self.scales = [nn.Parameter(torch.ones(())) for _ in targets]

    def parameters(self) -> list[nn.Parameter]:
        return list(self.scales)


def test_a_backbone_found_trainable_on_the_model_is_refused_and_the_model_left_plain() -> None:
    with pytest.raises(TypeError):  # what the probe meets (and passes over)
        ConvScales().setup([PruneTarget("probe", nn.Linear(4, 4))])
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
    driver = PrunerDriver("cb", 0.5, {"backbone": ConvScales()})  # the probe cannot tell
    with pytest.raises(ValueError, match=r"backbone 'conv-scales' has trainable parameters"):
        driver.attach(model, total_steps=4)
    assert driver.pruner is None and not driver.attached
    assert is_plain(model, nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3)))


def test_a_restored_state_is_applied_by_one_attach_only() -> None:
    model = mlp()
    first = PrunerDriver("cb", 0.5, {})
    first.attach(model, total_steps=8)
    first.step()
    first.step()
    saved = first.state_dict()
    first.finish()

    model = mlp()
    driver = PrunerDriver("cb", 0.5, {})
    driver.load_state_dict(saved)
    assert driver.attach(model, total_steps=8).current_step == 2  # the resumed run
    driver.reset()
    # A later run in the same process (train() again, not resuming): the trainer's own
    # state, step 0; the checkpoint's state belonged to the run that resumed from it.
    assert driver.attach(model, total_steps=8).current_step == 0
    assert not driver.has_pending()


def test_a_restored_state_not_yet_applied_is_what_the_driver_saves() -> None:
    """A checkpoint written between the restore and the attach keeps the restored state."""
    model = mlp()
    first = PrunerDriver("cb", 0.5, {})
    first.attach(model, total_steps=8)
    for _ in range(3):
        first.step()
    saved = first.state_dict()
    driver = PrunerDriver("cb", 0.5, {})
    assert driver.state_dict() == {}
    driver.load_state_dict(saved)
    again = driver.state_dict()
    assert again["step"] == 3 and again.keys() == saved.keys()
    for a, b in zip(again["thresholds"], saved["thresholds"]):
        assert torch.equal(a, b)


def test_the_logged_sparsity_is_the_fraction_the_forward_zeroes() -> None:
    """``feather/sparsity``: what the forward zeroes now, not what the schedule asks for.
    At S = 0.3 of 192 weights the global threshold prunes round(57.6) = 58."""
    model = mlp()
    driver = PrunerDriver("cb", 0.3, {"schedule": "constant"})
    driver.attach(model, total_steps=2)
    driver.step()
    n = sum(p.numel() for name, p in model.named_parameters() if name.endswith("weight.original"))
    zeros = forward_zeros(model[0]) + forward_zeros(model[2])
    assert (n, zeros) == (192, 58)
    metrics = driver.metrics()
    assert metrics["feather/scheduled_sparsity"] == 0.3
    assert metrics["feather/sparsity"] == pytest.approx(58 / 192, rel=1e-12)


def test_a_per_layer_backbone_logs_the_threshold_range_and_each_layers_sparsity() -> None:
    """The uniform backbone: half of each layer, a threshold of its own per layer."""
    model = mlp()
    driver = PrunerDriver(
        "cb", 0.5, {"schedule": "constant", "backbone": "uniform"}, log_layers=True
    )
    driver.attach(model, total_steps=2)
    driver.step()
    metrics = driver.metrics()
    bounds = {}
    for name in ("0", "2"):
        layer: Any = model[int(name)]
        stored = layer.parametrizations.weight.original.detach().abs().flatten()
        k = stored.numel() // 2
        low, high = float(stored.kthvalue(k).values), float(stored.kthvalue(k + 1).values)
        t = metrics[f"feather/threshold/{name}"]
        assert low <= t < high, (name, low, t, high)  # prunes exactly the k smallest
        bounds[name] = t
        assert metrics[f"feather/sparsity/{name}"] == forward_zeros(layer) / layer.weight.numel()
        assert metrics[f"feather/sparsity/{name}"] == 0.5
    assert bounds["0"] != bounds["2"]
    assert "feather/threshold" not in metrics
    assert metrics["feather/threshold_min"] == min(bounds.values())
    assert metrics["feather/threshold_max"] == max(bounds.values())


# ----------------------------------------------------------------- Hugging Face
def hf() -> Any:
    pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("accelerate", reason="the Trainer needs accelerate")
    from transformers import TrainerControl, TrainerState

    from feather_sparse.integrations import hf as module

    return module, TrainerState, TrainerControl


def test_hf_only_the_process_that_saves_writes_the_pruner_state(tmp_path: Path) -> None:
    """``on_save`` follows ``args.should_save``: under DDP only the main process writes
    (every process holds the same state; one file per checkpoint)."""
    module, TrainerState, TrainerControl = hf()
    callback = module.FeatherCallback(0.5)
    state = TrainerState(global_step=0, max_steps=4)
    args = SimpleNamespace(output_dir=str(tmp_path), should_save=True)
    callback.on_train_begin(args, state, TrainerControl(), model=mlp())
    state.global_step = 2
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    callback.on_save(SimpleNamespace(**{**vars(args), "should_save": False}), state, None)
    assert not (folder / module.PRUNER_STATE_NAME).exists()
    callback.on_save(args, state, None)
    assert (folder / module.PRUNER_STATE_NAME).is_file()


def test_hf_a_pruner_state_file_holding_no_dict_is_one_clear_error(tmp_path: Path) -> None:
    module, TrainerState, _ = hf()
    path = tmp_path / module.PRUNER_STATE_NAME
    torch.save([1, 2, 3], path)
    model = mlp()
    callback = module.FeatherCallback(0.5, resume_from=tmp_path)
    args = SimpleNamespace(output_dir=str(tmp_path / "out"), should_save=True)
    with pytest.raises(ValueError, match="holds a list, not a Pruner state_dict") as info:
        callback.on_train_begin(args, TrainerState(global_step=2, max_steps=4), None, model=model)
    assert str(path) in str(info.value)
    assert callback.pruner is None and is_plain(model, mlp())


# ----------------------------------------------------------------- Lightning
def lightning() -> Any:
    return pytest.importorskip("lightning.pytorch", reason="lightning is not installed")


def loader(batches: int = 8) -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    x, y = (
        torch.randn(4 * batches, 8, generator=g),
        torch.randint(0, 2, (4 * batches,), generator=g),
    )
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


def lit_module(manual: bool = False) -> Any:
    base: Any = lightning().LightningModule

    class Net(base):
        """Automatic optimization, or manual with two optimizers stepping in every batch."""

        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.automatic_optimization = not manual
            self.body = nn.Linear(8, 16)
            self.head = nn.Linear(16, 2)

        def loss(self, batch: Any) -> torch.Tensor:
            x, y = batch
            return nn.functional.cross_entropy(self.head(self.body(x).relu()), y)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if not manual:
                return self.loss(batch)
            optimizers = self.optimizers()
            for optimizer in optimizers:
                optimizer.zero_grad()
            self.manual_backward(self.loss(batch))
            for optimizer in optimizers:
                optimizer.step()
            return None

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", self.loss(batch))

        def configure_optimizers(self) -> Any:
            if manual:
                return [
                    torch.optim.SGD(self.body.parameters(), lr=0.1),
                    torch.optim.SGD(self.head.parameters(), lr=0.1),
                ]
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Net()


def lit_trainer(callbacks: list[Any], **kwargs: Any) -> Any:
    return quiet_trainer(callbacks, **{"max_epochs": 2, **kwargs})


def test_lightning_total_steps_true_is_refused() -> None:
    lightning()
    from feather_sparse.integrations.lightning import FeatherCallback

    with pytest.raises(ValueError, match="total_steps must be a positive int or None, got True"):
        FeatherCallback(0.5, total_steps=True)


def test_lightning_manual_two_steps_a_batch_with_max_steps_and_no_epoch_limit_is_refused() -> None:
    """``max_epochs=-1``: the fit's batches are bounded by ``max_steps`` alone, which counts
    both optimizers' steps, so the fit ends after max_steps / 2 batches of the max_steps
    batches ``estimated_stepping_batches`` lays the schedule out on."""
    lightning()
    from feather_sparse.integrations.lightning import FeatherCallback

    module = lit_module(manual=True)
    callback = FeatherCallback(0.5, exclude=["head"])
    trainer = lit_trainer([callback], max_epochs=-1, max_steps=40)
    with one_thread(), pytest.raises(ValueError, match=r"max_steps=40\).*made 2.*e\.g\. 20 "):
        trainer.fit(module, loader())
    assert callback.pruner is None
    assert not any(hasattr(m, "parametrizations") for m in module.modules())


def test_lightning_log_every_n_steps_zero_trains_without_logging() -> None:
    """``log_every_n_steps=0`` turns Lightning's logging off; the fit still prunes."""
    lightning()
    from feather_sparse.integrations.lightning import FeatherCallback

    module = lit_module()
    callback = FeatherCallback(0.5, exclude=["head"])
    with one_thread():
        lit_trainer([callback], log_every_n_steps=0).fit(module, loader())
    assert callback.pruner is not None and callback.pruner.current_step == 16
    assert forward_zeros(module.body) == round(0.5 * module.body.weight.numel())


def test_lightning_a_fit_that_reaches_the_target_does_not_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lightning()
    from feather_sparse.integrations.lightning import FeatherCallback

    module = lit_module()
    callback = FeatherCallback(0.5, exclude=["head"])
    with one_thread(), caplog.at_level(logging.WARNING, logger=FeatherCallback.__module__):
        lit_trainer([callback]).fit(module, loader())
    assert callback.pruner is not None
    assert callback.pruner.scheduled_sparsity(callback.pruner.current_step) == 0.5
    assert "in one jump" not in caplog.text


def test_lightning_resuming_a_fit_with_a_sanity_check_continues_the_pruning(
    tmp_path: Path,
) -> None:
    """Lightning's sanity check (validation before training, during ``fit``) must leave the
    restored Pruner state for ``on_train_start``: it is no checkpoint evaluation."""
    pl = lightning()
    from feather_sparse.integrations.lightning import FeatherCallback

    def run(folder: Path, ckpt_path: str | None) -> tuple[Any, Any]:
        module, callback = lit_module(), FeatherCallback(0.5, exclude=["head"])
        saver = pl.callbacks.ModelCheckpoint(dirpath=folder, save_top_k=-1, every_n_epochs=1)
        trainer = lit_trainer([callback, saver], enable_checkpointing=True, num_sanity_val_steps=2)
        with one_thread():
            trainer.fit(module, loader(), loader(2), ckpt_path=ckpt_path)
        return module, callback

    full, _ = run(tmp_path / "full", None)
    module, callback = run(tmp_path / "resumed", str(tmp_path / "full" / "epoch=0-step=8.ckpt"))
    assert callback.pruner is not None and callback.pruner.current_step == 16
    for key, value in module.state_dict().items():
        assert torch.equal(value, full.state_dict()[key]), key


# ----------------------------------------------------------------- torch.ao facade
def test_ao_include_is_refused_for_the_config() -> None:
    with pytest.raises(ValueError, match=r"prepare\(model, config=\[\{'tensor_fqn'"):
        FeatherSparsifier(0.5, 4, include=["0"])


def test_ao_an_empty_config_prunes_nothing() -> None:
    """``config`` names the tensors; an empty list names none (only None means every
    Conv/Linear weight)."""
    model = mlp()
    with pytest.raises(ValueError, match=r"config is empty: it names no tensor to prune"):
        FeatherSparsifier(0.5, 4).prepare(model, config=[])
    assert is_plain(model, mlp())
