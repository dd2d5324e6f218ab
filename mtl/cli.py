"""The ``mtl`` command: one sub-command per module of :mod:`mtl.commands`, registered explicitly in ``COMMANDS``.

User errors (:class:`mtl.core.errors.MtlError`) print one line and exit with status 2; nothing else is swallowed.
Paddle's own console noise is silenced before Paddle is imported (:func:`mtl.core.console.configure_console`);
``--verbose`` on any sub-command shows it. A command module imports Paddle only inside its functions.
``mtl launch`` takes its arguments unparsed (they are ``paddle.distributed.launch``'s, see :mod:`mtl.commands.launch`).
"""
import argparse
import os
import sys
import time

from mtl.commands import (
    checkpoint,
    compare,
    convert,
    data,
    evaluate,
    export,
    launch,
    overlap,
    plugins,
    predict,
    pretrained,
    tokenizer,
)
from mtl.commands import train as train_command

# every sub-command, in the order ``mtl --help`` lists them; each module's add_cli(subparsers) registers its parser
COMMANDS = (train_command, launch, plugins, data, evaluate, predict, export, convert, overlap, compare, checkpoint,
            tokenizer, pretrained)


def build_parser():
    """The argument parser of the ``mtl`` command."""
    parser = argparse.ArgumentParser(prog="mtl", description="multi-task learning on one backbone (PaddlePaddle)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.add_cli(sub)
    for command in sub.choices.values():
        add_verbose_arg(command)
    for _, each in parsers(parser):
        each.formatter_class = HelpFormatter
        for choices in sub_commands(each):
            choices.required = False  # a missing one is told by missing_command, naming every choice
            each.set_defaults(func=missing_command(each, choices))
    return parser


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help texts with each option's default (when it has one worth showing and the text does not say it)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if default in (None, False, [], argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: {default})"


def sub_commands(parser):
    """The sub-command groups (``argparse`` sub-parsers actions) of ``parser``."""
    return [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]


def parsers(parser, name="mtl"):
    """``[(command words, parser)]`` of ``parser`` and every sub-command under it, depth first."""
    found = [(name, parser)]
    for choices in sub_commands(parser):
        for word, child in choices.choices.items():
            found += parsers(child, f"{name} {word}")
    return found


def arguments(parser):
    """``[(option strings or the positional's name, help text)]`` of the arguments of ``parser`` (not ``-h``)."""
    return [(tuple(a.option_strings) or (a.metavar or a.dest,), a.help or "") for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def missing_command(parser, choices):
    """What a command that needs a sub-command does without one: one line naming each choice and what it does."""
    helps = {action.dest: action.help for action in choices._choices_actions}

    def tell(args):
        width = max(map(len, choices.choices)) + 2
        listed = "".join(f"\n  {word:<{width}}{helps.get(word) or ''}" for word in choices.choices)
        parser.error(f"choose a command:{listed}\n(`{parser.prog} COMMAND --help` for its options)")
    return tell


def add_verbose_arg(parser):
    """``--verbose``: show Paddle's own warnings and log lines too (hidden by default)."""
    parser.add_argument("--verbose", action="store_true",
                        help="also show Paddle's own warnings and log lines (hidden by default)")


def run_script(main):
    """``main()`` of an example script (``examples/*.py``), its user errors one line and exit status 2, as the
    ``mtl`` commands' (:func:`run`); the thread counts set first, as for the commands (the trainings a script starts
    inherit them unless it passes its own)."""
    from mtl.core.runtime import set_threads

    set_threads()
    run(lambda _args: main(), None)


def run(func, args):
    """Call ``func(args)``; a user error becomes one line on stderr and exit status 2 (74: a file of the run could not
    be written)."""
    from mtl.core.errors import MtlError
    from mtl.train.preemption import PREEMPTED_EXIT_STATUS, Preempted

    try:
        func(args)
    except Preempted as exc:
        line = f"{exc}. To continue from it, run: {train_command.resume_command()}"
        print(f"{line} (exit status {PREEMPTED_EXIT_STATUS})", file=sys.stderr, flush=True)
        _preempted_under_launcher(line)
        sys.exit(PREEMPTED_EXIT_STATUS)
    except MtlError as exc:
        rank = os.environ.get("PADDLE_TRAINER_ID")
        prefix = f"error (rank {rank}): " if rank is not None and os.environ.get("PADDLE_TRAINERS_NUM", "1") != "1" \
            else "error: "
        print(prefix + str(exc), file=sys.stderr, flush=True)
        sys.exit(exc.exit_status)  # 2; 74 for a file that could not be written (DiskError)
    except KeyboardInterrupt:
        sys.exit(130)
    except (RuntimeError, OSError) as exc:  # Paddle raises an NCCL error (an External error) as OSError
        if not _lost_peer(exc):
            raise
        # another process failed first: say so, and leave the launcher time to report that process's own error
        rank = os.environ.get("PADDLE_TRAINER_ID", "?")
        from mtl.train.watchdog import STUCK_EXIT_STATUS, lost_contact_sentence

        named = lost_contact_sentence()  # a process that stopped answering but did not end: which one, and where
        if named:
            print(f"error (rank {rank}): {named}", file=sys.stderr, flush=True)
            sys.exit(STUCK_EXIT_STATUS)
        print(f"error (rank {rank}): lost contact with another process in a collective ({str(exc).splitlines()[0]}); "
              "that process probably ended first: the launcher says how (its error, or the signal that killed it)",
              file=sys.stderr, flush=True)
        time.sleep(LOST_PEER_DELAY)
        sys.exit(1)


LOST_PEER_DELAY = 5.0  # seconds


def _preempted_under_launcher(line):
    """A pre-empted worker of ``paddle.distributed.launch``: tell ``mtl launch`` (exit status 75), and rank 0 puts
    its sentence ``line`` on the launcher's console (a signalled launcher no longer copies the worker logs there)."""
    if "PADDLE_TRAINER_ID" not in os.environ:
        return
    from mtl.commands.launch import report_preempted
    from mtl.core.console import to_launcher_console

    rank = os.environ["PADDLE_TRAINER_ID"]
    report_preempted(rank)
    if rank == "0":
        to_launcher_console(line)


# What a collective raises on a rank whose peer process is gone, per backend: gloo's transport errors, and NCCL's
# as Paddle words them ("NCCL error(6), remote process exited or there was a network error. " from
# phi::enforce's build_nvidia_error_msg, "Failed, NCCL error file:line '...'" from NCCL_CHECK in nccl_tools.h).
LOST_PEER_WORDS = {
    "gloo": ("TIMEOUT", "Connection closed", "Connection reset", "Broken pipe"),
    "NCCL": ("remote process exited", "network error", "unhandled system error", "ncclRemoteError",
             "ncclSystemError", "Connection reset", "Broken pipe", "timed out", "Timeout", "TIMEOUT"),
}


def _lost_peer(exc) -> bool:
    """True for the error a collective raises on a rank whose peer process is gone (gloo's or NCCL's words)."""
    text = str(exc)
    return os.environ.get("PADDLE_TRAINERS_NUM", "1") != "1" and any(
        backend in text and any(word in text for word in words) for backend, words in LOST_PEER_WORDS.items())


PADDLE_MISSING = ("error: PaddlePaddle is not installed (installing mtl leaves the build to you): `make venv` picks "
                  "it for this machine (tools/select_paddle.py), or pip install paddlepaddle==3.3.1 (CPU) or "
                  "paddlepaddle-gpu==3.3.1 from Paddle's CUDA wheel index (GPU)")


def require_paddle():
    """Exit with status 2 and one line when no Paddle build is installed (``setup.py`` requires none)."""
    import importlib.util

    if importlib.util.find_spec("paddle") is None:
        print(PADDLE_MISSING, file=sys.stderr, flush=True)
        sys.exit(2)


def main(argv=None):
    """Entry point of the ``mtl`` console command. Without ``argv`` (the command itself: the arguments are
    ``sys.argv``) it ends the process when done, without Paddle's module teardown
    (:func:`mtl.core.runtime.exit_process`); with ``argv`` it returns (or raises ``SystemExit``) as a function does."""
    if argv is None:
        from mtl.core.runtime import run_as_process

        run_as_process(_main, sys.argv[1:])  # (does not return)
    else:
        _main(list(argv))


def _main(argv):
    from mtl.core.runtime import set_threads

    require_paddle()
    if argv[:1] == ["launch"]:  # every argument after it is the launcher's: argparse would take some of them
        sys.exit(launch.launch_main(argv[1:]))
    args = build_parser().parse_args(argv)
    configure_console(vars(args).get("verbose", False))  # (``mtl`` alone has no --verbose)
    if not vars(args).get("job_threads"):  # (mtl train and mtl baseline set them from the job: prepare_job)
        set_threads()  # before any command imports Paddle (eval, predict, embed...): cores, not Paddle's own 1
    run(args.func, args)


def train_main(argv=None):
    """Entry point of ``examples/train_joint.py``: ``[CONFIG | -c CONFIG] [--set k=v ... | -o k=v ...] [--resume]``.
    Without ``argv`` (the script itself) it ends the process when done, as :func:`main` does."""
    if argv is None:
        from mtl.core.runtime import run_as_process

        run_as_process(_train_main, sys.argv[1:])  # (does not return)
    else:
        _train_main(list(argv))


def _train_main(argv):
    parser = argparse.ArgumentParser(description="train a multi-task job (default: the digits demo)")
    train_command.add_train_args(parser)
    add_verbose_arg(parser)
    args = parser.parse_args(argv)
    configure_console(args.verbose)
    run(train_command.train, args)


def configure_console(verbose):
    """Quiet Paddle's console noise unless ``verbose`` (before anything imports Paddle)."""
    from mtl.core.console import configure_console as configure

    configure(verbose)


if __name__ == "__main__":
    main()
