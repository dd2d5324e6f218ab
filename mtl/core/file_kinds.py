"""What a file is when it is not the pickle it was named as: told by its first bytes and its name (empty, a zip
archive, safetensors, an inference model's parameters, gzip, text), so that a wrong file gets one sentence."""
from mtl.core.errors import DataError

NOT_PADDLE = " (Paddle's are a .pdparams file written by paddle.save)"
SAFETENSORS_MAX_HEADER = 100_000_000  # the safetensors format's own limit on its JSON header (bytes)


def looks_like_safetensors(head: bytes) -> bool:
    """Whether the first bytes of a file (at least 9) start a safetensors file: an 8-byte little-endian header length
    the format allows, then the header's ``{`` (the one test: :mod:`mtl.convert.safetensors_file` reads with it)."""
    return len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= SAFETENSORS_MAX_HEADER


FILE_KINDS = (  # (test of the first bytes and the name, what the file is, what to say about it)
    (lambda head, name: not head, "an empty file", ""),
    (lambda head, name: head.startswith(b"PK\x03\x04"), "a zip archive",
     " (PyTorch's torch.save writes one: mtl convert turns a face model into a .pdparams file)"),
    (lambda head, name: looks_like_safetensors(head), "a safetensors file",
     " (Hugging Face's weights; Paddle's are a .pdparams file written by paddle.save)"),
    (lambda head, name: name.endswith(".pdiparams"), "the parameters of an exported inference model",
     " (paddle.jit.save's .pdiparams; a backbone's weights are a .pdparams file such as a run's "
     "checkpoints/step_N/backbone.pdparams)"),
    (lambda head, name: head.startswith(b"\x1f\x8b"), "a gzip archive", NOT_PADDLE),
    (lambda head, name: b"\0" not in head and _is_text(head), "a text file", NOT_PADDLE),
)


def _is_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a character cut at the end of the sample is still text
        return exc.start >= len(head) - 3
    return True


def not_a_pickle(path, data=None, what="a weight file", text=True):
    """A DataError saying what the file ``path`` (or ``data``) is instead of a pickle, when its first bytes or its
    name tell (empty, a zip archive, safetensors, an inference model's parameters, gzip, and text unless ``text`` is
    False); None otherwise."""
    try:
        if data is None:
            with open(path, "rb") as f:
                head = f.read(512)
        else:
            head = bytes(data[:512])
    except OSError:
        return None
    for test, kind, advice in FILE_KINDS:
        if (text or kind != "a text file") and test(head, str(path)):
            return DataError(f"'{path}' is {kind}, not {what}{advice}")
    return None
