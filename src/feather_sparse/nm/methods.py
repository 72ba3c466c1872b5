"""The N:M sparse-training methods: their formulas, references and constants.

They are registered in :data:`feather_sparse.methods.METHODS` (where the
registry is defined, so they are there whatever was imported first). Each is
a Pruner configuration on the N:M backbone
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

__all__ = ["ONESHOT_START", "SR_STE_DECAY"]

#: SR-STE's sparse-refined decay λ_W (Zhou et al. 2021).
SR_STE_DECAY = 2e-4

#: Where one-shot N:M prunes, as a fraction of the steps (dense training before it).
ONESHOT_START = 0.5
