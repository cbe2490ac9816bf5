"""``linformer-lab COMMAND ...``: the single console entry point.

Exit codes: 0 success; 2 a configuration or input problem (one line on stderr, nothing written);
1 an unexpected error (with its traceback) or a run that did not finish; 130 interrupted (Ctrl-C);
143 terminated (SIGTERM), after saving what resumes it.
Each command lives in its own module exposing ``add_arguments(parser)`` and ``main(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from foundation.errors import (
    EXIT_DIVERGED,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    ConfigError,
    Diverged,
    Terminated,
    says_errors,
)
from foundation.redact import redact

COMMANDS = {
    "train": ("training.train", "train one model from a YAML experiment file"),
    "pipeline": (
        "experiments.pipeline",
        "pretrain variants, fine-tune each on classification tasks, tabulate (Table 2)",
    ),
    "glue-download": ("experiments.glue", "save the hub's GLUE once (needs internet) as a folder for data.source"),
    "glue-standin": (
        "experiments.glue_standin",
        "write a GLUE-layout stand-in from the embedded movie reviews (smoke tests without GLUE; not GLUE)",
    ),
    "bench": ("experiments.bench", "time and memory of every attention variant vs naive and SDPA attention"),
    "time-to-target": ("experiments.time_to_target", "seconds and tokens each variant needed to reach a val ppl"),
    "analyze": ("experiments.analyze", "attention spectrum, suggested k and what E/F learned, as figures"),
    "sweep": ("sweeps.run.command", "launch or resume an Optuna study from a study file (sweeps/*.yaml)"),
    "report": ("sweeps.report.command", "write a study's report: trials.csv, summary.md with verdicts, plots"),
    "dashboard": ("sweeps.dashboard", "serve optuna-dashboard on a study and its control, read only"),
}


class _Parser(argparse.ArgumentParser):
    """Argument errors are input problems like any other: one line and exit code 2 (not argparse's usage)."""

    def error(self, message: str):
        raise ConfigError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser, with the arguments of ``command`` only (or of none when it is not one of ``COMMANDS``):
    importing every command's module would import torch and friends, which are slow to import."""
    parser = _Parser(prog="linformer-lab", description="Linformer ablations with Lightning and Optuna")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    try:
        args = parser.parse_args(argv)
        return importlib.import_module(COMMANDS[args.command][0]).main(args)
    except ConfigError as err:  # one line whatever the message holds, with any password in a URL masked
        _say("error", err)
        return 2
    except Diverged as err:  # the run stopped at a non-finite loss, its last finite checkpoint kept
        _say("error", err)
        return EXIT_DIVERGED
    except Terminated as err:
        _say("terminated", err)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        if says_errors():
            print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _say(kind: str, err: BaseException) -> None:
    """The command's one ending line (``error: …``), printed once: by rank 0 under DDP."""
    if says_errors():
        print(f"{kind}: {redact(' '.join(str(err).splitlines()))}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
