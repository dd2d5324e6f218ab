"""``mtl ARGV`` in the test's own process, for the tests of what a command prints when it refuses its input."""
from mtl.cli import main as mtl_main


def cli(argv, capsys):
    """``mtl ARGV`` in this process: (exit status, stderr)."""
    try:
        mtl_main([str(a) for a in argv])
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err
