"""No model output, config or flag can crash a job: every parser classifies any string, every config mistake is one
line naming the field, and hostile outputs from either role leave their batch stored."""

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace import formats
from envace.config import RolloutConfig, TrainConfig
from envace.envs.validate import check_arguments, check_call
from envace.errors import UsageError
from envace.types import ToolCall

# 2,000 random strings a parser in each run of the suite (hypothesis keeps any failing example in its database and
# tries it first next time); 5,000 took 30 s of the suite
MANY = settings(max_examples=2_000, deadline=None, suppress_health_check=list(HealthCheck))

HOSTILE = [
    "1" * 4301,  # past Python's int-string limit
    "[" * 1000 + "]" * 1000,  # past the recursion limit
    '"\\ud800"',  # an escaped lone surrogate
    json.dumps(json.dumps(json.dumps({"a": 1}))),  # arguments encoded three times
]


def _tag(body: str, open_tag: str, close_tag: str) -> str:
    return f"{open_tag}{body}{close_tag}"


pieces = st.sampled_from(["<tool_call>", "</tool_call>", "<execution_result>", "</execution_result>", "<think>",
                          "</think>", "{", "}", "[", "]", '"', "\\ud800", "1" * 5000, '"name"', ":", ",", "null",
                          '{"name": "ls", "arguments": {}}', '"arguments": "{\\"a\\": 1}"'])
texts = st.one_of(st.text(), st.lists(st.one_of(pieces, st.text(max_size=5)), max_size=12).map("".join),
                  st.sampled_from(HOSTILE).map(lambda h: _tag(h, "<tool_call>", "</tool_call>")),
                  st.sampled_from(HOSTILE).map(lambda h: _tag(h, "<execution_result>", "</execution_result>")))


@pytest.mark.heavy
@MANY
@given(texts)
def test_parse_tool_calls_classifies_any_string(text):
    parsed = formats.parse_tool_calls(text)
    assert (parsed.error is None) or (parsed.calls == [] and parsed.error in {
        formats.UNBALANCED_TAGS, formats.JSON_DECODE_ERROR, formats.NOT_A_CALL, formats.MISSING_NAME,
        formats.BAD_ARGUMENTS, formats.MESSAGE_TOO_LONG})
    for call in parsed.calls:  # whatever is accepted can be stored and tokenized
        json.dumps(call.arguments, ensure_ascii=False).encode("utf-8")


@pytest.mark.heavy
@MANY
@given(texts)
def test_parse_execution_result_classifies_any_string(text):
    parsed = formats.parse_execution_result(text)
    if parsed.error is None:
        formats.content_of(parsed.value).encode("utf-8")
    assert parsed.error in (None, formats.MISSING_RESULT, formats.UNCLOSED_RESULT, formats.SEVERAL_RESULTS,
                            formats.INVALID_JSON, formats.EMPTY_RESULT, formats.TOO_LONG)


@pytest.mark.heavy
@MANY
@given(texts)
def test_json_values_and_thinking_never_raise(text):
    formats.as_json_value(text)
    formats.strip_thinking(text)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                           max_leaves=8)
types = st.one_of(json_values, st.sampled_from(["string", "integer", "number", "boolean", "array", "object", "any"]),
                st.lists(st.sampled_from(["string", "null", "integer"])))
properties = st.dictionaries(st.text(max_size=3), st.one_of(
    json_values, st.fixed_dictionaries({"type": types, "enum": json_values})), max_size=3)
schemas = st.one_of(json_values, st.fixed_dictionaries({
    "type": st.just("object"), "properties": st.one_of(json_values, properties),
    "required": st.one_of(json_values, st.lists(st.text(max_size=3), max_size=3))}))


@pytest.mark.heavy
@MANY
@given(st.one_of(json_values, st.dictionaries(st.text(max_size=3), json_values, max_size=4)), schemas)
def test_the_validator_classifies_any_call_against_any_schema(arguments, parameters):
    problem = check_arguments(arguments, parameters)
    assert problem is None or isinstance(problem, str)
    kind = check_call(ToolCall("f", arguments if isinstance(arguments, dict) else {}), {"f": {"parameters":
                                                                                             parameters}})
    assert kind is None or kind[0] in ("INVALID_PARAMETERS", "TOOL_NOT_AVAILABLE")


def test_the_cases_found_before_are_classified():
    assert formats.parse_tool_calls("</tool_call><tool_call>").error == formats.UNBALANCED_TAGS
    assert formats.parse_execution_result('</execution_result><execution_result>{"ok": 1}').error \
        == formats.UNCLOSED_RESULT
    big = '{"name": "f", "arguments": {"n": ' + "1" * 4301 + "}}"
    assert formats.parse_tool_calls(f"<tool_call>{big}</tool_call>").error == formats.JSON_DECODE_ERROR
    deep = '{"name": "f", "arguments": "' + "[" * 1000 + "]" * 1000 + '"}'
    assert formats.parse_tool_calls(f"<tool_call>{deep}</tool_call>").error == formats.BAD_ARGUMENTS
    surrogate = '<tool_call>{"name": "f", "arguments": {"x": "\\ud800"}}</tool_call>'
    assert formats.parse_tool_calls(surrogate).error == formats.JSON_DECODE_ERROR
    assert formats.parse_execution_result('<execution_result>"\\ud800"</execution_result>').error \
        == formats.INVALID_JSON
    assert formats.as_json_value("1" * 4301) == "1" * 4301


class Hostile:
    """A backend whose every output, as caller and as rehearser, is one of the hostile texts in turn."""

    max_context = None

    def __init__(self, tok):
        self.tokenizer, self.n = tok, 0
        self.end = tok.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, params):
        from envace.policy.backend import Generation

        out = []
        for prompt in prompts:
            self.n += 1
            body = HOSTILE[self.n % len(HOSTILE)]
            rehearser = "## Call to simulate" in self.tokenizer.decode(prompt)
            text = _tag(body, "<execution_result>", "</execution_result>") if rehearser else \
                _tag('{"name": "ls", "arguments": ' + body + "}", "<tool_call>", "</tool_call>") \
                if self.n % 2 else _tag(body, "<tool_call>", "</tool_call>")
            if self.n % 3 == 0:  # a valid call now and then, so rehearsals happen
                text = '<tool_call>{"name": "ls", "arguments": {}}</tool_call>' if not rehearser else text
            out.append(Generation(self.tokenizer.encode(text, add_special_tokens=False) + [self.end], text, "stop"))
        return out


@pytest.mark.parametrize("mode", ["rehearse", "real+shadow"])
def test_hostile_outputs_of_both_roles_leave_their_batch_stored(tiny, tmp_path, mode):
    from envace.jobs import Reporter, rollout_job
    from envace.store import connect

    quiet = type("Quiet", (Reporter,), {"say": lambda self, text: None})()
    cfg = RolloutConfig(model="tiny", mode=mode, limit=2, max_steps_per_turn=4, embedding=False,
                        rehearser={"on_error": "feed_error"})
    run, summary = rollout_job(cfg, tmp_path, "hostile", reporter=quiet, backend=Hostile(tiny[1]))
    con = connect(tmp_path)
    rows = con.execute("SELECT role, parse_error FROM generations").fetchall()
    assert summary["episodes"] == 2 and len(rows) >= 6
    assert {"caller", "rehearser"} <= {r for r, _ in rows}
    assert {e for _, e in rows} & {formats.JSON_DECODE_ERROR, formats.BAD_ARGUMENTS, formats.INVALID_JSON}


toml_values = st.one_of(st.integers(), st.floats(), st.text(max_size=6), st.booleans(),
                        st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                              max_size=2))
fields = st.sampled_from(["env", "category", "split", "limit", "mode", "model", "group_size", "temperature",
                          "top_p", "rehearser", "private", "max_new_tokens", "unit", "backend", "lr", "sft_lr",
                          "rollout", "variant", "fsdp", "real_fraction", "bogus", "max_steps_per_turn", "grpo", "sft",
                          "packing"])


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(fields, toml_values, max_size=5))
def test_any_config_document_is_built_or_refused_in_one_line(document):
    for cls in (RolloutConfig, TrainConfig):
        try:
            cls.from_dict(document, where="doc")
        except UsageError as exc:
            assert "\n" not in str(exc) and str(exc).startswith("doc: ")


@pytest.mark.parametrize("content, args", [
    (b"\xff\xfe\x00binary", ["train"]), ("train = 3\n", ["train"]), ("[[train]]\nlr = 1\n", ["train"]),
    ("rollout = 3\n", ["rollout", "--config"]), ('[rollout]\nprivate = 3\n', ["rollout", "--budget", "1", "--config"]),
    ("[train]\nlr = nan\n", ["train"]), ("[rollout]\ntemperature = inf\n", ["rollout", "--config"]),
])
def test_bad_config_files_are_one_line_and_exit_2(tmp_path, content, args):
    path = tmp_path / "bad.toml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    command = [*args[:1], str(path)] if args == ["train"] else [*args, str(path)]
    done = subprocess.run([sys.executable, "-m", "envace.cli", *command, "--root", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (["rollout", "--temperature", "nan"], "temperature: expected a finite number"),
    (["rollout", "--model", "bad name"], "model"),
    (["rollout", "--model", "~nouser/m"], "model"),
    (["app", "--port", "99999"], "--port"), (["app", "--port", "-1"], "--port"),
    (["app", "--host", "999.1.1.1"], "--host"), (["serve", "tiny", "--port", "80000"], "--port"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path, args, message):
    done = subprocess.run([sys.executable, "-m", "envace.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr


# -- store, launcher and SQL: what a hostile user or a broken file can do --------------------------------------


def test_the_launcher_refuses_every_way_of_spelling_root(tmp_path):
    from workbench import launch

    for args in (["--root", str(tmp_path / "x")], ["--ro", str(tmp_path / "x")], [f"--roo={tmp_path / 'x'}"],
                 ["--no-such-flag"]):
        with pytest.raises(UsageError):
            launch(kind="rollout", root=tmp_path / "runs", args=args)
    assert not (tmp_path / "x").exists() and not (tmp_path / "runs").exists()


def test_sql_reads_the_store_and_nothing_else(store, tmp_path):
    from workbench import Workbench

    secret = tmp_path / "secret.txt"
    secret.write_text("not for the store")
    wb = Workbench(store)
    assert len(wb.sql("SELECT * FROM episodes")) > 0
    for query in (f"SELECT * FROM read_text('{secret}')", f"SELECT * FROM read_csv('{secret}')",
                  "SELECT * FROM read_text('/etc/hostname')", f"COPY episodes TO '{tmp_path / 'out.csv'}'",
                  "SELECT 1; SELECT 2"):
        with pytest.raises(UsageError):
            wb.sql(query)
    assert not (tmp_path / "out.csv").exists()


def test_doctor_names_every_problem_and_the_store_stays_usable(store, tmp_path, capsys):
    import json
    import shutil

    from envace.cli import main
    from workbench import Workbench

    root = tmp_path / "store"
    shutil.copytree(store, root)
    runs = sorted(p.name for p in root.iterdir() if (p / "run.json").exists())
    (root / runs[0] / "run.json").write_text("[]")  # valid JSON, not a run
    shard = next((root / runs[1] / "episodes").glob("*.parquet"))
    shard.write_bytes(b"PAR1 garbage")
    meta = json.loads((root / runs[2] / "run.json").read_text())
    (root / runs[2] / "run.json").write_text(json.dumps({**meta, "status": "running", "pid": 999_999_999}))
    (root / "stray").mkdir()
    capsys.readouterr()
    assert main(["doctor", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    for where in (runs[0], shard.name, runs[2], "stray"):
        assert where in out, (where, out)
    wb = Workbench(root)
    assert runs[0] not in set(wb.runs()["run_id"]) and len(wb.runs()) == len(runs) - 1
    assert any(shard.name in w for w in wb.warnings)
    assert main(["doctor", "--root", str(store)]) == 0


@pytest.mark.heavy
def test_sigterm_mid_run_keeps_whole_batches_marks_interrupted_and_exits_non_zero(tmp_path):
    """`kill`, `timeout` and job schedulers send SIGTERM: handled as Ctrl-C, never a half-stored batch."""
    import os
    import signal
    import time

    from envace.store import connect

    proc = subprocess.Popen([sys.executable, "-m", "envace.cli", "rollout", "--limit", "6", "--batch-size", "1",
                             "--root", str(tmp_path), "--run-name", "termed", "--model", "tiny",
                             "--max-new-tokens", "8", "--max-steps-per-turn", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not list(tmp_path.glob("termed/episodes/*.parquet")) and time.time() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err and "terminated" in err
    con = connect(tmp_path)
    stored = con.execute("SELECT count(*) FROM episodes").fetchall()[0][0]
    assert 1 <= stored < 6
    assert con.execute("SELECT count(DISTINCT episode_id) FROM generations").fetchall()[0][0] == stored
    assert con.execute("SELECT status FROM runs").fetchall()[0] == ("interrupted",)
    runs = subprocess.run([sys.executable, "-m", "envace.cli", "runs", "--root", str(tmp_path)], capture_output=True,
                          text=True, timeout=120).stdout
    row = next(line for line in runs.splitlines() if "termed" in line)
    assert "interrupted" in row and f" {stored} " in row  # the episodes it stored, though it has no summary


# A shell's background job (`make test &`) starts with SIGINT ignored and its children inherit that; these
# tests are about what Ctrl-C does where it is delivered, so their child processes take Python's own handler.
_SIGINT_WHY = "a background job inherits SIGINT ignored"


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_stop_that_lands_in_a_finalizer_is_not_lost(signame):
    """Python drops an exception raised inside `__del__`: a Ctrl-C or SIGTERM arriving while the garbage collector
    runs one (regex's, at model load) was ignored and the job ran to its end. It must still stop the job."""
    script = f"""
import os, signal, sys, time
from envace.cli import Terminated, install_stop_handlers
signal.signal(signal.SIGINT, signal.default_int_handler)  # {_SIGINT_WHY}
install_stop_handlers()
class Finalized:
    def __del__(self):  # the signal arrives and its handler raises here, inside a finalizer
        os.kill(os.getpid(), signal.{signame})
        time.sleep(0.2)
Finalized()
try:
    time.sleep(5)
except (KeyboardInterrupt, Terminated) as exc:
    print("stopped by", type(exc).__name__)
    sys.exit(0)
print("ran to the end")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == f"stopped by {'Terminated' if signame == 'SIGTERM' else 'KeyboardInterrupt'}", \
        out.stdout + out.stderr


def test_readers_see_the_old_or_the_new_run_while_a_cell_is_swapped_in(tmp_path):
    """A redone sweep cell is swapped in with one rename: 200 swaps under a busy reader, no read fails."""
    import threading

    from envace.store import swap_in

    target = tmp_path / "cell"
    target.mkdir()
    (target / "run.json").write_text(json.dumps({"generation": 0}))
    seen, failures, done = set(), [], threading.Event()

    def read() -> None:
        while not done.is_set():
            try:
                seen.add(json.loads((target / "run.json").read_text())["generation"])
            except (OSError, ValueError) as exc:
                failures.append(repr(exc))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for generation in range(1, 201):
            staged = tmp_path / ".staging" / f"cell-{generation}"
            staged.mkdir(parents=True)
            (staged / "run.json").write_text(json.dumps({"generation": generation}))
            swap_in(staged, target)
    finally:
        done.set()
        reader.join()
    assert failures == []
    assert json.loads((target / "run.json").read_text())["generation"] == 200
    assert len(seen) > 1 and not list((tmp_path / ".staging").iterdir())


# -- round two: found by probing from outside ------------------------------------------------------------------

def test_an_integer_parameter_takes_a_number_with_no_fraction_as_json_schema_does():
    schema = {"properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert check_arguments({"n": 1.0}, schema) is None and check_arguments({"n": 3}, schema) is None
    for wrong in (1.5, True, "1", float("inf"), float("nan")):
        assert "should be integer" in check_arguments({"n": wrong}, schema)


def test_calculate_bounds_its_work_by_size_and_answers_at_any_stack_depth():
    from tau2.domains.airline.tools import AirlineTools

    from envace.envs.tau2.calc import calculate

    def at_depth(depth: int, expression: str):
        if depth:
            return at_depth(depth - 1, expression)
        try:
            return calculate(expression)
        except Exception as exc:  # noqa: BLE001 - the exception is the outcome compared
            return type(exc).__name__, str(exc)

    for depth in (0, 400, 800):  # τ²'s eval answers 1 at the top of a stack; ours wherever it is called from
        assert at_depth(depth, "-" * 2972 + "1") == "1.0"
        assert at_depth(depth, "+".join(["1"] * 20_000)) == "20000.0"
    assert at_depth(0, "-" * 5976)[0] == "SyntaxError"  # no operand: CPython's parser gave MemoryError
    for product in ("*".join(["2**65536"] * 2_000), "+".join(["9**19728"] * 11_000)):  # 18k and 99k characters
        assert at_depth(0, product) == ("OverflowError", "int too large to convert to float")
    for expression in ("()", "(())", "...", "(2)(3)", "()*3"):  # τ²'s own TypeError, message and all
        theirs = None
        try:
            AirlineTools.calculate(None, expression)
        except TypeError as exc:
            theirs = ("TypeError", str(exc))
        assert theirs is not None and at_depth(0, expression) == theirs, expression


def test_ctrl_c_during_requests_to_a_slow_server_exits_at_once(tmp_path):
    """Requests in flight are not waited for: the server here holds every request for two minutes."""
    import http.server
    import os
    import signal
    import threading
    import time

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the handler's name
            time.sleep(120)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = (
        "import signal, sys\n"
        f"signal.signal(signal.SIGINT, signal.default_int_handler)  # {_SIGINT_WHY}\n"
        "from envace.policy.backend import SamplingParams\n"
        "from envace.policy.models import load_tokenizer\n"
        "from envace.policy.remote import RemoteBackend\n"
        f"backend = RemoteBackend(['http://127.0.0.1:{server.server_address[1]}/v1'], 'base', load_tokenizer('tiny'))\n"
        "print('generating', flush=True)\n"
        "try:\n"
        "    backend.generate([[1, 2, 3]] * 4, SamplingParams(max_new_tokens=4))\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', flush=True)\n"
        "    sys.exit(130)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "generating"
    time.sleep(1.0)  # the four requests are in flight
    os.kill(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)  # was: until each request's own timeout (here, the server's 120 s)
    finally:
        proc.kill()
        server.shutdown()
    assert proc.returncode == 130 and "interrupted" in out, err
