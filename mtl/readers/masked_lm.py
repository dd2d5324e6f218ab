"""Masked LM over any text reader: its texts, corrupted as BERT's pre-training does (:mod:`mtl.text.masking`)."""
import numpy as np

from mtl.core import registry
from mtl.core.contracts import Field
from mtl.core.errors import ConfigError
from mtl.core.registry import register_reader
from mtl.readers.base import Reader
from mtl.text.masking import mask_pieces
from mtl.text.words import IGNORE


@register_reader("masked_lm")
class MaskedLmReader(Reader):
    """The ``token_ids`` and ``segment_ids`` of another text reader (``source``, a reader config, e.g.
    ``{type: conllu, path: train.conllu, eval_path: dev.conllu}``) with ``probability`` of the pieces masked and
    their original ids as ``mlm_labels`` [T] (-1 elsewhere). The corruption of sample i in epoch e is drawn from
    ``default_rng([seed, i, e])``: new every epoch in training, fixed (epoch 0) for evaluation.

    Parameters:
        source (mapping): the text reader whose texts are masked: a reader config with its type (e.g. {type:
            conllu, path: train.conllu, eval_path: dev.conllu}) that gives one text per sample (token_ids [T]; not
            matching's pairwise mode); it gets this reader's split and tokenizer, its labels are not used
        probability (float): the fraction of each text's pieces (special tokens excepted) chosen for prediction, at
            least one piece: of the chosen, 80% become [MASK], 10% a random piece and 10% stay as they are; in
            (0, 1)
    """

    epoch_aware = True
    alters_inputs = True  # its texts are corrupted: never the same inputs as the source's other tasks

    def __init__(self, source, probability=0.15, seed=0, split="train", tokenizer=None):
        if not isinstance(source, dict) or "type" not in source:
            raise ConfigError(f"source must be a text reader config with a 'type', got {source!r}", key="source")
        if not isinstance(probability, (int, float)) or isinstance(probability, bool) or not 0 < probability < 1:
            raise ConfigError(f"probability must be a number in (0, 1), got {probability!r}", key="probability")
        cfg = dict(source, split=split)
        self.inner = registry.build("reader", cfg, None, "source", tokenizer=tokenizer)
        self.tokenizer = self.inner.tokenizer
        fields = {f.name: f for f in self.inner.fields()}
        if "token_ids" not in fields or fields["token_ids"].shape != (None,):
            raise ConfigError(f"source reader '{source['type']}' must give one text per sample (token_ids [T])",
                              key="source")
        self.probability, self.seed = float(probability), int(seed)
        self._fields = [fields["token_ids"], fields["segment_ids"], Field("mlm_labels", (None,), "int64", pad=IGNORE)]

    def fields(self):
        """``token_ids`` (corrupted), ``segment_ids`` and ``mlm_labels``."""
        return list(self._fields)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, key):
        index, epoch = key if isinstance(key, tuple) else (key, 0)
        sample = self.inner[int(index)]
        rng = np.random.default_rng([self.seed, int(index), int(epoch)])
        tok = self.tokenizer
        ids, labels = mask_pieces(sample["token_ids"], rng, tok.special_ids, tok.mask_id, tok.vocab_size,
                                  self.probability)
        return {"token_ids": ids, "segment_ids": sample["segment_ids"], "mlm_labels": labels}

    def lengths(self):
        """The source's lengths."""
        return self.inner.lengths()
