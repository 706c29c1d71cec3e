"""JSON Schema of a FlinkApp, generated from the models (checked in under schemas/, kept in sync by a test)."""

from __future__ import annotations

from typing import Any

from reconciler.spec.model import FlinkApp

SCHEMA_ID = "https://flink-reconciler.io/schemas/flinkapp-v1alpha1.json"


def flinkapp_schema() -> dict[str, Any]:
    schema = FlinkApp.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **{k: v for k, v in schema.items() if k not in ("title", "description")},
        "title": "FlinkApp",
        "description": "One Flink application managed by flink-reconciler. Each field's x-change-class says "
        "what changing it does: ignore < scale < upgrade < redeploy.",
    }
