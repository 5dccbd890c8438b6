"""The ladder on a Ray cluster: every candidate x shard is one Ray task; the driver writes every report.

Reasoning: docs/ray.md §"What a task does, and what the driver does" and §"Faults".
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.capture.cache_sign import load_key
from harness.errors import FidelityError, MissingPackageError, UsageError, pip_extra
from harness.gate.baselines import headline_of
from harness.io.hashing import sha256_file
from harness.metrics.summary import context_rows
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
    hostport = m.group("gcs") or (m.group("client") or "").removeprefix("://")
    if hostport:
        problem = host_port_problem(hostport)
        if problem:
            raise UsageError(f"executor: expected ray:HOST:PORT or ray://HOST:PORT with a valid host and a port in "
                             f"1..65535, found {value!r} ({problem})")
    address = m.group("auto") or m.group("gcs") or (f"ray{m.group('client')}" if m.group("client") else None)
    return ExecutorSpec("ray", address)


_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def host_port_problem(hostport: str) -> str | None:
    """Why ``HOST:PORT`` cannot be connected to (an IPv4 octet above 255, a port outside 1..65535, a host
    name that is not RFC 1123 labels), or None."""
    host, _, port = hostport.rpartition(":")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"port {port!r} is not within 1..65535"
    labels = host.split(".")
    if all(part.isascii() and part.isdigit() for part in labels):
        if len(labels) != 4 or any(int(part) > 255 for part in labels):
            return f"host {host!r} is not an IPv4 address (four octets 0..255)"
        return None
    if len(host) > 253 or not all(_LABEL.match(part) for part in labels):
        return f"host {host!r} is not a host name (labels of letters, digits and inner '-')"
    return None


#: Seconds the driver waits for a cluster's head to accept a connection before the run is refused.
CONNECT_TIMEOUT_S = 10.0


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse, naming the address and the timeout, a ``HOST:PORT`` (or ``ray://HOST:PORT``) that does not accept
    a TCP connection within ``timeout_s``: ``ray.init`` would otherwise wait without end."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = f"no answer within {timeout_s:g} s" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise FidelityError(f"executor ray:{address.removeprefix('ray://')}: expected a Ray head accepting connections "
                            f"at {host}:{port}, found {reason}") from None


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
    positions = positions_from_bytes(data, f"{where} on {node}")
    rederive_result(report, positions, f"{where} on {node}")
    return CaseResult(report=payload, positions=positions, node=node)


#: Relative gap within which a sum the driver re-derives equals the task's (summation order across machines).
REDERIVE_TOLERANCE = 1e-9


def rederive_result(report: ShardReport, positions: ShardPositions, where: str) -> None:
    """The report's per-context rows re-derived from the positions it came with, and its totals from those rows
    (its headline follows from its totals: :meth:`ShardReport.from_json_dict`); a mismatch is refused naming the
    row and field, never believed."""
    m = report.metrics
    score_from = int(report.comparability["score_from"])
    got = context_rows(positions.scores, positions.context_index, positions.row, positions.labels, score_from=score_from)
    rows = m["contexts"]
    if [(int(r["index"]), str(r["cluster"])) for r in rows] != [(int(r["index"]), str(r["cluster"])) for r in got]:
        raise FidelityError(f"{where}: report contexts (those of its positions): expected "
                            f"{[int(r['index']) for r in got][:8]}, found {[int(r['index']) for r in rows][:8]}")
    for i, (mine, theirs) in enumerate(zip(got, rows)):
        for key in ("positions", "top1"):
            if int(mine[key]) != int(theirs[key]):
                raise FidelityError(f"{where}: metrics.contexts[{i}].{key} (re-derived from its positions): "
                                    f"expected {mine[key]}, found {theirs[key]}")
        for key in ("sum_kld", "max_kld", "sum_jsd_bits"):
            a, b = float(mine[key]), float(theirs[key])  # type: ignore[literal-required]
            if abs(a - b) > REDERIVE_TOLERANCE * max(abs(a), abs(b), 1e-300):
                raise FidelityError(f"{where}: metrics.contexts[{i}].{key} (re-derived from its positions): expected {a!r}, "
                                    f"found {b!r} (positions of another candidate or shard, or an edited report)")
    t = m["totals"]
    n = sum(int(r["positions"]) for r in rows)
    top1 = sum(int(r["top1"]) for r in rows)
    sum_kld = math.fsum(float(r["sum_kld"]) for r in rows)
    if n != t["n_positions"] or top1 != t["top1_count"]:
        raise FidelityError(f"{where}: metrics.totals n_positions and top1_count (re-derived from its rows): "
                            f"expected {n} and {top1}, found {t['n_positions']} and {t['top1_count']}")
    if abs(sum_kld - float(t["sum_kld"])) > REDERIVE_TOLERANCE * max(abs(sum_kld), 1e-300):
        raise FidelityError(f"{where}: metrics.totals.sum_kld (re-derived from its rows): expected {sum_kld!r}, "
                            f"found {t['sum_kld']!r}")


def check_result_identity(report: ShardReport, session: FidelitySession, name: str, shard: int, score_from: int) -> None:
    """The result's suite, shard, window and candidate identity are those of the task the driver sent."""
    where = f"<ray task {name} shard {shard:02d}>"
    comp = report.comparability
    suite = session.suite
    cand = session.config.candidate(name)
    want: list[tuple[str, Any, Any]] = [
        ("comparability.suite_token_sha256", suite.suite_token_sha256, comp["suite_token_sha256"]),
        ("comparability.shard.sha256", suite.shard(shard).sha256, comp["shard"]["sha256"]),
        ("comparability.score_from", score_from, comp["score_from"]),
        ("comparability.reference.name", session.config.reference.name, comp["reference"]["name"]),
    ]
    if cand.model is not None:  # a live candidate: its identity by content, as the driver computes it
        want.append(("comparability.candidate.identity", session.candidate_identity(cand), comp["candidate"]["identity"]))
    for what, expected, found in want:
        if expected != found:
            raise FidelityError(f"{where}: {what} (of the task it was sent): expected {expected}, found {found}")


@dataclass
class RayExecutor:
    """The cases of one run as Ray tasks (see docs/ray.md §"What a task does, and what the driver does")."""

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
            if self.spec.address != "auto":
                check_reachable(self.spec.address)
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
        return TaskSpec(config=str(path), config_sha256=sha256_file(path),
                        device=self.device, score_from=self.score_from, cache_key=load_key(self.config.cache_dir),
                        score_cache=self.config.score_cache)

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
    report = ShardReport.from_json_dict(out.report, path=f"<ray task {name} shard {shard:02d}>")
    check_result_identity(report, session, name, shard, executor.score_from)
    session.adopt(name, shard, out.positions)
    return ScoredShard(name, shard, report, headline_of(report.metrics), candidate_size_bytes(session.config.candidate(name)))
