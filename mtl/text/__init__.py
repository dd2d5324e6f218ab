"""Text plumbing below the readers, backbones and heads: the subword tokenizer, CoNLL-U and IOB2 parsing, words to
subwords and back, masked-LM corruption, sliding windows and the field-standard text metrics."""
