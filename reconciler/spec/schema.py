"""JSON Schemas of a FlinkApp and a FlinkSessionCluster, generated from the models (checked in under schemas/,
kept in sync by a test)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from reconciler.spec.model import FlinkApp
from reconciler.spec.session import FlinkSessionCluster

SCHEMA_ID = "https://flink-reconciler.io/schemas/flinkapp-v1alpha1.json"
SESSION_SCHEMA_ID = "https://flink-reconciler.io/schemas/flinksessioncluster-v1alpha1.json"
KINDS = ("FlinkApp", "FlinkSessionCluster")


def _schema(model: type[BaseModel], schema_id: str, title: str, description: str) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_id,
        **{k: v for k, v in schema.items() if k not in ("title", "description")},
        "title": title,
        "description": description,
    }


def flinkapp_schema() -> dict[str, Any]:
    return _schema(FlinkApp, SCHEMA_ID, "FlinkApp",
                   "One Flink application managed by flink-reconciler. Each field's x-change-class says "
                   "what changing it does: ignore < scale < upgrade < redeploy.")


def session_cluster_schema() -> dict[str, Any]:
    return _schema(FlinkSessionCluster, SESSION_SCHEMA_ID, "FlinkSessionCluster",
                   "One Flink session cluster whose task slots the jobs of several FlinkApps share (each app "
                   "names it in spec.sessionCluster). Each field's x-change-class says what changing it does to "
                   "every job on the cluster: ignore < scale < upgrade < redeploy.")


def schema_of(kind: str) -> dict[str, Any]:
    return session_cluster_schema() if kind == "FlinkSessionCluster" else flinkapp_schema()
