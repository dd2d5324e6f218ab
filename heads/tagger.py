"""Word tagging with a softmax per word (parts of speech, morphology, IOB2 entities)."""
from mtl.core.registry import register_head
from mtl.headkit.tagging import WordTagger


@register_head("tagger")
class TaggerHead(WordTagger):
    """Per-word logits ``MLP(words)`` [B, W, C] from the encoder's ``sequence`` at each word's first piece, softmax
    cross-entropy averaged over all labelled words; prediction = argmax per word. ``metric``: ``accuracy`` (words)
    or ``f1`` (entities of IOB2 tags, seqeval's conventions: :mod:`mtl.text.metrics`)."""
