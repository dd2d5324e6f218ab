"""``mtl tokenizer train --conllu FILE... | --iob2 FILE... | --tsv FILE... | --text FILE... --vocab-size N -o
tokenizer.json``: train a WordPiece tokenizer offline (Hugging Face ``tokenizers``) on training text, for a text
encoder's ``tokenizer``; ``mtl tokenizer show TOKENIZER WORDS...``: the pieces of some words.

The files are those of the readers: ``--conllu`` reads the words of CoNLL-U files (the syntactic words, joined by
spaces), ``--iob2`` the words of IOB2 files (``--iob2-format conll2003`` for CoNLL-2003's ``word POS chunk NER``
lines, as the ``iob2`` reader's ``format``), ``--tsv`` the text columns (``text_a``, ``text_b``, ``text_c``) of the
TSV files of the ``text_classification`` and ``matching`` readers, ``--text`` plain text files (one sentence or
paragraph per line). Training is not bit-reproducible across runs of ``tokenizers`` (ties between equally frequent
pairs), so a recipe keeps the file it trained once."""
import os

from mtl.core.errors import ConfigError

TSV_TEXT_COLUMNS = ("text_a", "text_b", "text_c")  # the text columns of the TSV readers (mtl.readers.text_pairs)


def tsv_texts(path):
    """The cells of every text column (``text_a``, ``text_b``, ``text_c``) of a TSV file read as the TSV readers
    read it (:func:`mtl.readers.text_pairs.read_tsv`: a header, every record as many cells); a DataError naming the
    file when its header names none of them."""
    from mtl.core.errors import DataError
    from mtl.readers.text_pairs import read_tsv

    records = read_tsv(path, ())
    header = list(records[0][1])
    if not set(header) & set(TSV_TEXT_COLUMNS):
        raise DataError(f"TSV file '{path}' has none of the text columns {', '.join(TSV_TEXT_COLUMNS)} in its header "
                        f"(it names: {', '.join(header)}); the TSV readers read their texts from them")
    return [cell.strip() for _, record in records for name, cell in record.items()
            if name in TSV_TEXT_COLUMNS and cell.strip()]


def _texts(args):
    from mtl.core.utf8 import open_utf8
    from mtl.text.conllu import read_conllu
    from mtl.text.iob2 import read_iob2

    texts = []
    sources = (("--conllu", args.conllu), ("--iob2", args.iob2), ("--tsv", args.tsv), ("--text", args.text))
    for option, paths in sources:
        for path in paths or []:
            if not os.path.isfile(path):
                raise ConfigError(f"{option} {path}: no such file")
    for path in args.conllu or []:
        texts += [" ".join(s.words) for s in read_conllu(path)]
    for path in args.iob2 or []:
        texts += [" ".join(s.words) for s in read_iob2(path, format=args.iob2_format)]
    for path in args.tsv or []:
        texts += tsv_texts(path)
    for path in args.text or []:
        with open_utf8(path, "--text file") as f:
            texts += [line.strip() for line in f if line.strip()]
    if not texts:
        raise ConfigError("give training text: --conllu, --iob2, --tsv and/or --text FILE...")
    return texts


def _cmd_train(args):
    from mtl.text.tokenizer import tokenizer_summary, train_wordpiece

    if args.vocab_size < 1 or args.min_frequency < 1:
        raise ConfigError(f"--vocab-size and --min-frequency must be at least 1, got {args.vocab_size} and "
                          f"{args.min_frequency}")
    texts = _texts(args)
    tokenizer = train_wordpiece(texts, args.vocab_size, args.lowercase, args.min_frequency)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    tokenizer.save(args.output)
    print(f"trained WordPiece on {len(texts)} texts: {tokenizer_summary(tokenizer)} -> {args.output}")
    if tokenizer.vocab_size != args.vocab_size:  # tokenizers keeps every character and stops when no pair is left
        why = "every character of the text and the special tokens are kept" if tokenizer.vocab_size > \
            args.vocab_size else f"no pair of pieces is left that occurs {args.min_frequency} times or more"
        print(f"note: {tokenizer.vocab_size} pieces, not the {args.vocab_size} asked for: {why}")


def _cmd_show(args):
    from mtl.text.tokenizer import TextTokenizer

    tokenizer = TextTokenizer.from_file(args.tokenizer)
    vocabulary = tokenizer.vocabulary()
    ids, starts = tokenizer.encode_words(args.words)
    ends = list(starts[1:]) + [len(ids)]
    for word, a, b in zip(args.words, starts, ends):
        print(f"{word}\t{' '.join(vocabulary[i] for i in ids[a:b])}")


def add_cli(sub):
    """Register ``mtl tokenizer train`` and ``mtl tokenizer show``."""
    p = sub.add_parser("tokenizer", help="train a WordPiece tokenizer for text tasks, or show a word's pieces")
    inner = p.add_subparsers(dest="tokenizer_command", required=True)
    t = inner.add_parser("train", help="train WordPiece on the readers' files: CoNLL-U, IOB2, TSV or plain text")
    t.add_argument("--conllu", nargs="+", help="CoNLL-U files (their words)")
    t.add_argument("--iob2", nargs="+", help="IOB2 files (their words; see --iob2-format)")
    t.add_argument("--iob2-format", choices=["iob2", "conll2003"], default="iob2",
                   help="the columns of the --iob2 files, as the iob2 reader's format: iob2 (the word second-to-last) "
                        "or conll2003 (word POS chunk NER)")
    t.add_argument("--tsv", nargs="+", help="TSV files with a header (their text_a, text_b, text_c columns)")
    t.add_argument("--text", nargs="+", help="plain text files (one text per line)")
    t.add_argument("--vocab-size", type=int, default=8000, help="pieces in the vocabulary, special tokens included")
    t.add_argument("--min-frequency", type=int, default=2, help="a pair of pieces must occur this often to be merged")
    t.add_argument("--lowercase", action="store_true", help="lowercase before splitting (an uncased vocabulary)")
    t.add_argument("-o", "--output", required=True, help="the tokenizer.json to write")
    t.set_defaults(func=_cmd_train)
    s = inner.add_parser("show", help="the pieces of some words")
    s.add_argument("tokenizer", help="a tokenizer.json (mtl tokenizer train's, or a run's)")
    s.add_argument("words", nargs="+", help="the words to split into pieces")
    s.set_defaults(func=_cmd_show)
