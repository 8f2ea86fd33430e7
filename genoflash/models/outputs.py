"""What a model returns: a dict that also reads as a tuple, as Hugging Face's ModelOutput does.

``out["logits"]`` and ``out.logits`` name an output; ``out[0]`` is the first one present, in the
order the class declares (the loss first, when labels were given); ``out.to_tuple()`` gives them
all. An output that was not computed is absent: ``"loss" in out`` is False, ``out.loss`` is None
and ``out["loss"]`` raises KeyError. So transformers' ``Trainer``, which reads ``outputs["loss"]``
from a dict and ``outputs[0]`` from anything else, finds the loss either way, with no dependency
on transformers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar


class ModelOutput(dict):
    """A dict of a model's outputs in the order of ``FIELDS``, without the ones that are None."""

    FIELDS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), /, **fields: Any):
        # Positional items as dict() takes them, so that code rebuilding a mapping by its type
        # (nn.DataParallel's gather: type(out)(pairs)) builds one of these.
        given = dict(items, **fields)
        unknown = given.keys() - set(self.FIELDS)
        if unknown:
            raise TypeError(f"{type(self).__name__} has the fields {', '.join(self.FIELDS)}; got "
                            f"{', '.join(sorted(unknown))}")
        super().__init__((name, given[name]) for name in self.FIELDS if given.get(name) is not None)

    def __getitem__(self, key):
        if isinstance(key, (int, slice)):
            return self.to_tuple()[key]
        return super().__getitem__(key)

    def __getattr__(self, name: str):
        if name in type(self).FIELDS:
            return self.get(name)  # None when not computed
        raise AttributeError(f"{type(self).__name__} has no field {name!r} (it has {', '.join(self.FIELDS)})")

    def to_tuple(self) -> tuple:
        """The outputs present, in field order."""
        return tuple(self.values())

    def __reduce__(self):  # pickle and copy rebuild through __init__, keeping the field checks
        return type(self), (dict(self),)


class LMOutput(ModelOutput):
    """A language model's outputs: ``loss`` (a scalar; only when labels were given) and ``logits``
    (batch, seqlen, vocab_size), or (total, vocab_size) for a packed batch."""

    FIELDS = ("loss", "logits")


class SequenceClassifierOutput(ModelOutput):
    """A sequence classifier's outputs: ``loss`` (a scalar; only when labels were given) and
    ``logits`` (batch, num_classes)."""

    FIELDS = ("loss", "logits")
