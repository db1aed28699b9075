"""`posbench <command> [overrides]`: one console script; :data:`COMMANDS` maps each command to
its one-line help and the function that runs it.

    posbench train encoding=alibi                  # one run
    posbench -m train encoding=alibi,rope seed=0,1 # a sweep (also: posbench train -m ...)
    posbench eval checkpoint=outputs/train/alibi/default eval.lengths=[128,4096]
    posbench report multirun/2026-01-01_00-00-00   # one table + one figure
    posbench encodings                             # what can go in encoding=

Each command has a module named after it, so that ``posbench report``'s code is ``cli/report.py``:
it parses the command's arguments and calls the stage that does the work. What every command
obeys lives apart from the verbs, in :mod:`.validate` and :mod:`.failures`:

- :mod:`.hydra_apps`: ``train`` and ``eval``, the Hydra tasks and :func:`~.hydra_apps.run_hydra`;
- :mod:`.report`, :mod:`.encodings`, :mod:`.check`, :mod:`.convert`: the other commands;
- :mod:`.bench`, :mod:`.study`: thin, as :mod:`posbench.bench` and :mod:`posbench.study` do the work;
- :mod:`.validate`: checks of a Hydra command line before Hydra starts, Hydra's errors as one line;
- :mod:`.failures`: the failure policy (one line and no files left for a user error, ``FAILED``
  in a sweep job's dir, a quiet end when stdout closes).

Train and eval share one module (``eval.py`` would also shadow the builtin): Hydra starts both
the same way, with the same checks, help templates and threads.

Group choices (encoding=, model=, data=, ...) are checked before Hydra starts, so a
typo gets one line naming the valid choices. Errors the user can fix are printed as
``posbench: error: ...`` with exit status 2 and leave no files behind.
"""

from __future__ import annotations

import sys

from ..errors import PosbenchError, fail, write_error, yaml_error
from ..runs import kernels
from . import bench, check, convert, encodings, hydra_apps, longppl, report, study
from .failures import quiet_broken_pipe
from .validate import encoding_options_callback  # the Hydra callback conf/app_train.yaml names

__all__ = ["COMMANDS", "encoding_options_callback", "main"]

COMMANDS = {
    "train": (hydra_apps.HELP["train"], hydra_apps.train_command),
    "eval": (hydra_apps.HELP["eval"], hydra_apps.eval_command),
    "report": (report.HELP, report.main),
    "encodings": (encodings.HELP, encodings.main),
    "check": (check.HELP, check.main),
    "convert": (convert.HELP, convert.main),
    "bench": (bench.HELP, bench.main),
    "study": (study.HELP, study.main),
    "longppl": (longppl.HELP, longppl.main),
}


def usage() -> str:
    lines = ["usage: posbench [-m] <command> [overrides ...]", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, (text, _) in COMMANDS.items()]
    lines += ["", "Hydra overrides: encoding=, model=, data=, seed=, device=, train.steps=, train.train_len=,",
              "train.batch_size=, train.lr=, eval.lengths=[...], eval.max_tokens=, checkpoint= (eval),",
              "wandb.mode=, hydra.run.dir=. `posbench <command> --help` shows every option.",
              "", "examples:", "  posbench train encoding=alibi",
              "  posbench -m train encoding=sinusoidal,rope,t5,alibi seed=0,1,2",
              "  posbench eval checkpoint=outputs/train/alibi/default eval.lengths=[128,512,2048]",
              "  posbench report multirun/<date>"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    with quiet_broken_pipe():
        dispatch(list(sys.argv[1:] if argv is None else argv))


def dispatch(argv: list[str]) -> None:
    command_at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if command_at is None:
        print(usage())
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") or not argv else 2)
    command, before, after = argv[command_at], argv[:command_at], argv[command_at + 1:]
    if command not in COMMANDS:
        fail(f"unknown command {command!r}; valid choices: {', '.join(COMMANDS)}")
    multirun = [a for a in before if a in ("-m", "--multirun")]
    if len(multirun) != len(before):
        fail(f"unknown option {next(a for a in before if a not in multirun)!r} before the command; "
             "put Hydra flags after it")
    if multirun and command not in hydra_apps.HYDRA_APPS:
        fail(f"-m/--multirun applies to train and eval, not {command}")
    try:
        kernels.check()  # the kernel settings of the environment, before a command makes any file
        COMMANDS[command][1](multirun + after)
    except PosbenchError as e:
        fail(str(e))
    except OSError as e:  # a report's --out, a study's runs or results folder that cannot be written
        message = write_error(e)
        if message is None:
            raise
        fail(message)
    except Exception as e:  # a run's config.yaml that does not parse; anything else is a bug's traceback
        message = yaml_error(e)
        if message is None:
            raise
        fail(message)
