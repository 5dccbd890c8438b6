"""``FidelityRun``: the one object behind the pytest plugin, in the style of pytest-benchmark's
``BenchmarkSession``: it holds the plan (:mod:`harness.plugin.plan`, checked by :mod:`harness.plugin.startup`,
collected by :mod:`harness.plugin.collect`), the lazily built session, the adaptive monitor and the
controller's reporter, and implements the plugin's hooks (:mod:`harness.plugin.pytest_plugin` forwards to it).

Without a fidelity configuration there is no ``FidelityRun``: the plugin adds options and markers only.
Workers report, the controller writes: each case's payload travels home on its ``TestReport``; only the
controller writes the shard reports, the ladder and the report cases' files (docs/running.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import pluggy
import pytest

from harness.capture.cache_sign import load_key
from harness.errors import FidelityError
from harness.gate.adaptive import AdaptiveMonitor, AdaptiveRecord, threshold_for
from harness.gate.baselines import headline_of
from harness.gate.gate import Gate, no_baselines_yet
from harness.io.kept import kept_by
from harness.plugin import kind_adaptive, tracker
from harness.plugin.builtin import NO_BASELINE_SKIP
from harness.plugin.collect import PLAN_KEY, ConfigCases, collect_config
from harness.plugin.junit import headline_numbers, record_not_measured, record_on_case, record_on_suite
from harness.plugin.keywords import add_tag_keywords
from harness.plugin.kinds import Payload
from harness.plugin.ladder import LadderCollector
from harness.plugin.plan import PARAMETRIZED, FidelityPlan, config_path, shown_path
from harness.plugin.registry import write_extras
from harness.plugin.startup import check_options, check_report_dir, executor_for, finish_interrupted
from harness.plugin.step_summary import CASE_MARKERS, ENV, append, failing_case, render
from harness.reports.aggregate import format_ladder, ladder_notes
from harness.reports.report_dir import (
    earlier_shard_reports,
    remove_previous_summaries,
    summary_folders_present,
    write_stamp,
)
from harness.reports.shard import ShardReportJSON
from harness.run.cluster.ray_executor import RayExecutor, scored_shard
from harness.run.floor_cache import floor_for_run
from harness.run.kept_results import results_store
from harness.run.precision_floor import write_precision_floor
from harness.run.reuse import ReuseLog
from harness.run.score_cache import scores_cache_line
from harness.run.shared_scores import Handover, remove_session_files, shared_dir
from harness.scoring.threads import ThreadChoice, apply_threads, apply_worker_threads, choose_threads

if TYPE_CHECKING:
    from harness.run.session import FidelitySession, ScoredShard

#: Attributes of a ``TestReport`` that carry a case's payloads home (JSON strings; xdist serializes them).
PAYLOAD_ATTR = "fidelity_payload"
EXTRA_ATTR = "fidelity_extra"
#: Test report attribute: the process's :class:`~harness.run.reuse.ReuseLog` as JSON (what its caches served).
REUSE_ATTR = "fidelity_reuse"

_T = TypeVar("_T")

#: The run of this pytest process, when a fidelity configuration is in use.
RUN_KEY = pytest.StashKey["FidelityRun"]()
#: Item stash: the shard report of a candidate x shard case.
_PAYLOAD = pytest.StashKey[ShardReportJSON]()
#: Item stash: report-case payloads (``{"kind": ..., "data": ...}``) of a case.
_EXTRA = pytest.StashKey[list[dict[str, object]]]()


def _reason_of(report: pytest.TestReport) -> str:
    """One line saying why a case failed or was skipped (the last ``E`` line of a failure, a skip's reason)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ").strip()
    lines = [ln[1:].strip() for ln in str(report.longreprtext).splitlines() if ln.startswith("E ")]
    text = lines[-1] if lines else (str(report.longreprtext).strip().splitlines() or ["(no message)"])[-1]
    return text[:300]


#: A candidate x shard case's node id: ``...::test_fidelity[<candidate>-shard<NN>]``, perhaps ``@<group>`` after it
#: (pytest-xdist's ``--dist loadgroup`` on a pytest before 9.2; ``harness.plugin.pytest_plugin.pytest_collection_finish``).
_CASE_ID = re.compile(r"::test_fidelity\[([A-Za-z0-9][A-Za-z0-9_.+]*)-shard\d+\](?:@[^\[\]]*)?$")


@dataclass(eq=False)  # a plugin object: hashed by identity
class FidelityRun:
    """One pytest run of a fidelity configuration (see the module docstring)."""

    pytest_config: pytest.Config
    plan: FidelityPlan
    planned: dict[str, list[int]] = field(default_factory=dict)
    is_worker: bool = False
    worker_index: int | None = None
    _session: FidelitySession | None = None
    _monitor: AdaptiveMonitor | None = None
    _collector: LadderCollector | None = None
    extras: dict[str, list[object]] = field(default_factory=dict)
    extra_lines: list[str] = field(default_factory=list)
    #: Candidates with a failed case that carried no report (see :meth:`missing_from_ladder`).
    unscored: set[str] = field(default_factory=set)
    #: Why a candidate's shard case produced no report: ``"failed: <message>"`` or ``"skipped: <reason>"``
    #: (the first of its cases); the ladder lists every configured candidate without a report with it.
    not_scored: dict[str, str] = field(default_factory=dict)
    #: The report folder's files this run wrote (``--fidelity-mlflow`` logs the ladder and plots among them).
    summary_files: list[Path] = field(default_factory=list)
    #: ``(node id, message)`` of every failed fidelity case (the CI job summary lists them).
    failures: list[tuple[str, str]] = field(default_factory=list)
    #: Controller under pytest-xdist: the secret (hex) that signs this session's hand-over files, and whether
    #: this session created their folder (only then is the folder removed at the end).
    handover_key: str | None = None
    handover_created: bool = False
    #: An error that ended the session's writing (named once on the terminal; the exit status is non-zero).
    finish_error: str | None = None
    #: ``--fidelity-executor ray...``: the cases' Ray tasks (:mod:`harness.run.cluster.ray_executor`); None: serial.
    executor: RayExecutor | None = None
    #: The torch thread count this process chose at session start, and why (the session header says it).
    threads: ThreadChoice | None = None
    #: What the caches of this process and its workers served instead of computing (said under the ladder).
    reuse: ReuseLog = field(default_factory=ReuseLog)
    #: The results store (:mod:`harness.run.kept_results`) this run opened, closed at unconfigure.
    _kept: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @classmethod
    def configure(cls, config: pytest.Config) -> FidelityRun | None:
        """The run of this process, or None when the project has no fidelity configuration."""
        path, how = config_path(config)
        if path is None:
            return None
        check_options(config, path, how)
        plan = FidelityPlan.load(config, path, how)
        executor = executor_for(config, plan)
        if config.getoption("numprocesses", None) and config.getoption("testrunuid", None) is None:
            # the controller fixes the session id pytest-xdist hands its workers, so it knows which
            # shared-scores folder to remove at the end (harness/run/shared_scores.py)
            import uuid

            config.option.testrunuid = uuid.uuid4().hex
        check_report_dir(Path(config.getoption("fidelity_report_dir")), plan)
        if not hasattr(config, "workerinput"):
            finish_interrupted(Path(config.getoption("fidelity_report_dir")))
        if how == "option" or (how == "ini" and config.args_source != pytest.Config.ArgsSource.ARGS):
            collect_config(config, path)  # an ini key: plain `pytest` runs its cases, `pytest tests/x.py` does not
        config.stash[PLAN_KEY] = plan  # what the configuration file's node collects
        run = cls(config, plan, executor=executor)
        if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
            import secrets

            # the controller draws the key that signs this session's hand-over files; its workers get it in
            # memory (pytest_configure_node), it is never written to disk (harness/run/shared_scores.py)
            run.handover_key = secrets.token_hex(32)
            folder = run.shared_scores_dir()
            run.handover_created = folder is not None and not os.path.lexists(folder)
        return run

    # ------------------------------------------------------------ state
    @property
    def session(self) -> FidelitySession:
        """The run's :class:`~harness.run.session.FidelitySession`, built on first use."""
        if self._session is None:
            from harness.run.session import FidelitySession, resolve_device

            self._session = FidelitySession(
                config=self.plan.config,
                device=resolve_device(self.pytest_config.getoption("fidelity_device"), self.worker_index),
                score_from=self.pytest_config.getoption("fidelity_window"),
                progress=not self.is_worker,
                shared_scores=self.handover() if self.is_worker else None,
            )
        return self._session

    def handover(self) -> Handover | None:
        """A worker's hand-over (folder, session id, key): None outside pytest-xdist, or when the controller
        gave no key (the worker then scores what it needs itself)."""
        folder = self.shared_scores_dir()
        key = getattr(self.pytest_config, "workerinput", {}).get("fidelity_handover_key")
        if folder is None or not isinstance(key, str):
            return None
        return Handover(folder=folder, session=folder.name, key=bytes.fromhex(key))

    def shared_scores_dir(self) -> Path | None:
        """The folder the workers of this pytest-xdist session share scored positions through."""
        uid = getattr(self.pytest_config, "workerinput", {}).get("testrunuid") if self.is_worker else \
            self.pytest_config.getoption("testrunuid", None)
        if not uid:
            return None

        return shared_dir(self.plan.config.cache_dir, str(uid))

    @property
    def monitor(self) -> AdaptiveMonitor | None:
        """The adaptive monitor (``--fidelity-adaptive``), or None."""
        if self._monitor is None and self.pytest_config.getoption("fidelity_adaptive"):
            thresholds = {n: threshold_for(self.plan.config.baselines, n, s) for n, s in self.planned.items()}
            self._monitor = AdaptiveMonitor(planned=self.planned, thresholds=thresholds)
        return self._monitor

    @property
    def collector(self) -> LadderCollector:
        if self._collector is None:
            self._collector = LadderCollector(report_dir=Path(self.pytest_config.getoption("fidelity_report_dir")))
        return self._collector

    @contextlib.contextmanager
    def terminal(self) -> Iterator[None]:
        """Let a capture's progress bar reach the terminal (pytest captures stderr during a test)."""
        capman = self.pytest_config.pluginmanager.getplugin("capturemanager")
        if self.is_worker or capman is None:
            yield
            return
        with capman.global_and_fixture_disabled():
            real = sys.stderr
            sys.stderr = _OwnLine(real)
            try:
                yield
            finally:
                sys.stderr = real

    # ------------------------------------------------------------ hooks
    def pytest_report_header(self) -> list[str]:
        p = self.plan
        nc, ns = len(p.config.candidates), len(p.shards)
        skipped = (f", {len(p.unavailable)} skipped (engine not installed: {', '.join(n for n, _ in p.unavailable)})"
                   if p.unavailable else "")
        source = (f"dataset {p.config.dataset} (layout {p.config.dataset_layout})" if p.config.dataset is not None
                  else f"suite {p.config.suite}")
        line = (f"fidelity: {p.path} ({nc} candidate{'s' * (nc != 1)} x {ns} shard{'s' * (ns != 1)}{skipped}; "
                f"{source}; reports {self.pytest_config.getoption('fidelity_report_dir')}/)")
        return [line, scores_cache_line(self.plan.config)] + ([f"fidelity: {self.threads.line()}"] if self.threads is not None else [])

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        import xdist

        self.is_worker = xdist.is_xdist_worker(session)
        if self.is_worker:  # worker ids are "gw0", "gw1", ...: one device per worker
            self.worker_index = int(xdist.get_xdist_worker_id(session).removeprefix("gw"))

            # -n W: each worker gets free cores // W torch threads (harness/scoring/threads.py)
            apply_worker_threads(int(session.config.workerinput.get("workercount", 1)))  # type: ignore[attr-defined]
        else:  # the single process or the controller: the free cores, or FIDELITY_THREADS
            workers = self.pytest_config.getoption("numprocesses", None)
            self.threads = apply_threads(choose_threads())
            if isinstance(workers, int) and workers > 1:  # what each worker will choose (said in the header)
                self.threads = choose_threads(workers)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self._kept.close()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:  # Any: pytest-xdist's WorkerController (untyped)
        """Controller (pytest-xdist): hand each worker the key that signs this session's hand-over files."""
        if self.handover_key is not None:
            node.workerinput["fidelity_handover_key"] = self.handover_key

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector) -> ConfigCases | None:
        """The configuration file's cases, wherever pytest meets the file."""
        if file_path.resolve() == self.plan.path:
            return ConfigCases.from_parent(parent, path=file_path)
        return None

    def pytest_itemcollected(self, item: pytest.Item) -> None:
        """A candidate's tags become keywords of its cases (``-k TAG``; :mod:`harness.plugin.keywords`)."""
        add_tag_keywords(item, self.plan.full)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        for fixture, params in PARAMETRIZED.items():
            if fixture in metafunc.fixturenames:
                metafunc.parametrize(fixture, params(self.plan), indirect=fixture == "fidelity_case")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Every process declares its cases, so a live model captures all of its shards at once."""
        for item in session.items:
            case = getattr(item, "callspec", None) and item.callspec.params.get("fidelity_case")  # type: ignore[attr-defined]
            if case:
                self.planned.setdefault(case[0], []).append(case[1])
        if self.planned:
            self.session.plan([(n, s) for n, shards in self.planned.items() for s in shards])
        cfg = self.plan.config
        ours = any(set(PARAMETRIZED) & set(getattr(getattr(item, "callspec", None), "params", {})) for item in session.items)
        if cfg.score_cache and ours:  # deterministic results (window, paired, figures) kept by their inputs' content
            self._kept.enter_context(kept_by(results_store(cfg.cache_dir, load_key(cfg.cache_dir), self.reuse)))
        if self.executor is not None and self.planned:  # every case's task starts now; each case waits on its own
            self.executor.start()
            self.executor.submit([(n, s) for n, shards in self.planned.items() for s in shards])

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
        outcome = yield
        report = outcome.get_result()
        if call.when == "call" and _PAYLOAD in item.stash:
            setattr(report, PAYLOAD_ATTR, json.dumps(item.stash[_PAYLOAD], sort_keys=True))
            setattr(report, REUSE_ATTR, json.dumps(self.session.reuse.to_json(), sort_keys=True))
        if call.when == "call" and _EXTRA in item.stash:
            setattr(report, EXTRA_ATTR, json.dumps(item.stash[_EXTRA], sort_keys=True))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Controller: write each shard report as it arrives; keep report-case payloads for the end;
        remember candidates whose case failed before it had a report (the ladder names them)."""
        if self.is_worker:
            return
        case = _CASE_ID.search(report.nodeid)
        if case and report.failed and getattr(report, PAYLOAD_ATTR, None) is None:
            self.unscored.add(case.group(1))
            self.not_scored.setdefault(case.group(1), "failed: " + _reason_of(report))
        elif case and report.skipped and getattr(report, PAYLOAD_ATTR, None) is None:  # scored: in the ladder
            self.not_scored.setdefault(case.group(1), "skipped: " + _reason_of(report))

        failed = failing_case(report, CASE_MARKERS)
        if failed is not None:
            self.failures.append(failed)
        if report.when != "call":
            return
        reuse = getattr(report, REUSE_ATTR, None)
        if reuse is not None:  # each worker's whole log so far; merging is idempotent
            self.reuse.merge(json.loads(reuse))
        payload = getattr(report, PAYLOAD_ATTR, None)
        if payload is not None:
            doc = json.loads(payload)
            try:
                self.collector.add(doc, passed=report.passed,
                                   no_baseline=(report.failed and "no baseline for candidate" in str(report.longreprtext))
                                   or (report.skipped and NO_BASELINE_SKIP in str(report.longrepr)))
            except (FidelityError, OSError) as e:  # a report folder that cannot be written: named at the end
                self.finish_error = self.finish_error or str(e)
            record_on_suite(self.pytest_config, report.nodeid, headline_numbers(headline_of(doc["metrics"])))
        for extra in json.loads(getattr(report, EXTRA_ATTR, None) or "[]"):
            self.extras.setdefault(extra["kind"], []).append(extra["data"])

    @pytest.hookimpl(tryfirst=True)  # before junitxml writes its file (the candidates without a report go in it)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Controller: remove the workers' hand-over files, then write the run summaries and the stamp. A
        failure here (a tampered ledger, a folder that cannot be written) is one named error on the terminal
        and a non-zero exit status, never an internal error."""
        if self.is_worker:
            return

        if self.executor is not None:
            self.executor.shutdown()
        record_not_measured(self.pytest_config, self.missing_from_ladder())
        shared = self.shared_scores_dir()
        if shared is not None and self.handover_key is not None:
            # the workers' hand-over files live exactly as long as the session; only this session's go
            remove_session_files(shared, bytes.fromhex(self.handover_key), remove_folder=self.handover_created)
        if (self.collector.reports or self.extras) and self.finish_error is None:
            try:
                self._write_summaries()
            except (FidelityError, OSError) as e:
                self.finish_error = str(e)
        uri = self.pytest_config.getoption("fidelity_mlflow", None)
        if uri and self.collector.reports and self.finish_error is None:
            self.log_to_mlflow(str(uri))
        if self.finish_error is not None and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def log_to_mlflow(self, uri: str) -> None:
        """``--fidelity-mlflow``: one MLflow run with this run's numbers, ladder and plots
        (:mod:`harness.plugin.tracker`); a tracking failure is named at the end, never an internal error."""
        tags = {"fidelity.config": str(self.plan.path), "fidelity.suite_token_sha256": self.plan.suite_sha256,
                "fidelity.command": " ".join(["pytest", *self.pytest_config.invocation_params.args])}
        try:
            rid = tracker.log_run(uri, run_name=self.plan.path.name, tags=tags, reports=self.collector.reports,
                          rows=self.collector.ladder_rows, files=self.summary_files)
        except Exception as e:  # mlflow raises its own exception types (connection, store, permission)
            self.finish_error = f"--fidelity-mlflow {uri}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            return
        self.extra_lines.append(f"mlflow: run {rid} (experiment fidelity) at {uri}")

    def _write_summaries(self) -> None:
        report_dir = self.collector.report_dir
        # every run summary in the folder is this run's; shard reports accumulate (report_dir.py). A tampered
        # ledger raises here, before anything is deleted or written.
        kept = remove_previous_summaries(report_dir)
        before = summary_folders_present(report_dir)
        written = list(self.collector.written)
        failed = True
        try:
            if self.collector.reports:
                written += self._floor(report_dir)
                self.collector.finish(update_baselines=self.pytest_config.getoption("fidelity_update_baselines"),
                                      config=self.plan.full, not_scored=self.not_scored)
                written += [report_dir / "ladder.md", report_dir / "ladder.json"]
            if self.extras:
                # the tail plot colours candidates as a published set of this configuration does
                self.extra_lines += write_extras(report_dir, self.extras, written=written,
                                                 palette_names=[c.name for c in self.plan.full.candidates])
            failed = False
        finally:  # the stamp and ledger name what this run wrote, even when a summary failed
            if failed:  # no partial set of summaries: those this run wrote before the failure go again
                for p in written[len(self.collector.written):]:
                    if p.is_file() and not p.is_symlink():
                        p.unlink()
                written = list(self.collector.written)
            command = " ".join(["pytest", *self.pytest_config.invocation_params.args])
            created = summary_folders_present(report_dir) - before
            stamp = write_stamp(report_dir, self.plan.suite_sha256, self.plan.path, written, command, created)
            self.summary_files = list(written)
        earlier = earlier_shard_reports(stamp)
        if earlier:
            self.extra_lines.append(f"kept from earlier runs: {len(earlier)} shard report(s), e.g. {earlier[0]} "
                                    f"(fidelity-run.json names the run of each file)")
        for rel in (k for k in kept if report_dir / k not in written):
            self.extra_lines.append(f"kept, edited since an earlier run wrote it (not this run's): {report_dir / rel}")

    def _floor(self, report_dir: Path) -> list[Path]:
        """The reference's precision floor over this run's shards and window, from the cache or measured now
        (:mod:`harness.run.floor_cache`), written as ``precision_floor.json`` / ``.md`` for the ladder; nothing
        with ``--fidelity-no-floor``."""
        if self.pytest_config.getoption("fidelity_no_floor"):
            self.extra_lines.append("precision floor: not measured (--fidelity-no-floor)")
            return []
        shards = ",".join(str(s) for s in sorted({s for _c, s in self.collector.verdicts}))
        try:
            floor, line = floor_for_run(self.plan.full, shards=shards or None,
                                        score_from=self.pytest_config.getoption("fidelity_window"),
                                        key=self.session.signing_key())
        except FidelityError as e:  # the ladder stands without it; the reason is named
            floor, line = None, f"precision floor: not measured ({e})"
        self.extra_lines.append(line)
        return write_precision_floor(floor, report_dir) if floor is not None else []

    def missing_from_ladder(self) -> list[dict[str, str]]:
        """Candidates of this run whose cases produced no report, each with its ``status`` (``failed``: its
        load, capture or scoring failed; ``skipped``: e.g. its engine is not installed) and ``reason`` (the first
        of its cases'): the same list as ``ladder.json``'s ``not_measured``, in every summary of the run."""
        scored = {str(p.get("candidate")) for p in self.collector.reports}
        out = []
        for name in sorted(set(self.not_scored) - scored):
            status, _, reason = self.not_scored[name].partition(":")
            out.append({"candidate": name, "status": status, "reason": reason.strip()})
        return out

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        missing = self.missing_from_ladder()
        if self.collector.reports or missing:
            terminalreporter.section("fidelity ladder")
            for line in self.collector.summary_lines() if self.collector.reports else []:
                terminalreporter.write_line(line)
            for m in missing:  # never a silently shorter ladder
                terminalreporter.write_line(f"not in the ladder: {m['candidate']}: {m['status']}: {m['reason']}", red=True)
            if self.collector.reports and self.gate().fresh():
                terminalreporter.write_line(no_baselines_yet(self.plan.config.baselines, self.plan.selector), yellow=True)
        if self.executor is not None and self.executor.nodes:
            self.extra_lines.append(f"executor: {self.executor.spec.describe()}; results from "
                                    f"{len(self.executor.nodes)} node(s): {', '.join(sorted(self.executor.nodes))}")
        lines = self.extra_lines + self.reuse.lines()
        if lines:
            terminalreporter.section("fidelity reports")
            for line in lines:
                terminalreporter.write_line(line)
        if self.finish_error:
            terminalreporter.section("fidelity: the session's reports were not written", red=True)
            terminalreporter.write_line(f"error: {self.finish_error}", red=True)
        self.write_step_summary()

    def write_step_summary(self) -> None:
        """On GitHub Actions (``$GITHUB_STEP_SUMMARY`` set): the ladder and the failing cases on the job page
        (:mod:`harness.plugin.step_summary`)."""
        target = os.environ.get(ENV)
        if not target or self.is_worker:
            return

        ladder = ([*format_ladder(self.collector.ladder_rows), "", *ladder_notes(self.collector.floor)]
                  if self.collector.ladder_rows else [])
        notes = [*self.extra_lines, *([f"error: {self.finish_error}"] if self.finish_error else [])]
        append(target, render(shown_path(self.plan.path, self.pytest_config), ladder, self.missing_from_ladder(),
                              self.failures, notes))

    # ------------------------------------------------------------ fixture bodies
    def gate(self) -> Gate:
        """The baseline gate of this run's cases (the ``fidelity_gate`` fixture)."""
        return Gate(baselines=self.plan.config.baselines, update=self.pytest_config.getoption("fidelity_update_baselines"),
                    config_path=self.plan.path, selector=self.plan.selector)

    def send(self, request: pytest.FixtureRequest, kind: str, data: Payload) -> None:
        """Queue a report-case payload to travel home with this test's report."""
        request.node.stash.setdefault(_EXTRA, []).append({"kind": kind, "data": data})

    def score(self, request: pytest.FixtureRequest, name: str, shard: int) -> ScoredShard:
        """Score one candidate x shard (capturing it first when needed); its report travels home."""
        monitor = self.monitor
        reason = monitor.stop_reason(name) if monitor is not None else None
        if reason:
            if self.executor is not None:
                self.executor.cancel(name, shard)
            pytest.skip(reason)
        with self.terminal():
            scored = _or_fail(f"{name} shard {shard:02d}", lambda: self._score(name, shard))
        if monitor is not None:
            d = monitor.observe(name, shard, scored.report.metrics)
            record: AdaptiveRecord = {"candidate": name, "shard": shard, **d.record()}
            self.send(request, kind_adaptive.KIND.name, record)

        record_on_case(self.pytest_config, request.node, headline_numbers(scored.headline))
        request.node.stash[_PAYLOAD] = scored.report.to_json_dict()
        return scored

    def _score(self, name: str, shard: int) -> ScoredShard:
        """In this process, or the case's cluster task (whose positions the session then holds)."""
        if self.executor is None:
            return self.session.score(self.session.config.candidate(name), shard)

        return scored_shard(self.executor, self.session, name, shard)

    def compute(self, what: str, fn: Callable[[], _T]) -> _T:
        """``fn()`` with a capture's progress reaching the terminal; a FidelityError fails the case as ``what: ...``."""
        with self.terminal():
            return _or_fail(what, fn)


class _OwnLine:
    """A stream that starts a new line before its first write, so a progress bar does not continue pytest's
    line of dots, and a case that prints nothing leaves the dots alone."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._started = False

    def write(self, text: str) -> int:
        if text and not self._started:
            self._started = True
            self._stream.write("\n")
        return int(self._stream.write(text))

    def __getattr__(self, name: str) -> Any:  # Any: any attribute of the wrapped stream, as it is
        return getattr(self._stream, name)


def _or_fail(what: str, fn: Callable[[], _T]) -> _T:
    """``fn()``; a :class:`~harness.errors.FidelityError` fails the case with one line ``what: message``
    (raised after the handler, so no chained traceback is shown)."""
    try:
        return fn()
    except FidelityError as exc:
        message = f"{what}: {exc}"
    pytest.fail(message, pytrace=False)


def active_run(config: pytest.Config) -> FidelityRun:
    """The run of this process; a clear failure when a fidelity fixture is used without a configuration."""
    if RUN_KEY not in config.stash:
        pytest.fail(f"{Path(config.rootpath) / 'fidelity.toml'}: no fidelity configuration found; "
                    "create fidelity.toml at the rootdir, pass --fidelity-config PATH or point pytest at the file",
                    pytrace=False)
    return config.stash[RUN_KEY]
