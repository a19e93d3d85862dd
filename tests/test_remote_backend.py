"""The remote backend against a real HTTP completions server (OpenAI's `/v1/completions` shape),
served here by the tiny model so the test needs no GPU and no network."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envace.errors import UsageError
from envace.policy.backend import SamplingParams
from envace.policy.remote import RemoteBackend

CARD: dict = {"id": "tiny"}  # the served model's card; a test may add the server's `max_model_len`


@pytest.fixture(scope="module")
def server(tiny):
    from envace.policy.hf import HFBackend

    local = HFBackend(*tiny)
    seen: list[dict] = []

    class Completions(BaseHTTPRequestHandler):  # vLLM's shape: one prompt of token ids per request
        def _answer(self, payload):
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802  (http.server's naming)
            self._answer({"data": [CARD]})

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path.endswith("/tokenize"):
                self._answer({"tokens": tiny[1].encode(body["prompt"], add_special_tokens=False)})
                return
            seen.append(body)
            params = SamplingParams(max_new_tokens=body["max_tokens"], temperature=body["temperature"],
                                    top_p=body["top_p"], seed=body.get("seed"))
            (g,) = local.generate([body["prompt"]], params)
            ids = g.ids
            self._answer({"choices": [{"index": 0, "text": g.text, "finish_reason": g.finish, "token_ids": ids,
                                       "logprobs": {"token_logprobs": list(g.logprobs or [0.0] * len(ids))}}]})

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Completions)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", local, seen
    httpd.shutdown()


def test_a_served_model_generates_what_the_local_one_does(server, tiny):
    url, local, seen = server
    remote = RemoteBackend([url], "tiny", tiny[1])
    prompts = [tiny[1].encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"), [5, 6, 7, 8]]
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    served, direct = remote.generate(prompts, params), local.generate(prompts, params)
    assert [g.text for g in served] == [g.text for g in direct]  # in prompt order, whatever the server's
    # ids go as they are, one request per prompt, sent concurrently: the server may see them in either order
    assert sorted(b["prompt"] for b in seen[-2:]) == sorted(prompts) and {b["model"] for b in seen[-2:]} == {"tiny"}
    with pytest.raises(UsageError, match="frozen"):
        remote.generate(prompts, SamplingParams(frozen=True))


def test_requests_sample_untruncated_within_the_servers_context(server, tiny):
    url, _, seen = server
    remote = RemoteBackend([url], "tiny", tiny[1])
    CARD["max_model_len"] = 40
    try:
        remote.check()
    finally:
        del CARD["max_model_len"]
    assert remote.max_context == 40  # read from the server's model card: the engine's context check is on
    before = len(seen)
    (near,) = remote.generate([list(range(5, 40))], SamplingParams(max_new_tokens=20, temperature=1.0, seed=3))
    body = seen[-1]
    assert body["max_tokens"] == 5  # 35 prompt tokens + 5 = the server's limit, never a 400
    # the model's generation_config.json must add no truncation the trainer's log-probs do not know of
    assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (-1, 0.0, 1.0)
    assert len(near.ids) <= 5
    (full,) = remote.generate([list(range(5, 50))], SamplingParams(max_new_tokens=20))
    assert (full.ids, full.finish) == ([], "length") and len(seen) == before + 1  # nothing sent past the limit


@pytest.mark.heavy
def test_the_simulated_user_can_be_served(server, tmp_path):
    from envace.cli import main
    from envace.store import connect

    url, _, seen = server
    before = len(seen)
    assert main(["rollout", "--env", "tau2", "--domain", "retail", "--limit", "1", "--model", "tiny",
                 "--user-model", f"{url}?model=tiny&tokenizer=tiny", "--max-new-tokens", "6",
                 "--user-max-new-tokens", "6", "--max-user-turns", "2", "--root", str(tmp_path)]) == 0
    assert len(seen) - before == 2  # one request per user message
    con = connect(tmp_path)
    assert con.execute("SELECT count(*) FROM generations WHERE role = 'user'").fetchall() == [(2,)]


def test_an_unreachable_server_is_one_clear_error(tmp_path, capsys):
    from envace.cli import main

    assert main(["rollout", "--env", "tau2", "--domain", "retail", "--limit", "1", "--model", "tiny",
                 "--user-model", "http://127.0.0.1:9/v1?model=x&tokenizer=tiny", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "127.0.0.1:9" in err and "not reachable" in err and err.count("\n") == 1
