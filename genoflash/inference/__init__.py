"""Inference with trained DNA models: `score` (per-base log-likelihoods, variant log-likelihood
ratios) and `cli` (`genoflash score`). Depends on models, data and train (to load a run)."""

from .score import VariantScore, score_bases, score_variants

__all__ = ["VariantScore", "score_bases", "score_variants"]
