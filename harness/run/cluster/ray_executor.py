"""The ladder on a Ray cluster: every candidate x shard is one Ray task; the driver writes every report.

The driver (the pytest process, or ``fidelity ladder``) submits all planned cases at once; each case
then waits on its own task. A task (:func:`harness.run.cluster.task.run_case`) captures the shard
when needed, scores it and *returns* its report and positions; the driver checks the result's sha256,
parses the report with the same strict reader as any report, checks it is the case it asked for, and
hands it to the caller, which writes the report files exactly as a serial run does. Workers never
touch the report folder.

Faults:

* a worker process or node that dies mid-task (SIGKILL, out of memory, a lost machine): Ray runs the
  task again (``max_retries``); the task is idempotent (capture stores are resumable and written
  atomically under a lock), and its one result is read once, so no report is duplicated or partial;
* a task that fails for a reason of its own (a bad candidate: a missing model, a store that does not
  verify, a resource request the cluster cannot meet) fails that candidate's cases only;
* a driver killed mid-run leaves no partial file (reports are written atomically); run it again and
  the captures already in the shared ``cache_dir`` are verified by content and reused.

Addresses (``--fidelity-executor``): ``ray`` starts a local cluster for the run (this machine's CPUs
and GPUs, object store capped at :data:`LOCAL_OBJECT_STORE_BYTES`); ``ray:auto`` joins the cluster
this machine belongs to (``ray start``); ``ray:HOST:PORT`` joins the cluster whose head is there;
``ray://HOST:PORT`` connects through Ray Client.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.capture.cache_sign import load_key
from harness.errors import FidelityError, MissingPackageError, UsageError, pip_extra
from harness.gate.baselines import headline_of
from harness.reports.shard import ShardReport, report_shard
from harness.run.cluster import task as cluster_task
from harness.run.cluster.positions_wire import positions_from_bytes
from harness.run.cluster.resources import task_resources
from harness.run.cluster.task import RESULT_SCHEMA, TaskSpec, result_digest

if TYPE_CHECKING:
    from harness.inputs.config import FidelityConfig
    from harness.run.session import FidelitySession, ScoredShard
    from harness.run.shard import ShardPositions

__all__ = ["INSTALL_HINT", "LOCAL_OBJECT_STORE_BYTES", "CaseResult", "ExecutorSpec", "RayExecutor", "parse_executor",
           "ray_installed", "require_ray"]

#: How to install the optional Ray extra.
INSTALL_HINT = pip_extra("ray") + " (from a checkout: pip install -e '.[ray]')"
#: Object store of a local cluster started for one run: results are a shard's positions (a few MB each).
LOCAL_OBJECT_STORE_BYTES = 512 * 1024 * 1024
#: Ray re-runs a task whose worker died this many times before its cases fail.
MAX_RETRIES = 3

_ADDRESS = re.compile(r"ray(?::(?P<auto>auto)|:(?P<gcs>[A-Za-z0-9.\-]+:\d+)|(?P<client>://[A-Za-z0-9.\-]+:\d+))?")


@dataclass(frozen=True)
class ExecutorSpec:
    """Where the cases run: ``serial`` (this process) or ``ray`` at ``address``."""

    kind: str
    #: None: a local cluster started for the run; else what ``ray.init(address=...)`` is given.
    address: str | None = None

    def describe(self) -> str:
        if self.kind == "serial":
            return "serial"
        return "ray (local cluster for this run)" if self.address is None else f"ray at {self.address}"


def parse_executor(value: str) -> ExecutorSpec:
    """``serial``, ``ray``, ``ray:auto``, ``ray:HOST:PORT`` or ``ray://HOST:PORT``; anything else is a FidelityError."""
    if value == "serial":
        return ExecutorSpec("serial")
    m = _ADDRESS.fullmatch(value)
    if m is None:
        raise UsageError(f"executor: expected serial, ray, ray:auto, ray:HOST:PORT or ray://HOST:PORT, found {value!r}")
    address = m.group("auto") or m.group("gcs") or (f"ray{m.group('client')}" if m.group("client") else None)
    return ExecutorSpec("ray", address)


def executor_argument(value: str) -> str:
    """:func:`parse_executor` as an argparse type, shared by ``fidelity ladder --executor`` and pytest's
    ``--fidelity-executor``: the value itself when it parses, else a usage error with the expected forms."""
    try:
        parse_executor(value)
    except FidelityError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("executor: ")) from None
    return value


def ray_installed() -> bool:
    """True when the ``ray`` package is importable."""
    return importlib.util.find_spec("ray") is not None


def require_ray() -> None:
    """A MissingPackageError with the install command when the Ray extra is missing."""
    if not ray_installed():
        raise MissingPackageError("ray", INSTALL_HINT, needed_for="the ray executor")


@dataclass
class CaseResult:
    """One case's verified result: its report (the JSON dict a serial run would write), its positions,
    and which node and process computed it."""

    report: dict[str, Any]
    positions: ShardPositions
    node: str


def _failure(result: object, where: str) -> str | None:
    """The task's own error, or None; a result of another shape is a FidelityError."""
    if not isinstance(result, dict) or result.get("schema") != RESULT_SCHEMA:
        raise FidelityError(f"{where}: expected a {RESULT_SCHEMA} result, found {type(result).__name__}")
    error = result.get("error")
    return None if error is None else str(error)


def verify_result(result: object, name: str, shard: int) -> CaseResult:
    """Check a task's result (digest, report schema and types, candidate and shard) and decode it."""
    where = f"<ray task {name} shard {shard:02d}>"
    error = _failure(result, where)
    if error is not None:
        raise FidelityError(error)
    assert isinstance(result, dict)  # _failure refused anything else
    text, data, digest = result.get("report"), result.get("positions"), result.get("sha256")
    if not isinstance(text, str) or not isinstance(data, bytes) or not isinstance(digest, str):
        raise FidelityError(f"{where}: expected report text, positions bytes and sha256, found "
                            f"{type(text).__name__}, {type(data).__name__}, {type(digest).__name__}")
    found = result_digest(text, data)
    if found != digest:
        raise FidelityError(f"{where}: result sha256: expected {digest}, found {found}")
    payload = json.loads(text)
    report = ShardReport.from_json_dict(payload, path=where)
    if report.candidate != name or report_shard(report) != shard:
        raise FidelityError(f"{where}: expected the report of {name} shard {shard:02d}, "
                            f"found {report.candidate} shard {report_shard(report):02d}")
    node = str(result.get("node"))
    return CaseResult(report=payload, positions=positions_from_bytes(data, f"{where} on {node}"), node=node)


@dataclass
class RayExecutor:
    """The cases of one run as Ray tasks (see the module docstring)."""

    spec: ExecutorSpec
    config: FidelityConfig
    #: ``--fidelity-device`` (``auto`` resolves on each worker).
    device: str = "auto"
    score_from: int = 0
    _owned: bool = False
    _refs: dict[tuple[str, int], Any] = field(default_factory=dict)
    _refused: dict[tuple[str, int], str] = field(default_factory=dict)
    #: Nodes (host and process) that computed this run's results.
    nodes: set[str] = field(default_factory=set)

    def start(self) -> None:
        """Start the local cluster, or connect to the one named by the address."""
        require_ray()
        import logging

        import ray

        if ray.is_initialized():  # the caller's own connection: used, never shut down here
            return
        if self.spec.address is None:
            ray.init(address="local", object_store_memory=LOCAL_OBJECT_STORE_BYTES, include_dashboard=False,
                     log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(address=self.spec.address, log_to_driver=False, logging_level=logging.WARNING)
        self._owned = True

    def shutdown(self) -> None:
        """Disconnect (and stop the local cluster) when this executor started it."""
        if self._owned:
            import ray

            ray.shutdown()
            self._owned = False

    def task_spec(self) -> TaskSpec:
        path = self.config.path.resolve()
        return TaskSpec(config=str(path), config_sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                        device=self.device, score_from=self.score_from, cache_key=load_key(self.config.cache_dir))

    def _gpu(self, cluster: dict[str, float]) -> bool:
        if self.device == "cpu":
            return False
        return self.device.startswith("cuda") or cluster.get("GPU", 0) > 0

    def submit(self, cases: list[tuple[str, int]]) -> None:
        """Submit one task per case (the reference capture first, when its store is missing)."""
        import ray

        spec = self.task_spec()
        cluster = {k: float(v) for k, v in ray.cluster_resources().items()}
        gpu = self._gpu(cluster)
        ready = None
        ref = self.config.reference
        if not (ref.store / "capture.json").exists() and ref.model is not None:
            res = task_resources("transformers", None, ref.name, gpu=gpu)
            ready = ray.remote(cluster_task.capture_reference).options(**res.as_options(), max_retries=MAX_RETRIES).remote(spec)
        remote = ray.remote(cluster_task.run_case)
        for name, shard in cases:
            cand = self.config.candidate(name)
            try:
                res = task_resources(cand.engine if cand.model is not None else None, cand.options,
                                     name, gpu=gpu)
            except FidelityError as exc:
                self._refused[(name, shard)] = str(exc)
                continue
            lacking = [f"{key} {want:g} (cluster has {cluster.get(key, 0):g})"
                       for key, want in (("CPU", res.num_cpus), ("GPU", res.num_gpus)) if want > cluster.get(key, 0)]
            if lacking:
                self._refused[(name, shard)] = (f"candidate {name}: the cluster cannot run its task: it asks for "
                                                f"{', '.join(lacking)}")
                continue
            self._refs[(name, shard)] = remote.options(**res.as_options(), max_retries=MAX_RETRIES,
                                                       retry_exceptions=False).remote(spec, name, shard, ready)

    def result(self, name: str, shard: int) -> CaseResult:
        """Wait for the case's task; its verified result, or a FidelityError saying why the case has none."""
        import ray
        from ray.exceptions import RayError, RayTaskError

        key = (name, shard)
        if key in self._refused:
            raise FidelityError(self._refused[key])
        if key not in self._refs:
            raise FidelityError(f"{name} shard {shard:02d}: no task was submitted for this case")
        try:
            raw = ray.get(self._refs.pop(key))
        except RayTaskError as exc:  # an exception the task did not expect: raised here as the serial run raises it
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            raise FidelityError(f"the task raised: {lines[-1] if lines else type(exc).__name__}") from None
        except RayError as exc:  # the worker died more often than Ray retries, the task was cancelled, ...
            raise FidelityError(f"the task did not finish: {type(exc).__name__}: {exc}") from None
        out = verify_result(raw, name, shard)
        self.nodes.add(out.node.rsplit(" pid ", 1)[0])
        return out

    def cancel(self, name: str, shard: int) -> None:
        """Cancel a case's task (an adaptive stop made it unnecessary); its result is never read."""
        ref = self._refs.pop((name, shard), None)
        if ref is not None:
            import ray

            ray.cancel(ref)


def scored_shard(executor: RayExecutor, session: FidelitySession, name: str, shard: int) -> ScoredShard:
    """The case's :class:`~harness.run.session.ScoredShard` from its task, its positions handed to
    ``session`` (a :class:`~harness.run.session.FidelitySession`) so the tail, window and paired cases
    read them instead of scoring again."""
    from harness.run.session import ScoredShard, candidate_size_bytes

    out = executor.result(name, shard)
    session.adopt(name, shard, out.positions)
    report = ShardReport.from_json_dict(out.report, path=f"<ray task {name} shard {shard:02d}>")
    return ScoredShard(name, shard, report, headline_of(report.metrics), candidate_size_bytes(session.config.candidate(name)))
