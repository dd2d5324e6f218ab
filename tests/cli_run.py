"""``mtl ARGV`` in the test's own process, for the tests of what a command prints when it refuses its input."""
from mtl.cli import main as mtl_main


def cli_output(argv, capsys):
    """``mtl ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        mtl_main([str(a) for a in argv])
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli(argv, capsys):
    """``mtl ARGV`` in this process: (exit status, stderr)."""
    code, _, err = cli_output(argv, capsys)
    return code, err
