"""The N:M sparse-training methods, registered in :data:`~feather_sparse.baselines.METHODS`.

Each is a Pruner configuration on the N:M backbone
(:class:`~feather_sparse.nm.backbone.NMBackbone`), ``pattern="2:4"`` unless
given; select one with ``fs.make_pruner(model, "sr-ste", pattern="4:8")``.
Within every group of ``M`` weights, ``T_g`` is the largest magnitude among
the ``M − N`` smallest (ties: the lower position is kept).

| name | forward | backward |
|---|---|---|
| `feather-nm` | ``P_T(w)``, p = 3 | θ-scaled STE (θ automatic: 1 at N:M sparsities) |
| `hard-nm` | ``w·[kept]`` (p = ∞) | plain STE, θ = 1 |
| `sr-ste` | ``w·[kept]`` | ``g + λ·(1 − mask)⊙w``, λ = 2e-4 |
| `s-ste` | ``β·sign(w)·max(|w| − T_g, 0)`` (p = 1) | plain STE, ``g`` |
| `oneshot-nm` | ``w·mask`` with the mask fixed at the pruning step | ``g·mask`` (θ = 0) |

References:

- SR-STE: Zhou, Ma, Zhu, Liu, Zhang, Yuan, Sun & Li, "Learning N:M
  Fine-grained Structured Sparse Neural Networks From Scratch", ICLR 2021,
  arXiv:2102.04010. The sparse-refined STE updates the dense weights with
  the gradient ``g(W̃) + λ_W·(1 − E)⊙W``, ``E`` the N:M mask, ``λ_W = 2e-4``.
- S-STE: Hu, Zhu & Chen, "S-STE: Continuous Pruning Function for Efficient
  2:4 Sparse Pre-training", NeurIPS 2024, arXiv:2409.09099. The forward is
  the 2:4 soft threshold ``S(w)_i = sign(w_i)·(|w_i| − t)`` for the two
  largest ``|w_i|`` of the group (``t`` the third largest), else 0, rescaled
  by the per-tensor ``β`` minimising ``‖w − β·S(w)‖²``, i.e.
  ``β = ⟨w, S(w)⟩ / ⟨S(w), S(w)⟩``, computed once at the start and then
  fixed (the authors' released code does the same), and the backward is the
  plain STE. (Their MVUE activation-gradient
  estimator and FP8 training are speed measures, not part of this method.)
- One-shot magnitude N:M followed by fine-tuning with the mask fixed, the
  usual post-training baseline (e.g. Mishra et al., "Accelerating Sparse
  Deep Neural Networks", arXiv:2104.08378, NVIDIA's ASP recipe): dense
  training until ``schedule.start`` (default half of the steps), then the
  N:M magnitude mask is taken once and kept.
- Hard-STE N:M: the plain straight-through estimator (Bengio, Léonard &
  Courville 2013) with the hard N:M mask, SR-STE without its decay.
"""

from __future__ import annotations

from feather_sparse.baselines import METHODS, Method

__all__ = ["SR_STE_DECAY"]

#: SR-STE's sparse-refined decay λ_W (Zhou et al. 2021).
SR_STE_DECAY = 2e-4

#: The pattern every N:M method uses unless ``pattern=`` is given.
_DEFAULT_PATTERN = "2:4"

METHODS.register(
    "feather-nm",
    Method(
        "feather-nm",
        "Feather for N:M: per-group threshold, P_T with p = 3, θ-scaled STE",
        "Glentis Georgoulakis et al., BMVC 2023, applied per N:M group",
        defaults={"pattern": _DEFAULT_PATTERN},
    ),
)
METHODS.register(
    "hard-nm",
    Method(
        "hard-nm",
        "hard N:M mask (p = inf) with the plain straight-through estimator (θ = 1)",
        "Bengio, Léonard & Courville 2013 (STE) with the N:M mask of Zhou et al. 2021",
        fixed={"operator": "hard", "theta": 1.0},
        defaults={"pattern": _DEFAULT_PATTERN},
    ),
)
METHODS.register(
    "sr-ste",
    Method(
        "sr-ste",
        "SR-STE: hard N:M mask, STE, sparse-refined decay λ·(1 − mask)⊙w added to the gradient",
        "Zhou et al., ICLR 2021, arXiv:2102.04010",
        fixed={"operator": "hard", "theta": 1.0, "backbone": "nm"},
        defaults={
            "pattern": _DEFAULT_PATTERN,
            "backbone": {"name": "nm", "decay": SR_STE_DECAY},
        },
    ),
)
METHODS.register(
    "s-ste",
    Method(
        "s-ste",
        "S-STE: per-group soft threshold (p = 1), fixed per-tensor rescaling β, plain STE",
        "Hu, Zhu & Chen, NeurIPS 2024, arXiv:2409.09099",
        fixed={"operator": "soft", "theta": 1.0, "backbone": "nm"},
        defaults={"pattern": _DEFAULT_PATTERN, "backbone": {"name": "nm", "rescale": True}},
    ),
)
METHODS.register(
    "oneshot-nm",
    Method(
        "oneshot-nm",
        "one-shot magnitude N:M at schedule.start (default half-way), then fine-tuning with "
        "the mask fixed",
        "Mishra et al. 2021, arXiv:2104.08378 (ASP: prune once, fine-tune with a fixed mask)",
        fixed={"operator": "hard", "theta": 0.0, "backbone": "nm"},
        defaults={
            "pattern": _DEFAULT_PATTERN,
            "backbone": {"name": "nm", "freeze": True},
            "schedule": {"name": "constant", "start": 0.5},
        },
    ),
)
