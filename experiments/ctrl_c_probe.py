"""How long Ctrl-C takes while requests are in flight: `RemoteBackend.generate` against a thread pool (what it used).

    .venv/bin/python experiments/ctrl_c_probe.py [--hold 30]

A local server holds every completion request for `--hold` seconds; a child process sends four requests, once
through a `ThreadPoolExecutor` (the former `RemoteBackend.generate`) and once through `RemoteBackend.generate`,
and gets SIGINT two seconds in. Prints the seconds from the signal to the child's exit, side by side.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import threading
import time

POOL = """
from concurrent.futures import ThreadPoolExecutor
from envace.policy.vllm import request
with ThreadPoolExecutor(4) as pool:
    list(pool.map(lambda i: request('{url}/completions', {{}}, 600), range(4)))
"""
BACKEND = """
from envace.policy.backend import SamplingParams
from envace.policy.models import load_tokenizer
from envace.policy.remote import RemoteBackend
RemoteBackend(['{url}'], 'base', load_tokenizer('tiny')).generate([[1, 2, 3]] * 4, SamplingParams(max_new_tokens=4))
"""


def exit_after_sigint(body: str, url: str) -> float:
    script = "import sys\nprint('go', flush=True)\ntry:\n" + "".join(
        f"    {line}\n" for line in body.format(url=url).strip().splitlines()) + \
        "except KeyboardInterrupt:\n    sys.exit(130)\n"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    time.sleep(2)  # the four requests are in flight
    sent = time.perf_counter()
    os.kill(child.pid, signal.SIGINT)
    child.wait()
    return time.perf_counter() - sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hold", type=float, default=30.0, help="seconds the server holds each request")
    hold = parser.parse_args().hold

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the handler's name
            time.sleep(hold)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    for name, body in (("thread pool (before)", POOL), ("RemoteBackend.generate", BACKEND)):
        print(f"{name}: exit {exit_after_sigint(body, url):.2f} s after SIGINT (requests held {hold:.0f} s)")
    server.shutdown()


if __name__ == "__main__":
    main()
