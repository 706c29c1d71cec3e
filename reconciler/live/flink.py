"""The only module that talks to Flink's REST API.

Every call has a timeout. Failures become `FlinkRestError`s whose class tells the executor whether to
retry (`FlinkTransientError`, a `TransientStepError`) or not (`FlinkPermanentError`, a
`PermanentStepError`); they keep Flink's own `errors` list and a short `cause` (the deepest
"Caused by:" line), because that text is what a user needs on the commit status. That reading of
Flink's answers is `flink_errors.py`; its names are importable from here too.

Never calls `POST /applications/{id}/cancel`: on Flink 2.3 it crashes the JobManager for an application
left behind by a failed submit (see FLINK_FACTS.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from reconciler.errors import JobNotFoundError
from reconciler.live.flink_errors import (
    FlinkPermanentError,
    FlinkRestError,
    FlinkTransientError,
    FlinkTriggerNotFoundError,
    FlinkUnavailableError,
    FlinkUnsupportedError,
    error_for,
    errors_of,
    is_transient_text,
    summarize_errors,
    summarize_stack,
)
from reconciler.live.ports import CheckpointStats, ClusterOverview, JobSummary, SavepointStatus

# Submits run the job's main() inside the JobManager: give them more time than a status read.
_SUBMIT_TIMEOUT_FLOOR = 60.0
_JSON = "application/json"
# GET /jobs/<id>/checkpoints of a job without checkpoint statistics (CheckpointingStatisticsHandler, 404)
_NOT_ENABLED = "Checkpointing has not been enabled"
# Flink's StopWithSavepointStoppingException: "A savepoint has been created at: <path>, but the corresponding job
# <id> failed during stopping. The savepoint is consistent, but might have uncommitted transactions."
_SAVEPOINT_MADE = re.compile(r"A savepoint has been created at: (\S+?), but the corresponding job")

_DUPLICATE_MARKERS = (
    "DuplicateJobSubmissionException", "DuplicateApplicationSubmissionException", "already been submitted",
)


@dataclass(frozen=True)
class VertexGraph:
    """A job vertex with what the autoscaler needs of the job graph."""

    vertex_id: str
    name: str
    parallelism: int
    max_parallelism: int  # 0: not reported
    status: str
    inputs: tuple[str, ...]  # upstream vertex ids; empty: a source


@dataclass(frozen=True)
class JobVertex:
    """One vertex of a job as `GET /jobs/{id}` reports it."""

    vertex_id: str
    name: str
    parallelism: int
    status: str
    tasks_running: int


class FlinkRestClient:
    """`reconciler.live.ports.FlinkApi` over httpx.

    `base_url` may carry a path (the Kubernetes API server's service proxy); request paths are appended
    to it. A caller-supplied `client` (auth, TLS) is used as is and not closed by `close()`.
    """

    def __init__(self, base_url: str, *, client: httpx.Client | None = None, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._own_client = client is None
        self._client = client if client is not None else httpx.Client(timeout=timeout)

    def close(self) -> None:
        if self._own_client:
            self._client.close()

    def __enter__(self) -> FlinkRestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FlinkRestClient({self.base_url!r})"

    # -- cluster ------------------------------------------------------------------------------------

    def overview(self) -> ClusterOverview:
        body = self._json("GET", "/overview")
        return ClusterOverview(
            taskmanagers=int(body.get("taskmanagers", 0)),
            slots_total=int(body.get("slots-total", 0)),
            slots_available=int(body.get("slots-available", 0)),
            flink_version=str(body.get("flink-version", "")),
        )

    def taskmanagers(self) -> list[dict[str, Any]]:
        """Registered TaskManagers as Flink reports them (id, slotsNumber, freeSlots, ...)."""
        body = self._json("GET", "/taskmanagers")
        return [dict(tm) for tm in body.get("taskmanagers", [])]

    # -- jobs ---------------------------------------------------------------------------------------

    def jobs(self) -> list[JobSummary]:
        # /jobs/overview is not cached by the REST handlers (unlike /jobs/{id}), so it shows task
        # states the moment they change.
        body = self._json("GET", "/jobs/overview")
        return [_job_summary(j) for j in body.get("jobs", [])]

    def job(self, job_id: str) -> JobSummary:
        for j in self.jobs():
            if j.job_id == job_id:
                return j
        # Not in the overview: let the JobManager answer for this id (404 -> JobNotFoundError).
        body = self._json("GET", f"/jobs/{job_id}", job_id=job_id)
        running = total = finished = 0
        for v in body.get("vertices", []):
            total += int(v.get("parallelism", 0))
            running += int((v.get("tasks") or {}).get("RUNNING", 0))
            finished += int((v.get("tasks") or {}).get("FINISHED", 0))
        return JobSummary(
            job_id=str(body.get("jid", job_id)),
            name=str(body.get("name", "")),
            state=str(body.get("state", "UNKNOWN")),
            tasks_running=running,
            tasks_total=total,
            start_time_ms=int(body.get("start-time", 0)),
            tasks_finished=finished,
        )

    def exceptions(self, job_id: str) -> list[str]:
        """The job's exception history, newest first, each as '<exception>: <deepest cause>'."""
        body = self._json("GET", f"/jobs/{job_id}/exceptions", job_id=job_id)
        history = (body.get("exceptionHistory") or {}).get("entries") or []
        out: list[str] = []
        for entry in history:
            trace = str(entry.get("stacktrace") or entry.get("exceptionName") or "")
            task = entry.get("taskName")
            line = summarize_stack(trace)
            out.append(f"{line} (task {task})" if task else line)
        if not out and body.get("root-exception"):
            out.append(summarize_stack(str(body["root-exception"])))
        return out

    def cancel(self, job_id: str) -> None:
        """Cancel; a job that is already terminal (409) is not an error."""
        self._request("PATCH", f"/jobs/{job_id}?mode=cancel", job_id=job_id, ok_statuses=(409,))

    # -- parallelism (adaptive scheduler) -----------------------------------------------------------

    def vertices(self, job_id: str) -> list[JobVertex]:
        """The job's vertices with the parallelism they run at (cached by Flink for web.refresh-interval)."""
        body = self._json("GET", f"/jobs/{job_id}", job_id=job_id)
        return [JobVertex(vertex_id=str(v.get("id", "")), name=str(v.get("name", "")),
                          parallelism=int(v.get("parallelism", 0)), status=str(v.get("status", "")),
                          tasks_running=int((v.get("tasks") or {}).get("RUNNING", 0)))
                for v in body.get("vertices", [])]

    def resource_requirements(self, job_id: str) -> dict[str, tuple[int, int]]:
        """`GET /jobs/{id}/resource-requirements`: vertex id -> (lower, upper) parallelism bound."""
        body = self._requirements("GET", job_id)
        out: dict[str, tuple[int, int]] = {}
        for vertex, req in body.items():
            bounds = (req or {}).get("parallelism") or {}
            out[str(vertex)] = (int(bounds.get("lowerBound", 0)), int(bounds.get("upperBound", 0)))
        return out

    def set_resource_requirements(self, job_id: str, requirements: Mapping[str, tuple[int, int]]) -> None:
        """`PUT /jobs/{id}/resource-requirements` (every vertex of the job, or Flink answers 400). The adaptive
        scheduler rescales the running job to them; Flink answers at once, before it did."""
        payload = {v: {"parallelism": {"lowerBound": lo, "upperBound": hi}} for v, (lo, hi) in requirements.items()}
        self._requirements("PUT", job_id, payload)

    def _requirements(self, method: str, job_id: str, payload: Mapping[str, Any] | None = None) -> dict[str, Any]:
        path = f"/jobs/{job_id}/resource-requirements"
        try:
            # 404/405: no such route (a Flink before 1.18). An unknown job is a 500 FlinkJobNotFoundException.
            resp = self._request(method, path, payload=payload, ok_statuses=(404, 405))
        except FlinkRestError as e:
            text = "\n".join(e.errors)
            if "FlinkJobNotFoundException" in text:
                raise JobNotFoundError(f"Flink does not know job {job_id} ({method} {e.url}): {e.cause}") from e
            if "UnsupportedOperationException" in text:
                raise FlinkUnsupportedError("the job's scheduler cannot change its parallelism in place (only the "
                                            "adaptive scheduler can)", method=method, url=e.url, status=e.status,
                                            errors=e.errors) from e
            raise
        if resp.status_code in (404, 405):
            raise FlinkUnsupportedError("this Flink has no resource requirements endpoint", method=method,
                                        url=self._url(path), status=resp.status_code, errors=errors_of(resp))
        if method != "GET":
            return {}
        try:
            body = resp.json()
        except ValueError as e:
            raise FlinkTransientError(f"Flink answered with non-JSON: {resp.text[:300]!r}", method=method,
                                      url=self._url(path), status=resp.status_code) from e
        return body if isinstance(body, dict) else {}

    # -- metrics (autoscaling) ----------------------------------------------------------------------

    def job_graph(self, job_id: str) -> list[VertexGraph]:
        """`GET /jobs/{id}`: each vertex with its parallelism, max parallelism and upstream vertices (from the
        job's plan). One request for the whole job."""
        body = self._json("GET", f"/jobs/{job_id}", job_id=job_id)
        inputs: dict[str, tuple[str, ...]] = {}
        for node in (body.get("plan") or {}).get("nodes") or []:
            inputs[str(node.get("id", ""))] = tuple(str(i.get("id", "")) for i in node.get("inputs") or ())
        return [VertexGraph(vertex_id=str(v.get("id", "")), name=str(v.get("name", "")),
                            parallelism=int(v.get("parallelism", 0)),
                            max_parallelism=int(v.get("maxParallelism", v.get("max-parallelism", 0)) or 0),
                            status=str(v.get("status", "")), inputs=inputs.get(str(v.get("id", "")), ()))
                for v in body.get("vertices", [])]

    def vertex_metric_names(self, job_id: str, vertex_id: str) -> list[str]:
        """The metric ids a vertex's subtasks report (`GET .../subtasks/metrics` without `get`)."""
        body = self._request("GET", f"/jobs/{job_id}/vertices/{vertex_id}/subtasks/metrics", job_id=job_id).json()
        return [str(m.get("id")) for m in body if isinstance(m, dict)] if isinstance(body, list) else []

    def vertex_metrics(self, job_id: str, vertex_id: str, names: Sequence[str]) -> dict[str, dict[str, float]]:
        """Metrics of one vertex aggregated over its subtasks by Flink itself, in one request:
        `GET /jobs/{id}/vertices/{vid}/subtasks/metrics?get=a,b&agg=sum,avg,max` -> name -> {sum, avg, max}.
        A metric Flink does not (yet) report is absent; a NaN is left out too."""
        path = (f"/jobs/{job_id}/vertices/{vertex_id}/subtasks/metrics?get={','.join(names)}&agg=sum,avg,max")
        body = self._request("GET", path, job_id=job_id).json()
        out: dict[str, dict[str, float]] = {}
        for m in body if isinstance(body, list) else []:
            if not isinstance(m, dict) or "id" not in m:
                continue
            values: dict[str, float] = {}
            for agg in ("sum", "avg", "max"):
                try:
                    v = float(m[agg])
                except (KeyError, TypeError, ValueError):
                    continue
                if math.isfinite(v):
                    values[agg] = v
            if values:
                out[str(m["id"])] = values
        return out

    # -- savepoints and checkpoints -----------------------------------------------------------------

    def trigger_savepoint(self, job_id: str, *, cancel_job: bool = False, trigger_id: str | None = None,
                          target_directory: str | None = None) -> str:
        payload: dict[str, Any] = {"cancel-job": cancel_job, "formatType": "CANONICAL"}
        if trigger_id:
            payload["triggerId"] = trigger_id
        if target_directory:  # else the cluster's execution.checkpointing.savepoint-dir
            payload["target-directory"] = target_directory
        body = self._json("POST", f"/jobs/{job_id}/savepoints", job_id=job_id, payload=payload)
        return _request_id(body, self, f"/jobs/{job_id}/savepoints")

    def stop_with_savepoint(self, job_id: str, *, drain: bool = False, trigger_id: str | None = None,
                            target_directory: str | None = None) -> str:
        payload: dict[str, Any] = {"drain": drain, "formatType": "CANONICAL"}
        if trigger_id:
            payload["triggerId"] = trigger_id
        if target_directory:
            payload["targetDirectory"] = target_directory
        body = self._json("POST", f"/jobs/{job_id}/stop", job_id=job_id, payload=payload)
        return _request_id(body, self, f"/jobs/{job_id}/stop")

    def savepoint_status(self, job_id: str, trigger_id: str) -> SavepointStatus:
        """Poll a savepoint or stop-with-savepoint. COMPLETED with a failure-cause is a failure."""
        body = self._json("GET", f"/jobs/{job_id}/savepoints/{trigger_id}", job_id=job_id)
        state = str((body.get("status") or {}).get("id", ""))
        if state != "COMPLETED":
            return SavepointStatus(done=False)
        op = body.get("operation") or {}
        failure = op.get("failure-cause")
        if failure:
            trace = str(failure.get("stack-trace") or failure.get("class") or failure)
            # The job failed while stopping (a TaskManager killed then), *after* its savepoint completed: Flink
            # names the savepoint, consistent and restorable (StopWithSavepointStoppingException). The stop took.
            made = _SAVEPOINT_MADE.search(trace)
            if made:
                return SavepointStatus(done=True, location=made.group(1))
            first = summarize_stack(trace.split("\nCaused by:", 1)[0])
            deepest = summarize_stack(trace)
            text = first if first == deepest else f"{first} (caused by: {deepest})"
            return SavepointStatus(done=True, failure=text)
        location = op.get("location")
        if not location:
            return SavepointStatus(done=True, failure=f"savepoint completed without a location: {op!r}"[:500])
        return SavepointStatus(done=True, location=str(location))

    def trigger_disposal(self, savepoint_path: str) -> str:
        """Ask the JobManager to dispose of a savepoint (`POST /savepoint-disposal`): Flink deletes it
        with its own filesystem plugins, so this works for s3://, gs://, hdfs:// as for file:."""
        body = self._json("POST", "/savepoint-disposal", payload={"savepoint-path": savepoint_path})
        return _request_id(body, self, "/savepoint-disposal")

    def disposal_status(self, trigger_id: str) -> SavepointStatus:
        """Poll a disposal; done with `failure` set when Flink could not dispose of it."""
        body = self._json("GET", f"/savepoint-disposal/{trigger_id}")
        if str((body.get("status") or {}).get("id", "")) != "COMPLETED":
            return SavepointStatus(done=False)
        failure = (body.get("operation") or {}).get("failure-cause")
        if failure:
            trace = str(failure.get("stack-trace") or failure.get("class") or failure)
            return SavepointStatus(done=True, failure=summarize_stack(trace))
        return SavepointStatus(done=True)

    def checkpoints(self, job_id: str) -> CheckpointStats:
        """The job's checkpoint statistics. A job without them (Flink's 404 "Checkpointing has not been enabled.":
        no checkpoint coordinator, e.g. a job that failed at submission, "(application driver)") has none: no
        checkpoints, not an unknown job (the Flink operator's AbstractFlinkService reads it the same way)."""
        resp = self._request("GET", f"/jobs/{job_id}/checkpoints", job_id=job_id, ok_statuses=(404,))
        if resp.status_code == 404:
            if any(_NOT_ENABLED in e for e in errors_of(resp)):
                return CheckpointStats(completed_count=0, latest_completed_id=None, latest_completed_path=None,
                                       latest_completed_at=None, restored_path=None, restored_is_savepoint=None)
            raise error_for(resp, method="GET", url=self._url(f"/jobs/{job_id}/checkpoints"), job_id=job_id)
        body = self._body(resp, "GET", f"/jobs/{job_id}/checkpoints")
        latest = body.get("latest") or {}
        completed = latest.get("completed") or {}
        restored = latest.get("restored") or {}
        savepoint = latest.get("savepoint") or {}
        ack_ms = completed.get("latest_ack_timestamp")
        sp_ms = savepoint.get("latest_ack_timestamp")
        return CheckpointStats(
            completed_count=int((body.get("counts") or {}).get("completed", 0)),
            latest_completed_id=int(completed["id"]) if "id" in completed else None,
            latest_completed_path=completed.get("external_path") or None,
            latest_completed_at=datetime.fromtimestamp(ack_ms / 1000, UTC) if ack_ms else None,
            restored_path=restored.get("external_path") or None,
            restored_is_savepoint=bool(restored["is_savepoint"]) if "is_savepoint" in restored else None,
            latest_savepoint_path=savepoint.get("external_path") or None,
            latest_savepoint_at=datetime.fromtimestamp(sp_ms / 1000, UTC) if sp_ms else None,
            failed_count=int((body.get("counts") or {}).get("failed", 0)),
        )

    def restarts(self, job_id: str) -> int | None:
        """Flink's `numRestarts` job metric (None when the JobManager does not report it yet)."""
        resp = self._request("GET", f"/jobs/{job_id}/metrics?get=numRestarts", job_id=job_id)
        try:
            found = resp.json()
            return int(float(next(m["value"] for m in found if m.get("id") == "numRestarts")))
        except (ValueError, TypeError, KeyError, StopIteration, AttributeError):
            return None

    # -- jars ---------------------------------------------------------------------------------------

    def upload_jar(self, path: Path) -> str:
        """Upload a jar; returns the jar id Flink assigned (the basename of its stored file)."""
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FlinkPermanentError(
                f"cannot read jar {path}: {e.strerror or e}", method="POST", url=self._url("/jars/upload")
            ) from e
        body = self._json(
            "POST", "/jars/upload",
            files={"jarfile": (path.name, data, "application/x-java-archive")},
            timeout=max(self._timeout, _SUBMIT_TIMEOUT_FLOOR),
        )
        filename = str(body.get("filename") or "")
        if body.get("status") != "success" or not filename:
            raise FlinkPermanentError(
                f"jar upload of {path} was not accepted: {body!r}"[:500], method="POST",
                url=self._url("/jars/upload"),
            )
        return filename.replace("\\", "/").rsplit("/", 1)[-1]

    def delete_jar(self, jar_id: str) -> None:
        self._request("DELETE", f"/jars/{jar_id}", ok_statuses=(404,))

    def jars(self) -> dict[str, str]:
        """The jars uploaded to this JobManager: id -> the file name they were uploaded under."""
        body = self._json("GET", "/jars")
        files = body.get("files") or []
        return {str(f["id"]): str(f.get("name") or "") for f in files if isinstance(f, dict) and f.get("id")}

    def run_jar(
        self,
        jar_id: str,
        *,
        job_id: str,
        entry_class: str | None = None,
        args: tuple[str, ...] = (),
        parallelism: int | None = None,
        savepoint_path: str | None = None,
        allow_non_restored_state: bool = False,
        flink_configuration: dict[str, str] | None = None,
    ) -> str:
        """Submit with a caller-chosen job id. A job with that id already there (from an earlier,
        maybe timed-out, attempt) is returned as is: a retried submit never makes a second job."""
        if any(j.job_id == job_id for j in self.jobs()):
            return job_id
        payload: dict[str, Any] = {
            "jobId": job_id,
            "programArgsList": list(args),
            "allowNonRestoredState": allow_non_restored_state,
            "claimMode": "NO_CLAIM",
        }
        if entry_class:
            payload["entryClass"] = entry_class
        if parallelism is not None:
            payload["parallelism"] = parallelism
        if savepoint_path:
            payload["savepointPath"] = savepoint_path
        if flink_configuration:
            payload["flinkConfiguration"] = dict(flink_configuration)
        try:
            body = self._json(
                "POST", f"/jars/{jar_id}/run", payload=payload, timeout=max(self._timeout, _SUBMIT_TIMEOUT_FLOOR)
            )
        except FlinkRestError as e:
            if any(m in t for t in e.errors for m in _DUPLICATE_MARKERS):
                return job_id
            raise
        return str(body.get("jobid") or job_id)

    def plan_jar(self, jar_id: str, *, entry_class: str | None = None, args: tuple[str, ...] = (),
                 parallelism: int | None = None) -> None:
        """Compile the job graph of an uploaded jar without running it (`POST /jars/{id}/plan`). The
        JobManager loads the program's classes and runs its main() once, so a later submit of it is faster:
        a warm standby does this before the old job stops."""
        payload: dict[str, Any] = {"programArgsList": list(args)}
        if entry_class:
            payload["entryClass"] = entry_class
        if parallelism is not None:
            payload["parallelism"] = parallelism
        self._json("POST", f"/jars/{jar_id}/plan", payload=payload, timeout=max(self._timeout, _SUBMIT_TIMEOUT_FLOOR))

    # -- plumbing -----------------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return self.base_url + path

    def _json(
        self,
        method: str,
        path: str,
        *,
        job_id: str | None = None,
        payload: Mapping[str, Any] | None = None,
        files: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        resp = self._request(method, path, job_id=job_id, payload=payload, files=files, timeout=timeout)
        return self._body(resp, method, path)

    def _body(self, resp: httpx.Response, method: str, path: str) -> dict[str, Any]:
        try:
            body = resp.json()
        except ValueError as e:
            raise FlinkTransientError(
                f"Flink answered with non-JSON: {resp.text[:300]!r}", method=method, url=self._url(path),
                status=resp.status_code,
            ) from e
        if not isinstance(body, dict):
            raise FlinkTransientError(
                f"Flink answered with unexpected JSON: {body!r}"[:300], method=method, url=self._url(path),
                status=resp.status_code,
            )
        return body

    def _request(
        self,
        method: str,
        path: str,
        *,
        job_id: str | None = None,
        payload: Mapping[str, Any] | None = None,
        files: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        ok_statuses: tuple[int, ...] = (),
    ) -> httpx.Response:
        url = self._url(path)
        try:
            resp = self._client.request(
                method, url,
                json=dict(payload) if payload is not None else None,
                files=dict(files) if files is not None else None,
                headers={"Accept": _JSON},
                timeout=timeout if timeout is not None else self._timeout,
            )
        except httpx.TimeoutException as e:
            raise FlinkUnavailableError(
                f"Flink REST timed out: {type(e).__name__}: {e}", method=method, url=url
            ) from e
        except httpx.TransportError as e:
            raise FlinkUnavailableError(
                f"Flink REST unreachable: {type(e).__name__}: {e}", method=method, url=url
            ) from e
        if resp.is_success or resp.status_code in ok_statuses:
            return resp
        raise error_for(resp, method=method, url=url, job_id=job_id)


def _job_summary(j: Mapping[str, Any]) -> JobSummary:
    tasks = j.get("tasks") or {}
    return JobSummary(
        job_id=str(j.get("jid", "")),
        name=str(j.get("name", "")),
        state=str(j.get("state", "UNKNOWN")),
        tasks_running=int(tasks.get("running", 0)),
        tasks_total=int(tasks.get("total", 0)),
        start_time_ms=int(j.get("start-time", 0)),
        tasks_finished=int(tasks.get("finished", 0)),
    )


def _request_id(body: Mapping[str, Any], client: FlinkRestClient, path: str) -> str:
    rid = body.get("request-id")
    if not rid:
        raise FlinkTransientError(f"no request-id in Flink's answer: {body!r}"[:300], method="POST",
                                  url=client.base_url + path)
    return str(rid)


__all__ = [
    "FlinkPermanentError", "FlinkRestClient", "FlinkRestError", "FlinkTransientError", "FlinkTriggerNotFoundError",
    "FlinkUnavailableError", "FlinkUnsupportedError", "JobVertex", "VertexGraph", "is_transient_text",
    "summarize_errors", "summarize_stack",
]
