"""What one fresh τ² environment costs: τ²'s own loader (its database file read, parsed and validated every time)
against `envace.envs.tau2.domains.make_environment` (the file parsed once per process, `fresh_db`; validated every
time), interleaved in one process, after one warm-up of each. Every τ² episode, gold replay and scoring builds one.

    .venv/bin/python experiments/tau2_env_cost.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import time

from envace.envs.tau2.domains import JSON_DATABASES, make_environment, tau2_module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print("| domain | τ²'s loader | parsed once | ratio |\n|---|---|---|---|")
    for domain in JSON_DATABASES:
        builders = {"own": tau2_module(f"domains.{domain}.environment").get_environment,
                    "once": lambda d=domain: make_environment(d)}
        spent = dict.fromkeys(builders, 0.0)
        for build in builders.values():  # warm-up: imports, the one parse
            build()
        for _ in range(args.repeat):
            for name, build in builders.items():
                started = time.perf_counter()
                build()
                spent[name] += time.perf_counter() - started
        own_s, once_s = spent["own"] / args.repeat, spent["once"] / args.repeat
        print(f"| {domain} | {own_s * 1000:.0f} ms | {once_s * 1000:.0f} ms | {once_s / own_s:.2f} |", flush=True)


if __name__ == "__main__":
    main()
