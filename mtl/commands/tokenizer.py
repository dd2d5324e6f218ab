"""``mtl tokenizer train --conllu FILE... | --text FILE... --vocab-size N -o tokenizer.json``: train a WordPiece
tokenizer offline (Hugging Face ``tokenizers``) on training text, for a text encoder's ``tokenizer``;
``mtl tokenizer show TOKENIZER WORDS...``: the pieces of some words.

``--conllu`` reads the words of CoNLL-U files (the syntactic words, joined by spaces), ``--text`` plain text files
(one sentence or paragraph per line). Training is not bit-reproducible across runs of ``tokenizers`` (ties between
equally frequent pairs), so a recipe keeps the file it trained once."""
import os

from mtl.errors import ConfigError


def _texts(args):
    from mtl.text.conllu import read_conllu
    from mtl.utf8 import open_utf8

    texts = []
    for option, paths in (("--conllu", args.conllu), ("--text", args.text)):
        for path in paths or []:
            if not os.path.isfile(path):
                raise ConfigError(f"{option} {path}: no such file")
    for path in args.conllu or []:
        texts += [" ".join(s.words) for s in read_conllu(path)]
    for path in args.text or []:
        with open_utf8(path, "--text file") as f:
            texts += [line.strip() for line in f if line.strip()]
    if not texts:
        raise ConfigError("give training text: --conllu FILE... and/or --text FILE...")
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
    t = inner.add_parser("train", help="train WordPiece on CoNLL-U or text files")
    t.add_argument("--conllu", nargs="+", help="CoNLL-U files (their words)")
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
