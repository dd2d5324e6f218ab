"""Word tagging with a softmax per word (parts of speech, morphology, IOB2 entities)."""
from mtl.heads.tagging import WordTagger
from mtl.registry import register_head


@register_head("tagger")
class TaggerHead(WordTagger):
    """Per-word logits ``MLP(words)`` [B, W, C] from the encoder's ``sequence`` at each word's first piece, softmax
    cross-entropy averaged over all labelled words; prediction = argmax per word. ``metric``: ``accuracy`` (words)
    or ``f1`` (entities of IOB2 tags, seqeval's conventions: :mod:`mtl.text.metrics`)."""
