"""Training: a sequence classifier on the DNA LM trunk, a resumable training loop
(`genoflash train`) and the full-vs-local attention demo (`genoflash demo`)."""

from .classifier import SequenceClassifier
from .config import ConfigError, TrainConfig
from .trainer import TrainingDiverged, auroc, load_trained_model, train

__all__ = ["ConfigError", "SequenceClassifier", "TrainConfig", "TrainingDiverged", "auroc", "load_trained_model", "train"]
