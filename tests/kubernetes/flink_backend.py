"""A loopback Flink REST contract server: the REST API of one application-mode JobManager, as Flink 2.3
answers the calls the reconciler makes (shapes as a real Flink 2.3 gives them), for tests that reach it
through the stand-in API server's service proxy.

It models one JobManager *process*: `start_jobmanager(job_id, restore_path=...)` is what the container
does when it starts with `standalone-job --job-id ID [--fromSavepoint P]`; `stop_jobmanager()` is the pod
going away (no HA: the new process knows only its own job). Time comes from the injected clock:

- a started job reports RUNNING at once but its tasks run only `tasks_after_s` later;
- a retained checkpoint completes every `checkpoint_interval_s` once the tasks run;
- `POST /jobs/{id}/stop` (and `/savepoints`) answer 202 with a request id, the caller's `triggerId`
  when the body names one (a resent request with a known id is the same operation); the first poll of
  `GET /jobs/{id}/savepoints/{rid}` is IN_PROGRESS, the next COMPLETED with `operation.location`
  (a stop then leaves the job FINISHED) or, when `savepoint_failure` is set, COMPLETED with
  `operation.failure-cause` and the job still RUNNING; a stop of an unknown job is accepted and fails
  inside the operation; an unknown request id is 404;
- `PATCH /jobs/{id}?mode=cancel` answers 202 (CANCELED), 409 for a terminal job, 404 for an unknown one;
- unknown jobs are 404 with Flink's `{"errors": [...]}` body;
- a *session* JobManager (`start_session()`: a warm standby's, no job of its own) also serves the jar staged in
  its upload dir: `POST /jars/{id}/plan` compiles nothing and answers a plan, `POST /jars/{id}/run` starts the
  job named by `jobId` from `savepointPath` (recorded in `starts`; a known id is Flink's duplicate error), or
  answers 500 with `run_failure` when that is set; its jar store (`jar_files`, id -> name) answers `GET /jars`,
  `POST /jars/upload` (stored as `<uuid>_<file name>`, as Flink names an upload) and `DELETE /jars/{id}`.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from reconciler.clock import Clock

TERMINAL = frozenset({"FINISHED", "CANCELED", "FAILED"})
TASK_STATES = ("created", "scheduled", "deploying", "running", "finished", "canceling", "canceled", "failed",
               "reconciling", "initializing")


@dataclass
class Job:
    jid: str
    name: str
    parallelism: int
    started_at: float  # clock.monotonic()
    start_ms: int
    restored_from: str | None
    state: str = "RUNNING"
    end_ms: int = -1


class FlinkBackend:
    def __init__(self, clock: Clock, *, name: str = "counter", parallelism: int = 2, tasks_after_s: float = 1.0,
                 checkpoint_interval_s: float = 10.0, savepoint_dir: str = "s3://bucket/savepoints/counter",
                 checkpoint_dir: str = "s3://bucket/checkpoints/counter") -> None:
        self.clock = clock
        self.name, self.parallelism = name, parallelism
        self.tasks_after_s, self.checkpoint_interval_s = tasks_after_s, checkpoint_interval_s
        self.savepoint_dir, self.checkpoint_dir = savepoint_dir.rstrip("/"), checkpoint_dir.rstrip("/")
        self.savepoint_failure: str | None = None  # Java stack trace of a failing savepoint
        self.jobs: dict[str, Job] = {}
        self.operations: dict[tuple[str, str], dict[str, Any]] = {}  # (job id, request id) -> operation
        self.up = False
        self.session = False  # a session JobManager: jobs come by REST submit
        self.jar_files: dict[str, str] = {}  # a session JobManager's jar store: id -> name
        self.run_failure: str | None = None  # Flink's error text when a submit fails (e.g. a bad entry class)
        self.starts: list[tuple[str, str | None]] = []  # (job id, restore path) per JobManager start
        self.requests: list[tuple[str, str]] = []
        self.savepoints_taken: list[str] = []  # every savepoint location completed, across JobManager restarts
        self.lock = threading.Lock()

    # ---- what the JobManager container does ----
    def start_jobmanager(self, job_id: str, *, restore_path: str | None) -> None:
        with self.lock:
            self.up = True
            now = self.clock.now()
            self.jobs = {job_id: Job(jid=job_id, name=self.name, parallelism=self.parallelism,
                                     started_at=self.clock.monotonic(), start_ms=int(now.timestamp() * 1000),
                                     restored_from=restore_path)}
            self.operations = {}
            self.starts.append((job_id, restore_path))

    def start_session(self) -> None:
        """A session JobManager process starts: no job until one is submitted over REST."""
        with self.lock:
            self.up, self.session = True, True
            self.jobs = {}
            self.operations = {}

    def stop_jobmanager(self) -> None:
        with self.lock:
            self.up = False
            self.jobs = {}
            self.operations = {}

    def job_state(self, job_id: str) -> str | None:
        with self.lock:
            job = self.jobs.get(job_id)
            return job.state if job else None

    # ---- derived state ----
    def _now_ms(self) -> int:
        return int(self.clock.now().timestamp() * 1000)

    def _tasks_running(self, job: Job) -> bool:
        return job.state == "RUNNING" and self.clock.monotonic() - job.started_at >= self.tasks_after_s

    def _checkpoints(self, job: Job) -> int:
        if job.state != "RUNNING" or not self._tasks_running(job):
            return 0
        return int((self.clock.monotonic() - job.started_at - self.tasks_after_s) // self.checkpoint_interval_s)

    def _task_counts(self, job: Job) -> dict[str, int]:
        counts = dict.fromkeys(TASK_STATES, 0)
        key = {"RUNNING": "running" if self._tasks_running(job) else "deploying", "FINISHED": "finished",
               "CANCELED": "canceled", "FAILED": "failed"}.get(job.state, "created")
        counts[key] = job.parallelism
        return counts

    def _overview_entry(self, job: Job) -> dict[str, Any]:
        now = self._now_ms()
        end = job.end_ms
        return {"jid": job.jid, "name": job.name, "start-time": job.start_ms, "end-time": end,
                "duration": (end if end > 0 else now) - job.start_ms, "state": job.state,
                "last-modification": now, "tasks": {**self._task_counts(job), "total": job.parallelism}}

    def _details(self, job: Job) -> dict[str, Any]:
        counts = self._task_counts(job)
        return {**{k: v for k, v in self._overview_entry(job).items() if k != "tasks"},
                "isStoppable": False, "job-type": "STREAMING", "maxParallelism": -1, "now": self._now_ms(),
                "vertices": [{"id": "cbc357ccb763df2852fee8c4fc7d55f2", "name": "Source: counter -> Sink",
                              "maxParallelism": 128, "parallelism": job.parallelism,
                              "status": job.state if job.state != "RUNNING" or self._tasks_running(job)
                              else "DEPLOYING", "start-time": job.start_ms, "end-time": job.end_ms,
                              "tasks": {k.upper(): v for k, v in counts.items()}}],
                "status-counts": {k.upper(): v for k, v in counts.items()}}

    def _checkpoint_stats(self, job: Job) -> dict[str, Any]:
        n = self._checkpoints(job)
        latest: dict[str, Any] = {"completed": None, "savepoint": None, "failed": None, "restored": None}
        if n:
            ack = job.start_ms + int((self.tasks_after_s + n * self.checkpoint_interval_s) * 1000)
            latest["completed"] = {"@class": "completed", "id": n, "status": "COMPLETED", "is_savepoint": False,
                                   "trigger_timestamp": ack - 50, "latest_ack_timestamp": ack,
                                   "external_path": f"{self.checkpoint_dir}/{job.jid}/chk-{n}", "discarded": False}
        if job.restored_from:
            latest["restored"] = {"id": 0, "restore_timestamp": job.start_ms, "is_savepoint": True,
                                  "external_path": job.restored_from}
        return {"counts": {"restored": 1 if job.restored_from else 0, "total": n, "in_progress": 0,
                           "completed": n, "failed": 0}, "latest": latest, "history": []}

    # ---- HTTP ----
    def handle(self, method: str, target: str, body: bytes) -> tuple[int, dict[str, Any]]:
        url = urlsplit(target)
        path, query = url.path.rstrip("/") or "/", parse_qs(url.query)
        with self.lock:
            self.requests.append((method, target))
            if method == "GET" and path == "/config":
                return 200, {"flink-version": "2.3.0", "features": {"web-submit": False}}
            if method == "GET" and path == "/overview":
                running = sum(1 for j in self.jobs.values() if j.state == "RUNNING")
                return 200, {"taskmanagers": 1, "slots-total": self.parallelism,
                             "slots-available": 0 if running else self.parallelism, "jobs-running": running,
                             "jobs-finished": len(self.jobs) - running, "jobs-cancelled": 0, "jobs-failed": 0,
                             "flink-version": "2.3.0", "flink-commit": "0000000"}
            if method == "GET" and path == "/jobs/overview":
                return 200, {"jobs": [self._overview_entry(j) for j in self.jobs.values()]}
            if self.session and method == "GET" and path == "/jars":
                return 200, {"address": "", "files": [{"id": i, "name": n, "uploaded": 0, "entry": []}
                                                      for i, n in self.jar_files.items()]}
            if self.session and method == "POST" and path == "/jars/upload":
                found = re.search(rb'filename="([^"]+)"', body)
                if found is None:
                    return 400, {"errors": ["Exactly 1 file must be sent, received 0."]}
                jar_id = f"{uuid.uuid4()}_{found[1].decode()}"
                self.jar_files[jar_id] = found[1].decode()
                return 200, {"filename": f"/tmp/flink-web-upload/{jar_id}", "status": "success"}
            if self.session and method == "DELETE" and (gone := re.fullmatch(r"/jars/([^/]+)", path)):
                return (200, {}) if self.jar_files.pop(gone[1], None) is not None else (404, {"errors": ["no jar"]})
            if self.session and method == "POST" and (jar := re.fullmatch(r"/jars/([^/]+)/(run|plan)", path)):
                if jar[1] != "job.jar" and jar[1] not in self.jar_files:
                    return 400, {"errors": [f"Jar file {jar[1]} does not exist"]}
                return self._jar(jar[2], body)
            m = re.fullmatch(r"/jobs/([0-9a-f]{32})(/.*)?", path)
            if not m:
                return 404, {"errors": ["Not found: " + path]}
            jid, rest = m[1], m[2] or ""
            job = self.jobs.get(jid)
            if rest in ("/stop", "/savepoints") and method == "POST":
                try:
                    payload = json.loads(body or b"{}")
                except ValueError:
                    return 400, {"errors": ["Request body is not valid JSON"]}
                return self._trigger(jid, job, stop=rest == "/stop", trigger_id=payload.get("triggerId"))
            if sp := re.fullmatch(r"/savepoints/([0-9a-f]+)", rest):
                return self._savepoint_status(jid, job, sp[1])
            if job is None:
                return 404, {"errors": [f"org.apache.flink.runtime.rest.NotFoundException: Job {jid} not found\n"
                                        "\tat org.apache.flink.runtime.rest.handler.job.AbstractExecutionGraph"
                                        "Handler.lambda$handleRequest$1(AbstractExecutionGraphHandler.java:99)"]}
            if method == "GET" and rest == "":
                return 200, self._details(job)
            if method == "PATCH" and rest == "":
                if query.get("mode", ["cancel"])[0] != "cancel":
                    return 400, {"errors": ["Bad request: mode"]}
                if job.state in TERMINAL:
                    return 409, {"errors": [f"Job {jid} is already in a globally terminal state {job.state}"]}
                job.state, job.end_ms = "CANCELED", self._now_ms()
                return 202, {}
            if method == "GET" and rest == "/checkpoints":
                return 200, self._checkpoint_stats(job)
            if method == "GET" and rest == "/exceptions":
                return 200, {"exceptionHistory": {"entries": [], "truncated": False}}
            return 404, {"errors": ["Not found: " + path]}

    def _jar(self, action: str, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            return 400, {"errors": ["Request body is not valid JSON"]}
        if action == "plan":
            return 200, {"plan": {"jid": uuid.uuid4().hex, "name": self.name, "type": "STREAMING", "nodes": []}}
        if self.run_failure:
            return 500, {"errors": [self.run_failure]}
        jid = str(payload.get("jobId") or uuid.uuid4().hex)
        if jid in self.jobs:
            return 500, {"errors": ["org.apache.flink.runtime.client.DuplicateJobSubmissionException: "
                                    f"Job has already been submitted. JobID: {jid}"]}
        restore = payload.get("savepointPath")
        now = self.clock.now()
        self.jobs[jid] = Job(jid=jid, name=self.name, parallelism=int(payload.get("parallelism") or self.parallelism),
                             started_at=self.clock.monotonic(), start_ms=int(now.timestamp() * 1000),
                             restored_from=restore)
        self.starts.append((jid, restore))
        return 200, {"jobid": jid}

    def _trigger(self, jid: str, job: Job | None, *, stop: bool, trigger_id: str | None) -> tuple[int, dict[str, Any]]:
        rid = trigger_id or uuid.uuid4().hex
        if (jid, rid) in self.operations:  # a resent request with the caller's trigger id: the same operation
            return 202, {"request-id": rid}
        op: dict[str, Any] = {"polls": 0, "stop": stop}
        if job is None:  # accepted; the operation fails
            op["failure"] = ("org.apache.flink.runtime.messages.FlinkJobNotFoundException: "
                             f"Could not find Flink job ({jid})")
        self.operations[(jid, rid)] = op
        return 202, {"request-id": rid}

    def _savepoint_status(self, jid: str, job: Job | None, rid: str) -> tuple[int, dict[str, Any]]:
        op = self.operations.get((jid, rid))
        if op is None:
            return 404, {"errors": [f"There is no savepoint operation with triggerId={rid} for job {jid}."]}
        op["polls"] += 1
        if op["polls"] == 1:
            return 200, {"status": {"id": "IN_PROGRESS"}, "operation": None}
        failure = op.get("failure") or self.savepoint_failure
        if failure:
            return 200, {"status": {"id": "COMPLETED"}, "operation": {"failure-cause": {
                "class": failure.split(":", 1)[0], "stack-trace": failure, "serialized-throwable": "rO0ABQ=="}}}
        if "location" not in op:
            op["location"] = f"{self.savepoint_dir}/savepoint-{jid[:6]}-{rid[:12]}"
            self.savepoints_taken.append(op["location"])
        location = op["location"]
        if op["stop"] and job is not None and job.state == "RUNNING":
            job.state, job.end_ms = "FINISHED", self._now_ms()
        return 200, {"status": {"id": "COMPLETED"}, "operation": {"location": location}}

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve on 127.0.0.1; yields the base URL."""
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                code, body = backend.handle(self.command, self.path, self.rfile.read(length) if length else b"")
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self._answer()

            def do_PATCH(self) -> None:
                self._answer()

            def do_DELETE(self) -> None:
                self._answer()

            def log_message(self, *args: Any) -> None:
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        t = threading.Thread(target=srv.serve_forever, args=(0.05,), name="flink-backend", daemon=True)
        t.start()
        try:
            yield f"http://127.0.0.1:{srv.server_address[1]}"
        finally:
            srv.shutdown()
            srv.server_close()
