"""BFCL's data folder and its function docs as JSON Schema tools (the multi-turn and memory classes' docs)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from envace.paths import package_dir

_TYPE_MAP = {"dict": "object", "float": "number", "tuple": "array"}


def data_dir() -> Path:
    return package_dir("bfcl_eval", "bfcl-eval", "BFCL") / "data"


def jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


def openai_types(schema: Any) -> Any:
    """BFCL's schema dialect ("dict", "float", "tuple") to JSON Schema, recursively."""
    if isinstance(schema, dict):
        out = {k: openai_types(v) for k, v in schema.items()}
        if isinstance(out.get("type"), str):
            out["type"] = _TYPE_MAP.get(out["type"], out["type"])
        return out
    if isinstance(schema, list):
        return [openai_types(v) for v in schema]
    return schema


def to_openai_tool(doc: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": doc["name"], "description": doc["description"],
                                             "parameters": openai_types(doc["parameters"])}}


@lru_cache(maxsize=16)
def class_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    return tuple(jsonl(data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))
