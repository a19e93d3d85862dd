"""`envace …` commands: argparse → config → job (`envace.jobs`) → table, one module per family of commands.

Bad input (unknown names, missing paths, malformed configs, wrong types) prints one `error:` line and
exits 2 (`envace.errors.run_main`); an interrupted job keeps every step it already stored. The app and the
store benchmark sit above this package: their commands run them as their own programs (`python -m apps`,
`python -m workbench.bench`), so no arrow points up. docs/commands.md is generated from the parser
(`make docs`).
"""

from __future__ import annotations

import sys

from envace.cli.parser import parse
from envace.cli.stop import Terminated, install_stop_handlers
from envace.errors import Stopped, run_main


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    torch = sys.modules.get("torch")  # loaded only by the commands that need it
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        from envace.training.distributed import leave

        leave(code)  # one process of a multi-process launch: exit without meeting torch's threads unjoined
    return code


def _run(argv: list[str]) -> int:
    args = parse(argv)
    return args.func(args)


def _main(argv: list[str] | None) -> int:
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # progress lines reach a log file as they happen
    install_stop_handlers()
    try:
        return run_main(lambda: _run(sys.argv[1:] if argv is None else argv))
    except Stopped as exc:  # a fault the job could not work around; the run is marked interrupted and resumes
        print(f"stopped: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as exc:
        # a step is stored whole or not at all (shards are renamed into place): nothing half-written remains
        print(f"{'terminated' if isinstance(exc, Terminated) else 'interrupted'}: every completed step is stored; "
              "the run is marked interrupted", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
