"""Training: a sequence classifier on the DNA LM trunk, a resumable training loop
(`genoflash train`) and the full-vs-local attention demo (`genoflash demo`)."""

from .classifier import SequenceClassifier
from .trainer import TrainConfig, TrainingDiverged, auroc, load_trained_model, train

__all__ = ["SequenceClassifier", "TrainConfig", "TrainingDiverged", "auroc", "load_trained_model", "train"]
