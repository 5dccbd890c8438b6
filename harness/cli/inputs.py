"""``fidelity suite|capture|export-head|store|replay``: the commands that make and check inputs."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from harness.capture.loop import capture
from harness.capture.store import CaptureStore
from harness.cli.registry import Builder, SubParsers, device_arg, formatter, nonneg_int, positive_int
from harness.cli.vocabulary import add_license, add_quiet
from harness.engines.base import EngineOptions
from harness.engines.option_specs import validate_options
from harness.engines.registry import get_engine
from harness.errors import UsageError
from harness.inputs import corpus_sources
from harness.inputs.head import export_head, sidecar_path
from harness.inputs.interchange_layout import LAYOUT, looks_like
from harness.inputs.provenance import format_corpus_check, rederive_contexts
from harness.inputs.suite import Suite, build_suite, describe
from harness.metrics.bootstrap import MIN_CLUSTERS
from harness.run.replay.dataset import replay_dataset

# ----------------------------------------------------------------------------- suite


def _suite_build(a: argparse.Namespace) -> int:
    import sys

    corpus, record = a.corpus, None
    if a.from_dataset is not None or a.split_file is not None:
        if a.corpus_out is None:
            raise UsageError("suite build --from-dataset/--split-file: expected --corpus-out DIR (the folder the "
                             "documents are written to, for suite verify --corpus and dataset build), found none")
        if a.from_dataset is not None:
            made = corpus_sources.from_datasets(a.from_dataset, a.corpus_out, text_column=a.text_column, id_column=a.id_column,
                                                split=a.split, name=a.source_name, revision=a.source_revision,
                                                licence=a.license, chat_template=a.chat_template)
        else:
            if a.split_rule is None:
                raise UsageError(f"suite build --split-file: expected --split-rule "
                                 f"({', '.join(corpus_sources.SPLIT_RULES)}), found none")
            made = corpus_sources.from_long_file(a.split_file, a.corpus_out, rule=a.split_rule, name=a.source_name,
                                                 licence=a.license, chat_template=a.chat_template)
        corpus, record = made.folder, made.record
        print(f"{made.folder}: {made.documents} documents from {made.record['name']} ({made.record['kind']})")
    elif a.chat_template is not None:
        raise UsageError("suite build --chat-template: expected --from-dataset or --split-file (a corpus folder's "
                         "files are used as they are), found --corpus")
    s = build_suite(corpus, a.tokenizer, a.n_ctx, a.contexts, a.shards, a.seed, a.out, grouping_file=a.grouping, documents=a.documents,
                    provenance=a.provenance, source=a.source, licence=a.license, corpus_source=record)
    print(describe(s))
    unlicensed = sorted(rel for rel, r in (s.meta.get("documents") or {}).items() if not r["licence"])
    if unlicensed:
        print(f"fidelity: warning: {a.out}: {len(unlicensed)} of {len(s.meta['documents'])} documents have no licence "
              f"(e.g. {unlicensed[0]}); they are recorded as licence null and shown as unknown in a dataset card: "
              "pass --license or a provenance.json", file=sys.stderr)
    per_shard = [len({s.contexts[i].source_cluster for i in s.shard_indices(k)}) for k in range(s.n_shards)]
    total = len({c.source_cluster for c in s.contexts})
    if min(per_shard + [total]) < MIN_CLUSTERS:
        print(f"fidelity: warning: {a.out}: {total} source clusters in the suite, {min(per_shard)} in the smallest shard; "
              f"intervals need at least {MIN_CLUSTERS} and are reported as not estimable below that", file=sys.stderr)
    return 0


def _suite_verify(a: argparse.Namespace) -> int:
    s = Suite.load(a.suite, verify=True)
    print(f"{s.root}: OK ({s.n_contexts} contexts x {s.n_ctx} tokens, {s.n_shards} shards, suite_token_sha256 {s.suite_token_sha256})")
    if a.corpus is not None:
        if a.tokenizer is None:
            raise UsageError("suite verify --corpus needs --tokenizer (the suite's tokenizer.json) to re-derive the contexts")
        for line in format_corpus_check(s, a.corpus, rederive_contexts(s, a.corpus, a.tokenizer)):
            print(line)
    return 0


def _suite_show(a: argparse.Namespace) -> int:
    print(describe(Suite.load(a.suite, verify=True)))
    return 0


def add_suite(sub: SubParsers) -> None:
    p = sub.add_parser("suite", help="build, verify or show a suite of fixed token contexts", formatter_class=formatter)
    ss = p.add_subparsers(dest="suite_cmd", required=True, metavar="{build,verify,show}")
    b = ss.add_parser(
        "build",
        help="cut a suite from a corpus folder",
        formatter_class=formatter,
        description=(
            "Cut n_contexts non-overlapping windows of n_ctx tokens from the text documents under a\n"
            "corpus folder (the first sub-folder is the stratum), spread across documents and strata\n"
            "with a seeded RNG, and write suite.json + tokens.npy.\n\n"
            "example:\n"
            "  fidelity suite build --corpus corpus/ --tokenizer model/tokenizer.json \\\n"
            "      --n-ctx 512 --contexts 128 --shards 8 --seed 0 --out suites/s512 \\\n"
            "      --documents corpus/heldout.txt"
        ),
    )
    src = b.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", type=Path, help="folder of text documents")
    src.add_argument("--from-dataset", type=Path, default=None, dest="from_dataset",
                     help="a Hugging Face datasets source, read offline: a save_to_disk folder, or .parquet, .jsonl/.json "
                          "or .arrow files (a file or a folder); one row is one document (needs --corpus-out)")
    src.add_argument("--split-file", type=Path, default=None, dest="split_file",
                     help="one long text file cut into documents by --split-rule (needs --corpus-out)")
    b.add_argument("--tokenizer", required=True, type=Path, help="tokenizer.json of the reference model")
    b.add_argument("--n-ctx", required=True, type=positive_int, dest="n_ctx", help="tokens per context (>= 2)")
    b.add_argument("--contexts", required=True, type=positive_int, help="number of contexts")
    b.add_argument("--shards", required=True, type=positive_int, help="number of shards (<= contexts)")
    b.add_argument("--seed", required=True, type=nonneg_int, help="selection seed")
    b.add_argument("--out", required=True, type=Path, help="suite folder to write")
    b.add_argument("--documents", type=Path, help="file listing the relative document paths to use (e.g. a held-out list)")
    b.add_argument("--grouping", type=Path, help='JSON {"relative/doc/path": "cluster-name"} grouping documents into source clusters')
    b.add_argument("--provenance", type=Path, default=None,
                   help="provenance sidecar (schema fidelity.corpus-provenance/1: source and license per document; "
                        "default: <corpus>/provenance.json when present)")
    b.add_argument("--source", default=None, help="source of documents the sidecar does not attribute (e.g. a URL)")
    add_license(b, "SPDX license of documents the sidecar does not attribute (e.g. CC-BY-4.0); "
                   "with --from-dataset/--split-file: of every document", old=("--licence",))
    b.add_argument("--corpus-out", type=Path, default=None, dest="corpus_out",
                   help="with --from-dataset/--split-file: new folder the documents are written to (+ provenance.json)")
    b.add_argument("--text-column", default="text", dest="text_column", help="--from-dataset: the text column (default: text)")
    b.add_argument("--id-column", default=None, dest="id_column", help="--from-dataset: a document-id column (default: row numbers)")
    b.add_argument("--split", default=None, help="--from-dataset: the split of a DatasetDict folder")
    b.add_argument("--source-name", default=None, dest="source_name", help="the source's name as recorded (default: its file name)")
    b.add_argument("--source-revision", default=None, dest="source_revision",
                   help="--from-dataset: the source's revision as recorded (e.g. the Hub commit it was downloaded at)")
    b.add_argument("--split-rule", default=None, dest="split_rule",
                   help="--split-file: blank-lines, lines, or regex:PATTERN (a document starts at every match)")
    b.add_argument("--chat-template", type=Path, default=None, dest="chat_template",
                   help="with --from-dataset/--split-file: a tokenizer folder whose chat template formats every document "
                        "(a text as one user message; a column of {role, content} messages as is)")
    b.set_defaults(func=_suite_build)
    v = ss.add_parser("verify", help="re-hash a suite; exit 1 on any mismatch", formatter_class=formatter,
                      description=(
                          "Re-hash the manifest, the tokens and every shard. With --corpus, also check every\n"
                          "recorded document's sha256 (exit 1 on a different text) and re-derive every context\n"
                          "from its document with the suite's tokenizer, listing the contexts that match the\n"
                          "authoritative token ids and those that do not (a tokenizer that does not round-trip\n"
                          "is reported, not refused: the stored ids stay authoritative).\n\n"
                          "examples:\n  fidelity suite verify suites/s512\n"
                          "  fidelity suite verify fixtures/suite --corpus fixtures/corpus --tokenizer fixtures/model/tokenizer.json"))
    v.add_argument("suite", type=Path, help="suite folder")
    v.add_argument("--corpus", type=Path, default=None, help="folder holding the suite's documents (re-derive the contexts)")
    v.add_argument("--tokenizer", type=Path, default=None, help="the suite's tokenizer.json (with --corpus)")
    v.set_defaults(func=_suite_verify)
    s = ss.add_parser("show", help="geometry, strata, clusters and shards of a suite", formatter_class=formatter,
                      description="example:\n  fidelity suite show suites/s512")
    s.add_argument("suite", type=Path, help="suite folder")
    s.set_defaults(func=_suite_show)


# ----------------------------------------------------------------------------- capture


def _capture(a: argparse.Namespace) -> int:
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)

    suite = Suite.load(a.suite)
    shards = suite.parse_shards(a.shards)

    raw: dict[str, object] = {}
    for item in a.option or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--option: expected KEY=VALUE, found {item!r}")
        try:  # a TOML value (number, true/false, "string", {table}); a bare word is a string
            raw[key.strip()] = tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError:
            raw[key.strip()] = value
    engine_options = validate_options(a.engine, getattr(get_engine(a.engine), "options", {}), raw)
    opts = EngineOptions(device=a.device, dtype=a.dtype, threads=a.threads, trust_remote_code=a.trust_remote_code,
                         engine_options=engine_options)
    store = capture(a.engine, a.model, suite, a.out, shards=shards, kind=a.kind, options=opts, progress=not a.quiet)
    print(f"{store.root}: {len(store.indices)}/{suite.n_contexts} contexts captured ({store.kind}, width {store.width})")
    return 0


def add_capture(sub: SubParsers) -> None:
    p = sub.add_parser(
        "capture",
        help="run a model (any registered engine: transformers, llamacpp, vllm) over a suite and store its hidden states (or logits)",
        formatter_class=formatter,
        description=(
            "Capture the post-final-norm hidden states (the LM head's input, bf16) of every context\n"
            "of the chosen shards into a capture store. Re-running resumes: verified contexts are\n"
            "skipped. Several processes may capture different shards into one store at once.\n\n"
            "examples:\n"
            "  fidelity capture --model models/qwen3-bf16 --suite suites/s512 --out stores/ref\n"
            "  fidelity capture --model models/q4 --suite suites/s512 --out stores/q4 --shards 0,2-3 --device cuda:1"
        ),
    )
    p.add_argument("--model", required=True, type=Path, help="model folder (config.json + *.safetensors), or a .gguf file with --engine llamacpp")
    p.add_argument("--suite", required=True, type=Path, help="suite folder")
    p.add_argument("--out", required=True, type=Path, help="capture store folder (created or resumed)")
    p.add_argument("--engine", default="transformers",
                   help="an engine of harness/engines/ (each module defining ENGINE): transformers (default; kinds "
                        "hidden_states, logits), llamacpp (a GGUF via llama-cpp-python; default kind logits) or vllm "
                        "(a model folder through vLLM's pooling runner; hidden_states); an unknown "
                        "name is refused with the registered names")
    p.add_argument("--shards", default=None, help="shards to capture, e.g. 0,2-3 (default: all)")
    p.add_argument("--device", default="cpu", type=device_arg, help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"], help="compute dtype (default bfloat16)")
    p.add_argument("--kind", default=None, choices=["hidden_states", "logits"], help="what to store (default: the engine's first kind, see --engine)")
    p.add_argument("--trust-remote-code", action="store_true", dest="trust_remote_code", help="allow the model's own Python code")
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    p.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="an engine option, as [candidates.options] in fidelity.toml takes it (repeatable; VALUE is a "
                        "TOML value: 4, true, 0.85, 'auto', {0 = '70GiB'}). transformers: device_map, max_memory, "
                        "attn_implementation, batch_size; llamacpp: n_gpu_layers, flash_attn, n_batch, n_ubatch, "
                        "threads; vllm: tensor_parallel_size, gpu_memory_utilization, max_num_batched_tokens, "
                        "enforce_eager, kv_cache_dtype, batch_size")
    add_quiet(p)
    p.set_defaults(func=_capture)


# ----------------------------------------------------------------------------- head


def _export_head(a: argparse.Namespace) -> int:
    h = export_head(a.model, a.out)
    print(f"{h.path}: weight [{h.vocab_size}, {h.hidden_size}] bfloat16 sha256 {h.sha256} (sidecar {sidecar_path(h.path).name})")
    return 0


def add_export_head(sub: SubParsers) -> None:
    p = sub.add_parser(
        "export-head",
        help="export the shared BF16 LM head of a model",
        formatter_class=formatter,
        description="Write lm_head.safetensors (tensor 'weight' [vocab, hidden] bf16) and lm_head.json.\n\n"
        "example:\n  fidelity export-head --model models/qwen3-bf16 --out heads/lm_head.safetensors",
    )
    p.add_argument("--model", required=True, type=Path, help="model folder")
    p.add_argument("--out", required=True, type=Path, help="output .safetensors path")
    p.set_defaults(func=_export_head)


# ----------------------------------------------------------------------------- store


def _store_verify(a: argparse.Namespace) -> int:
    suite = Suite.load(a.suite)
    store = CaptureStore.open(a.store, suite)
    n = store.verify_all()
    missing = suite.n_contexts - n
    print(f"{store.root}: OK ({n} contexts verified, {missing} not captured, kind {store.kind}, model {store.identity.get('name')})")
    return 0


def add_store(sub: SubParsers) -> None:
    p = sub.add_parser("store", help="inspect capture stores", formatter_class=formatter)
    ss = p.add_subparsers(dest="store_cmd", required=True, metavar="{verify}")
    v = ss.add_parser("verify", help="verify every file of a capture store; exit 1 on any problem", formatter_class=formatter,
                      description="example:\n  fidelity store verify stores/ref --suite suites/s512")
    v.add_argument("store", type=Path, help="capture store folder")
    v.add_argument("--suite", required=True, type=Path, help="suite folder the store was captured for")
    v.set_defaults(func=_store_verify)


# ----------------------------------------------------------------------------- replay


def _replay(a: argparse.Namespace) -> int:
    from harness.run.replay.stores import replay

    if a.dataset is not None and (a.dataset / "dataset.json").is_file() is False:
        if looks_like(a.dataset):  # the published layout, read in place (its head may live elsewhere: --head)
            from harness.run.replay.interchange import replay_published

            if a.suite or a.reference:
                raise UsageError(f"replay --dataset ({LAYOUT}) takes the suite and the reference from the dataset: drop --suite/--reference")
            paths = replay_published(a.dataset, a.candidate, a.out, head=a.head, shards=a.shards, score_from=a.window,
                                     name=a.name, n_boot=a.n_boot, device=a.device, method=a.method)
            for p in paths:
                print(f"{p}: written (+ {p.with_suffix('.md').name})")
            return 0
    if a.dataset is not None:  # a downloaded reference dataset supplies suite, reference and head

        if a.method != "exact":
            raise UsageError("replay --method published: only with --suite/--reference/--head or a dataset in the published layout")

        if a.suite or a.reference or a.head:
            raise UsageError("replay --dataset takes the suite, reference and head from the dataset: drop --suite/--reference/--head")
        paths = replay_dataset(a.dataset, a.candidate, a.out, shards=a.shards, score_from=a.window, name=a.name,
                               n_boot=a.n_boot, device=a.device)
        for p in paths:
            print(f"{p}: written (+ {p.with_suffix('.md').name})")
        return 0
    if a.suite is None or a.reference is None or a.head is None:
        raise UsageError("replay needs --suite, --reference and --head (or --dataset DATASET)")
    paths = replay(a.suite, a.reference, a.candidate, a.head, a.out, cand_head_path=a.candidate_head, shards=a.shards,
                   score_from=a.window, n_boot=a.n_boot, device=a.device, candidate_name=a.name, reference_name=a.reference_name,
                   reference_model=a.reference_model, method=a.method)
    for p in paths:
        print(f"{p}: written (+ {p.with_suffix('.md').name})")
    return 0


def add_replay(sub: SubParsers) -> None:
    p = sub.add_parser(
        "replay",
        help="score stored captures, shard by shard, like one pytest case (verifies everything first)",
        formatter_class=formatter,
        description=(
            "Verify the suite, both stores (every file), the head(s) and the shard list, then score\n"
            "each selected shard and write its report. With one shard and --out X.json: X.json + X.md;\n"
            "otherwise --out is a folder of shard-NN.json + shard-NN.md. Any refusal exits non-zero\n"
            "and writes nothing.\n\n"
            "example:\n"
            "  fidelity replay --suite suites/s512 --reference stores/ref --candidate stores/q4 \\\n"
            "      --head heads/lm_head.safetensors --shards 0 --out reports/q4-shard00.json"
        ),
    )
    p.add_argument("--dataset", type=Path, default=None,
                   help="a reference dataset (fidelity dataset build, or the published fidelity-suite layout with "
                        "suite/suite-manifest.json, read in place): verified whole, then supplies suite, reference and head "
                        "(published layout: --head names the pinned head when the dataset lacks lm-head/); "
                        "--candidate may then also be a model folder, captured on the dataset's reference shards, "
                        "or a published capture folder (capture-manifest.json)")
    p.add_argument("--suite", type=Path, default=None, help="suite folder")
    p.add_argument("--reference", type=Path, default=None, help="reference capture store")
    p.add_argument("--candidate", required=True, type=Path, help="candidate capture store (with --dataset: or a model folder)")
    p.add_argument("--head", type=Path, default=None, help="shared lm_head.safetensors")
    p.add_argument("--candidate-head", type=Path, default=None, dest="candidate_head", help="the candidate's own head (head attribution)")
    p.add_argument("--reference-model", type=Path, default=None, dest="reference_model",
                   help="the reference model folder: its identity must be the one the reference store recorded")
    p.add_argument("--shards", default=None, help="shards to score, e.g. 0,2-3 (default: all)")
    p.add_argument("--window", type=nonneg_int, default=0, help="score_from: drop the first N rows of every context")
    p.add_argument("--n-boot", type=positive_int, default=10_000, dest="n_boot", help="bootstrap replicates (default 10000)")
    p.add_argument("--device", default="cpu", type=device_arg, help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--name", default=None, help="candidate name in the report (default: the store folder's name)")
    p.add_argument("--reference-name", default="reference", dest="reference_name", help="reference name (default 'reference')")
    p.add_argument("--method", choices=("exact", "published"), default="exact",
                   help="exact (default): this project's measurement. published: the published fidelity tool's method "
                        "(bf16-rounded logits, percentile bootstrap over context means), to check a published figure; "
                        "writes qwen38-fidelity-report/2 files (report-<name>-shard-NNNN.json + .md) with the exact "
                        "figures and the difference beside it, never a shard report of this project")
    p.add_argument("--out", required=True, type=Path, help="report .json (one shard) or folder")
    p.set_defaults(func=_replay)


#: Parser builders, in help order.
COMMANDS: tuple[Builder, ...] = (add_suite, add_capture, add_export_head, add_store, add_replay)
